"""Operator settings: one object, read once, prefix ``SELECTIVITY_`` (docs/ARCHITECTURE.md,
"Operator settings")."""

from __future__ import annotations

import ipaddress
import re
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# Per-key rate limits by endpoint class (which endpoint is in which class:
# ``service.api.ratelimit.CLASSES``): "<requests>/<seconds>", a token bucket holding <requests>
# that refills at <requests> per <seconds>; generous enough for the benchmarks' single client.
RATE_LIMITS: dict[str, tuple[int, float] | None] = {
    "ingest": (200, 1.0),  # observation batches (each up to MAX_BATCH rows)
    "serve": (2000, 1.0),  # featurize, predict
    "export": (50, 1.0),  # train sets, label exports, cold-store exports, release results
    "queue": (500, 1.0),  # candidates, leases, labels, skips, heartbeats
    "compute": (30, 60.0),  # privacy calculators and ledgers, plan, audit log verification
    "jobs": (30, 60.0),  # k-anonymised releases, iML sessions, re-identification audits
    "manage": (600, 60.0),  # streams, queues, keys, models, rolls, unlock requests
}


def parse_rate_limits(text: str) -> dict[str, tuple[int, float] | None]:
    """``"compute=10/60,serve=off"`` → ``{"compute": (10, 60.0), "serve": None}``; a
    ``ValueError`` naming the entry and the setting otherwise."""
    out: dict[str, tuple[int, float] | None] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        name, _, value = entry.partition("=")
        name, value = name.strip(), value.strip()
        if name not in RATE_LIMITS:
            raise ValueError(
                f"RATE_LIMITS: unknown class {name[:40]!r} (classes: {', '.join(RATE_LIMITS)})"
            )
        if value == "off":
            out[name] = None
            continue
        m = re.fullmatch(r"([0-9]{1,9})/([0-9]{1,7}(?:\.[0-9]{1,6})?)", value)
        if m is None or int(m[1]) < 1 or float(m[2]) <= 0:
            raise ValueError(
                f"RATE_LIMITS: {name}={value[:40]!r} must be <requests>/<seconds> "
                "(requests ≥ 1, seconds > 0) or off"
            )
        out[name] = (int(m[1]), float(m[2]))
    return out


class Settings(BaseSettings):
    # An empty variable means unset (compose passes
    # `SELECTIVITY_ADMIN_KEY: ${SELECTIVITY_ADMIN_KEY:-}` as "" when the operator did not set it).
    model_config = SettingsConfigDict(
        env_prefix="SELECTIVITY_",
        extra="ignore",
        env_ignore_empty=True,
        hide_input_in_errors=True,  # an error never repeats a token or key it refused
    )

    env: Literal["development", "production"] = "development"
    data_dir: Path = Path("./.selectivity")
    redis_url: str | None = None
    # The Redis URL names a node of a Redis Cluster.
    redis_cluster: bool = False
    database_url: str | None = None
    # SQLite only: how long a statement waits for the write lock (SQLite retries meanwhile)
    # before the request answers 503 with Retry-After (service.db.session).
    sqlite_busy_timeout_seconds: float = Field(default=10.0, ge=0.05, le=300.0)
    coldstore_dir: Path | None = None
    # The cold store keeps no window's raw rows longer than this many days after the window
    # closed, whatever its stream says (a stream's cold_retention_windows may keep fewer);
    # unset: each stream's own setting alone (service.coldstore.service.apply_retention).
    cold_retention_days: float | None = Field(default=None, gt=0, le=36_600)
    admin_key: str | None = None
    # Prefix of every Redis key this deployment writes (tests use a unique one per run).
    redis_prefix: str = "sel"

    # Request limits (every endpoint has them; a 413/422 names the limit).
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    # Bodies of every endpoint that takes no batch (service.api.limits.LARGE_BODY_ROUTES).
    max_small_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    # A body over heavy_body_bytes (or chunked) is parsed and validated in a worker thread,
    # heavy_requests at a time (parsing holds the interpreter lock: a second one would only
    # slow the event loop down, not go faster); one that finds no slot within
    # heavy_wait_seconds gets 429.
    heavy_body_bytes: int = Field(default=256 * 1024, ge=1024)
    heavy_requests: int = Field(default=1, ge=1, le=64)
    heavy_wait_seconds: float = Field(default=10.0, ge=0.1, le=300.0)
    # Calculations of the (β, k, ε, δ) calculator at once (service.privacy.service), each in
    # a worker thread; one that finds none free within heavy_wait_seconds gets 429.
    calculator_concurrency: int = Field(default=1, ge=1, le=16)
    max_batch: int = Field(default=10_000, ge=1)
    max_string_length: int = Field(default=256, ge=8)
    max_features: int = Field(default=256, ge=1)
    # Per-key rate limits (service/api/ratelimit.py; docs/USING.md, "Quotas and rate limits"):
    # "<class>=<requests>/<seconds>" or "<class>=off" over RATE_LIMITS above, e.g.
    # "compute=10/60,serve=off"; an empty bucket answers 429 with Retry-After.
    rate_limits: str = Field(default="", max_length=1000)
    # How many streams, and annotation queues, one API key may create (403 past it).
    max_streams_per_key: int = Field(default=100, ge=1, le=1_000_000)
    max_queues_per_key: int = Field(default=100, ge=1, le=1_000_000)
    # /metrics answers only `Authorization: Bearer <this token>` (at least 32 characters, e.g.
    # `openssl rand -hex 32`); unset, it answers 404. Its gauges are refreshed in the
    # background every METRICS_REFRESH_SECONDS, never computed by a scrape.
    metrics_token: SecretStr | None = None
    metrics_refresh_seconds: float = Field(default=15.0, ge=1.0, le=3600.0)

    # Worker cadence: how often the scheduler looks for due rolls.
    scheduler_seconds: float = Field(default=5.0, gt=0)
    # How often the worker counts newly accepted hot entries into their window's tables.
    count_seconds: float = Field(default=1.0, gt=0)
    # The per-stream roll lock expires this long after its holder stops renewing it (a killed
    # roll frees it within this time); the holder renews it every third of it.
    roll_lock_seconds: float = Field(default=30.0, ge=1.0, le=3600.0)
    # How long an Idempotency-Key is honoured, from its first request, whatever the rolls (its
    # records, no row, expire then); with window_seconds·(hot_windows + 1), also the life of a
    # window's per-user counters.
    idempotency_ttl_seconds: int = Field(default=7 * 86400, ge=60)
    # Idempotency-Keys one stream remembers at most (about 400 bytes of Redis each): a new key
    # beyond them is refused (429) until older ones expire.
    idempotency_max_keys: int = Field(default=1_000_000, ge=1)
    # Seconds an API process trusts its cached key lookups.
    key_cache_seconds: float = Field(default=5.0, ge=0)
    # Webhooks: attempts per event and the first retry delay (doubling each time).
    webhook_attempts: int = Field(default=5, ge=1, le=20)
    webhook_backoff_seconds: float = Field(default=1.0, gt=0)
    webhook_timeout_seconds: float = Field(default=5.0, gt=0)
    # Run the worker inside the API process (default: only in embedded mode).
    embedded_worker: bool | None = None
    # The audit log's HMAC-SHA256 key (docs/ARCHITECTURE.md, "Audit log"): hex, at least 32
    # bytes (`openssl rand -hex 32`). Unset: read from AUDIT_KEY_FILE, created (0600) by the
    # first audited action. Keep it where the database's admins can neither read nor write it,
    # and never change it: entries keyed with another key no longer verify.
    audit_key: SecretStr | None = None
    # Where the audit key is kept when AUDIT_KEY is unset (default <data dir>/audit.key).
    audit_key_file: Path | None = None
    # Embedded mode's first start writes the new cold-store key's shares to this file (0600,
    # created, never overwritten) instead of printing them on the console. Refused inside the
    # data dir or the cold store: the service must never be able to read its shares back
    # (docs/PRIVACY.md, promise 3).
    coldstore_shares_file: Path | None = None
    # A share submitted to a pending unlock request is wiped from memory (and its approval
    # withdrawn) this long after its submission, unless the threshold was reached by then.
    unlock_share_ttl_seconds: int = Field(default=900, ge=10, le=86400)
    # An annotation queue whose δ at its ε exceeds this is refused (422) unless created with
    # "accept_delta_above_ceiling": true (docs/ARCHITECTURE.md, "Annotation queues").
    queue_delta_ceiling: float = Field(default=1e-6, gt=0, lt=1)
    # Webhook targets allowed although internal (docs/ARCHITECTURE.md, "Models and forced
    # retraining"): comma-separated CIDRs, addresses and host names, e.g.
    # "10.1.2.0/24,hooks.internal". Other loopback, private, link-local, multicast and reserved
    # addresses are refused (SSRF), at registration and at each delivery.
    webhook_allow: str = Field(default="", max_length=4000)
    # A k-anonymised release (its state, inline input and result table) is deleted from Redis
    # this long after its creation; from a stream's hot period, after at most one window
    # (window_seconds), when the oldest hot rows it is made of may have left the hot period.
    anonymization_ttl_seconds: int = Field(default=86_400, ge=60, le=30 * 86_400)
    # BLAS and OpenMP threads a re-identification audit's, a k-anonymised release's and an iML
    # question's computation may use (service.core.threads). An audit's training steps are small
    # matrix products: on a shared machine more threads only contend with the API and the
    # counting job (docs/ARCHITECTURE.md, "Re-identification audits").
    audit_threads: int = Field(default=1, ge=1, le=256)
    # User jobs (k-anonymised releases, re-identification audits) have their own queue and
    # worker slots, apart from the service's own jobs (docs/ARCHITECTURE.md, "Jobs"): slots a
    # worker gives them, and how many may be queued or running at once, per key and in all
    # (a request beyond either is a 429 with Retry-After).
    user_job_concurrency: int = Field(default=2, ge=1, le=64)
    user_jobs_per_key: int = Field(default=4, ge=1, le=10_000)
    user_job_backlog: int = Field(default=64, ge=1, le=100_000)

    @field_validator("webhook_allow")
    @classmethod
    def _webhook_allow(cls, v: str) -> str:
        for entry in filter(None, (e.strip() for e in v.split(","))):
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}", entry):
                    raise ValueError(
                        f"WEBHOOK_ALLOW: {entry[:80]!r} is neither a CIDR, an address nor a "
                        "host name"
                    ) from None
        return v

    @field_validator("audit_key")
    @classmethod
    def _audit_key(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            raw = v.get_secret_value().strip()
            try:
                n = len(bytes.fromhex(raw))
            except ValueError:
                n = -1
            if n < 32:
                raise ValueError(
                    "SELECTIVITY_AUDIT_KEY must be at least 64 hex digits (32 bytes), "
                    "e.g. from `openssl rand -hex 32`"
                )
            return SecretStr(raw)
        return v

    @field_validator("metrics_token")
    @classmethod
    def _metrics_token(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            raw = v.get_secret_value().strip()
            if len(raw) < 32 or not raw.isascii() or any(c.isspace() for c in raw):
                raise ValueError(
                    "SELECTIVITY_METRICS_TOKEN must be at least 32 ASCII characters without "
                    "spaces, e.g. from `openssl rand -hex 32`"
                )
            return SecretStr(raw)
        return v

    @field_validator("rate_limits")
    @classmethod
    def _rate_limits(cls, v: str) -> str:
        parse_rate_limits(v)
        return v

    @cached_property
    def rate_limit_table(self) -> dict[str, tuple[int, float] | None]:
        """Class → (requests, seconds), or None where the class is not limited."""
        return {**RATE_LIMITS, **parse_rate_limits(self.rate_limits)}

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> Settings:
        if self.env == "production":
            if self.redis_url is None:
                raise ValueError("SELECTIVITY_REDIS_URL must be set in production")
            if self.database_url is None or self.database_url.startswith("sqlite"):
                raise ValueError(
                    "SELECTIVITY_DATABASE_URL must name a server database in production"
                )
        if self.coldstore_shares_file is not None:
            f = self.coldstore_shares_file.resolve()
            for what, d in (
                ("the data dir", self.data_dir),
                ("the cold store", self.resolved_coldstore_dir),
            ):
                if f.is_relative_to(d.resolve()):
                    raise ValueError(
                        f"SELECTIVITY_COLDSTORE_SHARES_FILE ({f}) must be outside {what} "
                        f"({d.resolve()}): whoever reads it could open the whole cold store"
                    )
        return self

    @property
    def embedded_redis(self) -> bool:
        return self.redis_url is None

    @cached_property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'selectivity.db').resolve()}"

    @property
    def resolved_coldstore_dir(self) -> Path:
        return self.coldstore_dir or self.data_dir / "coldstore"

    @property
    def resolved_audit_key_file(self) -> Path:
        return self.audit_key_file or self.data_dir / "audit.key"

    @property
    def audit_anchor_file(self) -> Path:
        """The audit log's head, kept outside the database: on the cold-store volume."""
        return self.resolved_coldstore_dir / "audit-head.json"

    @property
    def run_worker_in_process(self) -> bool:
        if self.embedded_worker is not None:
            return self.embedded_worker
        return self.embedded_redis

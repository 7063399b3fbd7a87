"""Operator settings: one object, read once, prefix ``SELECTIVITY_`` (DESIGN §12.2)."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SELECTIVITY_", extra="ignore")

    env: Literal["development", "production"] = "development"
    data_dir: Path = Path("./.selectivity")
    redis_url: str | None = None
    # The Redis URL names a node of a Redis Cluster.
    redis_cluster: bool = False
    database_url: str | None = None
    coldstore_dir: Path | None = None
    admin_key: str | None = None
    # Prefix of every Redis key this deployment writes (tests use a unique one per run).
    redis_prefix: str = "sel"

    # Request limits (every endpoint has them; a 413/422 names the limit).
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    max_batch: int = Field(default=10_000, ge=1)
    max_string_length: int = Field(default=256, ge=8)
    max_features: int = Field(default=256, ge=1)

    # Worker cadence: how often the scheduler looks for due rolls.
    scheduler_seconds: float = Field(default=5.0, gt=0)
    # How often the worker counts newly accepted hot entries into their window's tables.
    count_seconds: float = Field(default=1.0, gt=0)
    # The per-stream roll lock expires this long after its holder stops renewing it (a killed
    # roll frees it within this time); the holder renews it every third of it.
    roll_lock_seconds: float = Field(default=30.0, ge=1.0, le=3600.0)
    # Idempotency keys live at least this long (and at least as long as the window's hot data).
    idempotency_ttl_seconds: int = Field(default=7 * 86400, ge=60)
    # Seconds an API process trusts its cached key lookups.
    key_cache_seconds: float = Field(default=5.0, ge=0)
    # Webhooks: attempts per event and the first retry delay (doubling each time).
    webhook_attempts: int = Field(default=5, ge=1, le=20)
    webhook_backoff_seconds: float = Field(default=1.0, gt=0)
    webhook_timeout_seconds: float = Field(default=5.0, gt=0)
    # Run the worker inside the API process (default: only in embedded mode).
    embedded_worker: bool | None = None

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> Settings:
        if self.env == "production":
            if self.redis_url is None:
                raise ValueError("SELECTIVITY_REDIS_URL must be set in production")
            if self.database_url is None or self.database_url.startswith("sqlite"):
                raise ValueError(
                    "SELECTIVITY_DATABASE_URL must name a server database in production"
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
    def run_worker_in_process(self) -> bool:
        if self.embedded_worker is not None:
            return self.embedded_worker
        return self.embedded_redis

"""SQL schema: what changes slowly and must be queried (docs/ARCHITECTURE.md, "Storage")."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC timestamps on every database (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_result_value(self, value: datetime | None, dialect: object) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, datetime: UTCDateTime()}


class ApiKey(Base):
    """An API key: only its SHA-256 is stored; the key itself is shown once. ``actor`` is who
    holds it (a person or a system, named at creation; the key's id when none was given):
    break glass counts approvals per actor and refuses the requester's actor as an approver
    (docs/ARCHITECTURE.md, "Cold store and break-glass unlock")."""

    __tablename__ = "api_key"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    actor: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(20))
    key_hash: Mapped[bytes] = mapped_column(LargeBinary(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


class Stream(Base):
    """A registered kind of observation. ``epoch`` is the open window; ``roll_target`` is set
    while a roll to that epoch is under way (the crash-safety checkpoint). ``state`` is
    ``creating`` while its first windows are prepared in Redis (outside any SQL transaction),
    then ``ready``; only ready streams are seen by lookups (``service.streams.repository``)."""

    __tablename__ = "stream"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    state: Mapped[str] = mapped_column(String(16), default="ready", server_default="ready")
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    hash_seed: Mapped[bytes] = mapped_column(LargeBinary(32))
    epoch: Mapped[int] = mapped_column(Integer, default=1)
    epoch_started_at: Mapped[datetime] = mapped_column(default=utcnow)
    roll_target: Mapped[int | None] = mapped_column(Integer, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Window(Base):
    """One window of one stream and the checkpoints of its life cycle.

    state: ``open`` → ``hot`` (closed, still in the hot period) → ``counted`` (in the count period)
    → ``expired`` (past retention; its tables are deleted). Independently of the state, the raw
    data has its own checkpoints: ``cold_sealed_at`` (every entry sealed in the cold store and
    verified; set by the seal job), ``hot_deleted_at`` (raw data deleted from the hot store,
    which ``expire`` does only once ``cold_sealed_at`` is set) and ``cold_deleted_at`` (its
    segments deleted from the cold store by the retention:
    ``service.coldstore.service.apply_retention``).
    """

    __tablename__ = "stream_window"
    __table_args__ = (UniqueConstraint("stream_id", "epoch"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    stream_id: Mapped[int] = mapped_column(ForeignKey("stream.id", ondelete="CASCADE"), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), default="open")
    opened_at: Mapped[datetime] = mapped_column(default=utcnow)
    closed_at: Mapped[datetime | None] = mapped_column(default=None)
    counted_at: Mapped[datetime | None] = mapped_column(default=None)
    expired_at: Mapped[datetime | None] = mapped_column(default=None)
    cold_sealed_at: Mapped[datetime | None] = mapped_column(default=None)
    hot_deleted_at: Mapped[datetime | None] = mapped_column(default=None)
    cold_deleted_at: Mapped[datetime | None] = mapped_column(default=None)
    # the seal job's checkpoint: the last hot-stream entry id written to a verified segment
    seal_cursor: Mapped[str | None] = mapped_column(String(40), default=None)


class FollowUp(Base):
    """Work a roll leaves to the worker (a transactional outbox): one row per (stream, epoch,
    kind), written in the roll's own commit, done by the keyed job of that name
    (``workers.jobs``), and re-enqueued by the scheduler tick until ``done_at`` is set, so a
    crash at any line loses none of it. Kinds: ``service.lifecycle.followups.KINDS``."""

    __tablename__ = "follow_up"
    __table_args__ = (UniqueConstraint("stream_id", "epoch", "kind"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    stream_id: Mapped[int] = mapped_column(ForeignKey("stream.id", ondelete="CASCADE"), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(40))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    done_at: Mapped[datetime | None] = mapped_column(default=None, index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    result: Mapped[dict[str, Any] | None] = mapped_column(default=None)


class CountTable(Base):
    """A count table of a stream: one per feature at creation, later one per selected group."""

    __tablename__ = "count_table"
    __table_args__ = (UniqueConstraint("stream_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    stream_id: Mapped[int] = mapped_column(ForeignKey("stream.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(600))
    features: Mapped[list[str]] = mapped_column(JSON)
    first_epoch: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(String(20), default="feature")
    score: Mapped[float | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # for selected groups: the roll that picked it, its rank in that round, the round's budget
    # and the table it extends (the exact gain is not private and is not stored)
    selected_epoch: Mapped[int | None] = mapped_column(Integer, default=None)
    selection_rank: Mapped[int | None] = mapped_column(Integer, default=None)
    selection_epsilon: Mapped[float | None] = mapped_column(default=None)
    extends: Mapped[str | None] = mapped_column(String(600), default=None)


class Model(Base):
    """A registered model of a stream. ``trained_epoch`` is the newest epoch it reported (or
    fetched the train set at); ``stale_since`` is when a roll left it behind
    (docs/ARCHITECTURE.md, "Models and forced retraining")."""

    __tablename__ = "model"
    __table_args__ = (UniqueConstraint("stream_id", "name"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    stream_id: Mapped[int] = mapped_column(ForeignKey("stream.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    webhook_url: Mapped[str | None] = mapped_column(String(2000), default=None)
    webhook_secret: Mapped[str | None] = mapped_column(String(200), default=None)
    trained_epoch: Mapped[int | None] = mapped_column(Integer, default=None)
    trained_at: Mapped[datetime | None] = mapped_column(default=None)
    stale_since: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class StreamEvent(Base):
    """Events of a stream (roll, retrain_required, ...); the id is the SSE event id."""

    __tablename__ = "stream_event"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    stream_id: Mapped[int] = mapped_column(ForeignKey("stream.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(40))
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookDelivery(Base):
    """One attempt to deliver an event to a model's webhook."""

    __tablename__ = "webhook_delivery"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[str] = mapped_column(ForeignKey("model.id", ondelete="CASCADE"), index=True)
    event_id: Mapped[int] = mapped_column(ForeignKey("stream_event.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer, default=None)
    error: Mapped[str | None] = mapped_column(String(200), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ReferenceModel(Base):
    """The stream's reference LightGBM model of one epoch (trained by the worker) and its
    quality on a temporal holdout of its train set. The model holds raw values and every
    number here is an exact function of hot rows: the row lives during its epoch only
    (deleted by ``lifecycle.expire`` at the next roll)."""

    __tablename__ = "reference_model"
    __table_args__ = (UniqueConstraint("stream_id", "epoch"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    stream_id: Mapped[int] = mapped_column(ForeignKey("stream.id", ondelete="CASCADE"), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    model: Mapped[str | None] = mapped_column(Text, default=None)  # LightGBM model string
    columns: Mapped[list[str]] = mapped_column(JSON)
    train_rows: Mapped[int] = mapped_column(Integer)
    train_label_rates: Mapped[list[float]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    eval_rows: Mapped[int | None] = mapped_column(Integer, default=None)
    log_loss: Mapped[float | None] = mapped_column(default=None)
    auc: Mapped[float | None] = mapped_column(default=None)
    prior_log_loss: Mapped[float | None] = mapped_column(default=None)
    evaluated_at: Mapped[datetime | None] = mapped_column(default=None)


class ColdStoreKey(Base):
    """A cold-store key pair: only the X25519 public key and a verification tag of the private
    key are stored; the private key exists only as SLIP-39 shares held by admins
    (docs/ARCHITECTURE.md, "Cold store and break-glass unlock").
    The newest active key seals new segments; retired keys still open the segments sealed to
    them."""

    __tablename__ = "coldstore_key"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    public_key: Mapped[bytes] = mapped_column(LargeBinary(32))
    verification_tag: Mapped[bytes] = mapped_column(LargeBinary(32))
    shares: Mapped[int] = mapped_column(Integer)
    threshold: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    retired_at: Mapped[datetime | None] = mapped_column(default=None)


class ColdSegment(Base):
    """One sealed segment file: a window's hot-stream entries ``first_id``..``last_id``.

    ``count``, ``first_id`` and ``last_id`` are exact per-window statistics: they are kept while
    the window is hot (sealing and its verification need them) and set to NULL, with
    ``first_ts``/``last_ts`` coarsened to the window's open/close times, when it leaves the hot
    period (``service.lifecycle.expire``); an unlock export counts rows by decrypting."""

    __tablename__ = "cold_segment"
    __table_args__ = (UniqueConstraint("stream_id", "epoch", "part", "first_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    stream_id: Mapped[int] = mapped_column(ForeignKey("stream.id", ondelete="CASCADE"), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    # the window's part (``StreamCreate.partitions``): each part's entry ids are its own
    part: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    first_id: Mapped[str | None] = mapped_column(String(40))
    last_id: Mapped[str | None] = mapped_column(String(40))
    count: Mapped[int | None] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(String(500))
    size: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[bytes] = mapped_column(LargeBinary(32))
    key_id: Mapped[int] = mapped_column(ForeignKey("coldstore_key.id"))
    first_ts: Mapped[datetime] = mapped_column()
    last_ts: Mapped[datetime] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class UnlockRequest(Base):
    """An analyst's break-glass request for a stream's raw data, its approvals and its grant.
    Shares are never stored: approvals record who approved; the shares themselves wait in the
    API process's memory until the threshold is reached
    (docs/ARCHITECTURE.md, "Cold store and break-glass unlock")."""

    __tablename__ = "unlock_request"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    stream_id: Mapped[int] = mapped_column(ForeignKey("stream.id", ondelete="CASCADE"), index=True)
    requested_by: Mapped[str] = mapped_column(String(32))
    justification: Mapped[str] = mapped_column(Text)
    from_epoch: Mapped[int | None] = mapped_column(Integer, default=None)
    to_epoch: Mapped[int | None] = mapped_column(Integer, default=None)
    from_ts: Mapped[datetime | None] = mapped_column(default=None)
    to_ts: Mapped[datetime | None] = mapped_column(default=None)
    key_id: Mapped[int] = mapped_column(ForeignKey("coldstore_key.id"))
    ttl_seconds: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    granted_at: Mapped[datetime | None] = mapped_column(default=None)
    expires_at: Mapped[datetime | None] = mapped_column(default=None)
    closed_at: Mapped[datetime | None] = mapped_column(default=None)


class UnlockApproval(Base):
    __tablename__ = "unlock_approval"
    __table_args__ = (UniqueConstraint("request_id", "admin_key_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(
        ForeignKey("unlock_request.id", ondelete="CASCADE"), index=True
    )
    admin_key_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class AuditEntry(Base):
    """The keyed hash chain of the audit log (``service.audit.service``): ``hash`` is
    ``HMAC-SHA256(audit key, prev_hash || canonical JSON of the entry)`` for ``key_version``
    1, plain ``SHA-256(prev_hash || …)`` for entries written before the key (0); ``seq`` is
    assigned by the service under a lock, dense from 1."""

    __tablename__ = "audit_log"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    ts: Mapped[datetime] = mapped_column(default=utcnow)
    actor: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(200))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON)
    prev_hash: Mapped[bytes] = mapped_column(LargeBinary(32))
    hash: Mapped[bytes] = mapped_column(LargeBinary(32))
    key_version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class AnnotationQueue(Base):
    """An annotation queue (docs/ARCHITECTURE.md, "Annotation queues"): β, k, labels, payload
    kind and the rest in ``config``.
    ``secret`` keys the HMAC that names candidates in the open release period's counts, so
    Redis never holds a raw candidate below k. (It is beside the queue here: an attacker with
    SQL as well as Redis could test guessed candidates against the open period's counts, but a
    copy of Redis alone, or of its persistence files, reveals only keyed digests.)"""

    __tablename__ = "annotation_queue"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    stream_id: Mapped[int | None] = mapped_column(
        ForeignKey("stream.id", ondelete="CASCADE"), index=True, default=None
    )
    secret: Mapped[bytes] = mapped_column(LargeBinary(32))
    created_by: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class AnnotationTask(Base):
    """A released example: k-anonymous after β-sampling, so its canonical payload may be
    stored and shown to annotators. ``key_hash`` (the candidate's keyed digest) is unique per
    queue: one release per distinct key. The label, once given, is final."""

    __tablename__ = "annotation_task"
    __table_args__ = (UniqueConstraint("queue_id", "key_hash"),)

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    queue_id: Mapped[int] = mapped_column(
        ForeignKey("annotation_queue.id", ondelete="CASCADE"), index=True
    )
    key_hash: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    uncertainty: Mapped[float] = mapped_column()
    released_at: Mapped[datetime] = mapped_column(default=utcnow)
    label: Mapped[str | None] = mapped_column(String(64), default=None)
    labelled_by: Mapped[str | None] = mapped_column(String(32), default=None)
    labelled_at: Mapped[datetime | None] = mapped_column(default=None)
    observation_window: Mapped[int | None] = mapped_column(Integer, default=None)

"""API keys: ``sk_<id>_<secret>``; stored as SHA-256 (the secret has 256 bits of entropy, so a
fast hash is enough), looked up by id, compared in constant time (docs/ARCHITECTURE.md,
"HTTP API")."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.admin import repository
from service.admin.schemas import KeyCreated
from service.config import Settings
from service.context import AppContext
from service.db.models import ApiKey
from service.errors import Unauthorized, ValidationError

log = logging.getLogger("selectivity.admin")


@dataclass(frozen=True)
class Principal:
    key_id: str
    role: str
    actor: str = ""  # who holds the key (``ApiKey.actor``); "" where none was read: its id


def _hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _split(key: str) -> tuple[str, str] | None:
    parts = key.split("_", 2)
    if len(parts) != 3 or parts[0] != "sk" or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


async def create(
    *,
    session: AsyncSession,
    role: str,
    name: str = "",
    actor: str | None = None,
    key: str | None = None,
) -> KeyCreated:
    """A new key (or, for the bootstrap admin, a given one in the ``sk_<id>_<secret>`` form),
    held by ``actor`` (default: an actor of its own, named by the key's id)."""
    if key is None:
        key = f"sk_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"
    parsed = _split(key)
    if parsed is None or len(parsed[1]) < 32 or len(key) > 200:
        raise ValidationError("key must look like sk_<id>_<secret> with a secret of 32+ chars")
    if actor is not None and not 1 <= len(actor) <= 200:
        raise ValidationError(f"actor: 1 to 200 characters, got {len(actor)}")
    row = await repository.create(
        session,
        ApiKey(id=parsed[0], name=name, actor=actor or parsed[0], role=role, key_hash=_hash(key)),
    )
    return KeyCreated.model_validate(
        {
            "id": row.id,
            "role": row.role,
            "name": row.name,
            "actor": row.actor,
            "key": key,
            "created_at": row.created_at,
        }
    )


async def authenticate(*, ctx: AppContext, authorization: str | None) -> Principal:
    if not authorization or not authorization.startswith("Bearer "):
        raise Unauthorized("missing 'Authorization: Bearer <api key>' header")
    key = authorization.removeprefix("Bearer ").strip()
    parsed = _split(key) if len(key) <= 200 else None
    if parsed is None:
        raise Unauthorized("malformed API key")
    digest = _hash(key)
    cache = ctx.caches.keys
    hit = cache.get(digest)
    now = time.monotonic()
    if hit is not None and now - hit[0] < ctx.settings.key_cache_seconds:
        return hit[1]
    async with ctx.sessionmaker() as session:
        row = await repository.get(session, parsed[0])
    if row is None or row.revoked_at is not None or not hmac.compare_digest(row.key_hash, digest):
        cache.pop(digest, None)
        raise Unauthorized("invalid or revoked API key")
    principal = Principal(row.id, row.role, row.actor)
    cache[digest] = (now, principal)
    return principal


RECOVERY = (
    "mint a new admin key with `selectivity admin create-key --role admin` (it talks to the "
    "database directly, no API key needed)"
)


async def bootstrap_admin(*, sessionmaker: async_sessionmaker, settings: Settings) -> str | None:
    """When no admin key exists: use SELECTIVITY_ADMIN_KEY, or generate one into
    ``<data dir>/admin.key`` (mode 0600). Returns the path written, if any.

    The key file is written first (atomically: a 0600 temp file in the same directory, then
    ``os.replace``) and the admin row committed after it, so a failed write leaves no row
    (nobody would hold the key) and a failed commit removes the file. When an admin exists
    but the bootstrap key file does not (and no SELECTIVITY_ADMIN_KEY), it warns how to
    recover."""
    path = settings.data_dir / "admin.key"
    written = False
    try:
        async with sessionmaker() as session, session.begin():
            if await repository.any_admin(session):
                if not settings.admin_key and not path.exists():
                    boot = await session.scalar(
                        select(ApiKey.id).where(ApiKey.name == "bootstrap").limit(1)
                    )
                    if boot is not None:
                        log.warning(
                            "the bootstrap admin key exists but %s does not (deleted, or its "
                            "write failed in an older version): if nobody holds an admin key, %s",
                            path,
                            RECOVERY,
                        )
                return None
            given = settings.admin_key
            created = await create(session=session, role="admin", name="bootstrap", key=given)
            if given:
                return None
            write_key_file(path, created.key)
            written = True
    except BaseException:
        if written:
            path.unlink(missing_ok=True)
        raise
    return str(path)


def write_key_file(path: Path, key: str) -> None:
    """``path`` holds ``key`` (mode 0600 whatever the umask), or is left as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

"""API keys: ``sk_<id>_<secret>``; stored as SHA-256 (the secret has 256 bits of entropy, so a
fast hash is enough), looked up by id, compared in constant time (docs/ARCHITECTURE.md,
"HTTP API")."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.admin import repository
from service.admin.schemas import KeyCreated
from service.config import Settings
from service.context import AppContext
from service.db.models import ApiKey
from service.errors import Unauthorized, ValidationError


@dataclass(frozen=True)
class Principal:
    key_id: str
    role: str


def _hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _split(key: str) -> tuple[str, str] | None:
    parts = key.split("_", 2)
    if len(parts) != 3 or parts[0] != "sk" or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


async def create(
    *, session: AsyncSession, role: str, name: str = "", key: str | None = None
) -> KeyCreated:
    """A new key (or, for the bootstrap admin, a given one in the ``sk_<id>_<secret>`` form)."""
    if key is None:
        key = f"sk_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"
    parsed = _split(key)
    if parsed is None or len(parsed[1]) < 32 or len(key) > 200:
        raise ValidationError("key must look like sk_<id>_<secret> with a secret of 32+ chars")
    row = await repository.create(
        session, ApiKey(id=parsed[0], name=name, role=role, key_hash=_hash(key))
    )
    return KeyCreated.model_validate(
        {"id": row.id, "role": row.role, "name": row.name, "key": key, "created_at": row.created_at}
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
    principal = Principal(row.id, row.role)
    cache[digest] = (now, principal)
    return principal


async def bootstrap_admin(*, sessionmaker: async_sessionmaker, settings: Settings) -> str | None:
    """When no admin key exists: use SELECTIVITY_ADMIN_KEY, or generate one into
    ``<data dir>/admin.key`` (mode 0600). Returns the path written, if any."""
    async with sessionmaker() as session, session.begin():
        if await repository.any_admin(session):
            return None
        given = settings.admin_key
        created = await create(session=session, role="admin", name="bootstrap", key=given)
    if given:
        return None
    path = settings.data_dir / "admin.key"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w") as f:
        f.write(created.key + "\n")
    return str(path)

"""What the audit log keeps outside the database (docs/ARCHITECTURE.md, "Audit log"): its HMAC
key and its anchor.

**Key.** 32 bytes from the OS CSPRNG (``secrets``), hex in ``SELECTIVITY_AUDIT_KEY`` or in the
key file (default ``<data dir>/audit.key``), which the first audited action creates, mode 0600
whatever the umask, by ``link(2)`` of a complete temporary file: it never overwrites a key, and
of two processes creating it at once both end up with the one that was linked first. The key
is never stored in the database, logged or rotated (a new key would need a new
``key_version``). ``key_id`` (a truncated SHA-256 of it under a fixed prefix) names it in the
anchor and the log without revealing it.

**Anchor.** ``<cold store>/audit-head.json``: the head the service last wrote (seq and hash),
the first keyed entry (``keyed_from``: entries before it are the plain SHA-256 chain written
before the key existed) and the key id. Replaced atomically after each entry (temporary file,
fsync, rename, fsync of the directory); appenders on one host are serialised by ``flock`` on
``audit-head.json.lock`` beside it. The database cannot move it: whoever cuts entries from the
end of the log, or rewrites keyed entries as plain ones, is found against it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import secrets
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from service.config import Settings

log = logging.getLogger("selectivity.audit")

KEY_BYTES = 32
_keys: dict[str, bytes] = {}  # key file path -> key: read once per process


class AuditSetupError(Exception):
    """The key or the anchor cannot be read or written (the message names the file)."""


def key_id(key: bytes) -> str:
    return hashlib.sha256(b"selectivity audit key id\x00" + key).hexdigest()[:16]


def load_key(settings: Settings, *, create: bool) -> bytes | None:
    """The audit key: ``SELECTIVITY_AUDIT_KEY``, else the key file, created if ``create``
    (``None`` when it does not exist and ``create`` is false)."""
    if settings.audit_key is not None:
        return bytes.fromhex(settings.audit_key.get_secret_value())
    path = settings.resolved_audit_key_file.resolve()
    cached = _keys.get(str(path))
    if cached is not None:
        return cached
    try:
        key = _read_key(path)
    except FileNotFoundError:
        if not create:
            return None
        key = _create_key(path)
    _keys[str(path)] = key
    return key


def _read_key(path: Path) -> bytes:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise AuditSetupError(f"cannot read the audit key file {path}: {exc.strerror}") from None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < KEY_BYTES:
        raise AuditSetupError(
            f"the audit key file {path} must hold at least {2 * KEY_BYTES} hex digits"
        )
    return key


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(d: Path, prefix: str, data: bytes) -> str:
    """A complete, fsynced temporary file in ``d`` (mode 0600: ``mkstemp``)."""
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=prefix, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


def _create_key(path: Path) -> bytes:
    key = secrets.token_bytes(KEY_BYTES)
    try:
        tmp = _write_temp(path.parent, f".{path.name}.", key.hex().encode() + b"\n")
        try:
            os.link(tmp, path)
        except FileExistsError:  # another process created it first: use that one
            return _read_key(path)
        finally:
            os.unlink(tmp)
        _fsync_dir(path.parent)
    except OSError as exc:
        raise AuditSetupError(f"cannot create the audit key file {path}: {exc.strerror}") from None
    log.warning(
        "created the audit log key in %s (mode 0600): keep it where the database's admins "
        "cannot reach it, back it up, never change it",
        path,
    )
    return key


@dataclass(frozen=True)
class Anchor:
    seq: int
    hash: bytes
    keyed_from: int
    key_id: str


def read_anchor(path: Path) -> Anchor | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise AuditSetupError(f"cannot read the audit anchor {path}: {exc.strerror}") from None
    try:
        d = orjson.loads(raw)
        a = Anchor(int(d["seq"]), bytes.fromhex(d["hash"]), int(d["keyed_from"]), d["key_id"])
    except (ValueError, KeyError, TypeError):
        raise AuditSetupError(f"the audit anchor {path} is not valid") from None
    if not (1 <= a.keyed_from <= a.seq and len(a.hash) == 32 and isinstance(a.key_id, str)):
        raise AuditSetupError(f"the audit anchor {path} is not valid")
    return a


def write_anchor(path: Path, anchor: Anchor) -> None:
    """Replace the anchor atomically (the caller holds ``locked(path)``)."""
    body = orjson.dumps(
        {
            "seq": anchor.seq,
            "hash": anchor.hash.hex(),
            "keyed_from": anchor.keyed_from,
            "key_id": anchor.key_id,
        }
    )
    try:
        tmp = _write_temp(path.parent, f".{path.name}.", body + b"\n")
        try:
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        _fsync_dir(path.parent)
    except OSError as exc:
        raise AuditSetupError(f"cannot write the audit anchor {path}: {exc.strerror}") from None


@contextlib.asynccontextmanager
async def locked(path: Path) -> AsyncIterator[None]:
    """Exclusive ``flock`` on ``<path>.lock`` (between the processes of one host; within a
    process the caller's asyncio lock comes first). Polled, so the event loop never blocks
    and a cancelled waiter holds nothing."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise AuditSetupError(f"cannot lock the audit anchor {path}: {exc.strerror}") from None
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(0.002)
        yield
    finally:
        os.close(fd)  # releases the lock

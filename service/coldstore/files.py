"""Segment files on disk: ``<root>/<stream id>/<window>/<seq>.seg`` (``seq``: the segment's
number in its window, zero-padded; segments before format version 2 were named
``<first entry id>-<last entry id>.seg``, exact arrival times, and keep their names), written
atomically (temp file in the same directory, fsync, rename, fsync of the directory)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from service.resources import private_dirs


def segment_path(root: Path, stream_id: int, epoch: int, seq: int) -> Path:
    return root / str(stream_id) / str(epoch) / f"{seq:06d}.seg"


def seq_of(path: str) -> int | None:
    """The ``seq`` a version-2 segment's file name gives, None for an older name."""
    stem = Path(path).stem
    return int(stem) if stem.isdigit() else None


def write_atomic(path: Path, data: bytes) -> None:
    private_dirs(path.parent)  # every level 0700, whatever the umask
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def remove_unindexed(root: Path, stream_id: int, epoch: int, keep: set[str]) -> int:
    """Delete files of a window that the index does not know (left by a seal that crashed
    between the rename and the index commit; ciphertext, but still garbage)."""
    d = root / str(stream_id) / str(epoch)
    removed = 0
    if not d.is_dir():
        return 0
    for p in d.glob("*.seg"):
        if str(p) not in keep:
            p.unlink(missing_ok=True)
            removed += 1
    for p in d.glob(".*.tmp"):
        p.unlink(missing_ok=True)
    return removed


def remove_window(root: Path, stream_id: int, epoch: int, paths: list[str]) -> int:
    """Delete a window's segment files: those the index names (wherever they were written)
    and everything left in the window's directory under ``root`` (a crashed seal's file or
    temp file), then the directory; the parent directory is synced so the deletion is
    durable. Safe to run again: a file already gone is skipped. Returns the files deleted."""
    removed = 0
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed += 1
    d = root / str(stream_id) / str(epoch)
    if d.is_dir():
        for left in d.iterdir():
            if left.is_file() or left.is_symlink():
                left.unlink(missing_ok=True)
                removed += 1
        with contextlib.suppress(OSError):  # not empty: something not ours, left in place
            d.rmdir()
    if d.parent.is_dir():
        dfd = os.open(d.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return removed

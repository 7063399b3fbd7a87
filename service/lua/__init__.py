"""Lua scripts, loaded once per process and run by EVALSHA (redis-py's Script objects)."""

from __future__ import annotations

from importlib.resources import files


def source(name: str) -> str:
    return files(__package__).joinpath(f"{name}.lua").read_text()


def status_of(res: list) -> str:
    """The status word a script returns first (``'ok'``, ``'dup'``, ``'stale'``, ...)."""
    return res[0].decode() if isinstance(res[0], bytes) else str(res[0])

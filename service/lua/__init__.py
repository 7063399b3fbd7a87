"""Lua scripts, loaded once per process and run by EVALSHA (redis-py's Script objects)."""

from __future__ import annotations

from importlib.resources import files


def source(name: str) -> str:
    return files(__package__).joinpath(f"{name}.lua").read_text()

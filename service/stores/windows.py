"""Redis side of windows: noise-initialised tables, window state, epoch pointers, the
count-period aggregate, the hot stream (DESIGN §3, §7). No rules here: see ``service``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, cast

import numpy as np
import orjson
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from service.keys import Keys
from service.lua import source
from service.streams.runtime import StreamRuntime

log = logging.getLogger("selectivity.windows")

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


@dataclass
class Aggregate:
    """Sum of the count period's tables for one epoch: one flat int64 array in memory, the
    tables in ``layout`` order and then the prior table's L cells. Stored like the window
    tables, as big-endian int32 (half the bytes of int64 for every roll and every API process
    that loads it); a sum beyond the int32 range saturates, as window cells do (BITFIELD SAT)."""

    epoch: int
    lo: int
    hi: int
    windows: list[int]  # the windows actually summed (those of [lo, hi] that exist)
    layout: list[tuple[int, int]]  # (table id, number of cells), in storage order
    cells: np.ndarray  # flat int64

    @property
    def n_windows(self) -> int:
        return len(self.windows)

    @cached_property
    def tables(self) -> dict[int, np.ndarray]:
        """Table id → its flat cells (views into ``cells``)."""
        out: dict[int, np.ndarray] = {}
        pos = 0
        for tid, size in self.layout:
            out[tid] = self.cells[pos : pos + size]
            pos += size
        return out

    @property
    def prior(self) -> np.ndarray:
        return self.cells[sum(size for _, size in self.layout) :]

    def aligned(self, layout: list[tuple[int, int]], n_labels: int) -> np.ndarray:
        """A copy of the cells laid out as ``layout`` (tables it lacks are zeros)."""
        if layout == self.layout:
            return self.cells.copy()
        mine = self.tables
        parts = [mine.get(tid, np.zeros(size, np.int64)) for tid, size in layout]
        prior = self.prior if self.prior.size == n_labels else np.zeros(n_labels, np.int64)
        return np.concatenate([*parts, prior])

    def to_redis(self) -> dict[str, bytes]:
        meta = {
            "epoch": self.epoch,
            "lo": self.lo,
            "hi": self.hi,
            "windows": self.windows,
            "tables": [list(x) for x in self.layout],
        }
        cells = self.cells
        if cells.size and (cells.max() > INT32_MAX or cells.min() < INT32_MIN):
            cells = np.clip(cells, INT32_MIN, INT32_MAX)
        blob = cells.astype(">i4")
        return {"meta": orjson.dumps(meta), "cells": blob.tobytes()}

    @classmethod
    def from_redis(cls, data: dict[bytes, bytes]) -> Aggregate:
        meta = orjson.loads(data[b"meta"])
        cells = np.frombuffer(data[b"cells"], dtype=">i4").astype(np.int64)
        layout = [(int(t), int(n)) for t, n in meta["tables"]]
        return cls(meta["epoch"], meta["lo"], meta["hi"], meta["windows"], layout, cells)


class WindowStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.r = redis
        self.k = keys
        self._prepare = redis.register_script(source("prepare"))
        self._chunk = redis.register_script(source("hot_chunk"))

    # -- window tables ---------------------------------------------------------------
    async def state(self, s: str, w: int) -> str | None:
        v = await self.r.hget(self.k.meta(s, w), "state")
        return cast(bytes, v).decode() if v is not None else None

    async def write_tables(
        self,
        rt: StreamRuntime,
        w: int,
        tables: dict[int, np.ndarray],
        prior: np.ndarray,
        *,
        state: str,
    ) -> bool:
        """Write noise-initialised tables unless the window already opened; atomic."""
        keys = [self.k.meta(rt.name, w)]
        args: list[bytes | str] = []
        for tid, cells in tables.items():
            keys.append(self.k.table(rt.name, w, tid))
            args.append(np.asarray(cells, dtype=">i4").tobytes())
        keys.append(self.k.prior(rt.name, w))
        args.append(np.asarray(prior, dtype=">i4").tobytes())
        args.append(state)
        return bool(await self._prepare(keys=keys, args=args))

    async def set_state(self, s: str, w: int, state: str) -> None:
        await self.r.hset(self.k.meta(s, w), "state", state)

    async def read_window(
        self, rt: StreamRuntime, w: int, table_ids: Sequence[int]
    ) -> np.ndarray | None:
        """A window's tables (in ``table_ids`` order) and its prior table as one flat int64
        array, in one MGET; None if the window has no tables (never existed or deleted). A
        table missing in a window that has others reads as zeros (it did not exist yet)."""
        keys = [self.k.table(rt.name, w, t) for t in table_ids] + [self.k.prior(rt.name, w)]
        raw = cast(list[bytes | None], await self.r.mget(keys))
        if raw[-1] is None:
            return None
        zeros = bytes(4 * rt.spec.cells)
        blob = b"".join(b if b is not None else zeros for b in raw)
        return np.frombuffer(blob, ">i4").astype(np.int64)

    async def read_tables(
        self, rt: StreamRuntime, w: int, table_ids: Sequence[int]
    ) -> tuple[dict[int, np.ndarray], np.ndarray] | None:
        """The same, split per table: ({table id: cells}, prior)."""
        flat = await self.read_window(rt, w, table_ids)
        if flat is None:
            return None
        n = rt.spec.cells
        tables = {tid: flat[i * n : (i + 1) * n] for i, tid in enumerate(table_ids)}
        return tables, flat[len(table_ids) * n :]

    async def delete_tables(self, rt: StreamRuntime, w: int, table_ids: Sequence[int]) -> None:
        await self.r.delete(
            *[self.k.table(rt.name, w, t) for t in table_ids], self.k.prior(rt.name, w)
        )

    async def delete_hot(self, s: str, w: int) -> None:
        await self.r.delete(self.k.hot(s, w), self.k.cols(s, w), self.k.users(s, w))

    async def delete_meta(self, s: str, w: int) -> None:
        await self.r.delete(self.k.meta(s, w))

    async def hot_length(self, s: str, w: int) -> int:
        return int(await self.r.xlen(self.k.hot(s, w)))

    # -- epoch pointers -----------------------------------------------------------------
    async def epoch(self, s: str) -> int | None:
        v = await self.r.get(self.k.epoch(s))
        return int(v) if v is not None else None

    async def set_epoch(self, s: str, epoch: int) -> None:
        await self.r.set(self.k.epoch(s), epoch)

    async def served(self, s: str) -> int | None:
        v = await self.r.get(self.k.served(s))
        return int(v) if v is not None else None

    async def clear_pointers(self, s: str) -> None:
        await self.r.delete(self.k.epoch(s), self.k.served(s))

    async def set_served(self, s: str, epoch: int) -> None:
        await self.r.set(self.k.served(s), epoch)

    # -- aggregate ----------------------------------------------------------------------
    async def read_agg(self, s: str, epoch: int) -> Aggregate | None:
        data = await self.r.hgetall(self.k.agg(s, epoch))
        return Aggregate.from_redis(cast(dict[bytes, bytes], data)) if data else None

    async def write_agg(self, s: str, agg: Aggregate) -> None:
        key = self.k.agg(s, agg.epoch)
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(key)
        pipe.hset(key, mapping=agg.to_redis())  # type: ignore[arg-type]
        await pipe.execute()

    async def delete_aggs_before(self, s: str, epoch: int, *, oldest: int) -> None:
        keys = [self.k.agg(s, e) for e in range(max(oldest, 1), epoch)]
        if keys:
            await self.r.delete(*keys)

    # -- hot stream ---------------------------------------------------------------------
    async def hot_last_id(self, s: str, w: int) -> bytes | None:
        last = await self.r.xrevrange(self.k.hot(s, w), count=1)
        return cast(bytes, last[0][0]) if last else None

    async def hot_chunk(
        self, s: str, w: int, start: bytes | str, end: bytes | str, count: int
    ) -> tuple[bytes, int, bytes] | None:
        """Up to ``count`` entries of window ``w``'s hot stream in ``[start, end]``:
        ``(last entry id, number of entries, b'row,row,...')`` with each entry's raw JSON row
        (``service.features.hotrows`` reads it), or None when there are none. One bulk string
        instead of a reply object per entry: an XRANGE parsed entry by entry was most of a
        train-set chunk's reading time."""
        res = await self._chunk(keys=[self.k.hot(s, w)], args=[start, end, count])
        if not res:
            return None
        last, n, rows = cast(list, res)
        return bytes(last), int(n), bytes(rows)

    async def cols_length(self, s: str, w: int) -> int:
        return int(await self.r.llen(self.k.cols(s, w)))

    async def cols_at(self, s: str, w: int, i: int) -> bytes | None:
        """The ``i``-th counted run of window ``w`` (``hotrows.to_ipc``); runs never change."""
        return cast(bytes | None, await self.r.lindex(self.k.cols(s, w), i))

    async def hot_range(
        self, s: str, w: int, start: bytes | str, end: bytes | str, count: int
    ) -> list[tuple[bytes, dict[bytes, bytes]]]:
        entries = await self.r.xrange(self.k.hot(s, w), min=start, max=end, count=count)
        return cast(list[tuple[bytes, dict[bytes, bytes]]], entries)

    # -- locks --------------------------------------------------------------------------
    def lock(self, s: str, what: str, *, timeout: float, blocking_timeout: float | None):
        return self.r.lock(self.k.lock(s, what), timeout=timeout, blocking_timeout=blocking_timeout)

    async def rewrite_aof(self) -> bool:
        """Rewrite the AOF so deleted hot data leaves the persistence files (DESIGN §7)."""
        try:
            conf = await self.r.config_get("appendonly")
        except Exception:  # CONFIG may be disabled on managed Redis
            return False
        raw = cast(dict[Any, Any], conf)
        value = raw.get("appendonly", raw.get(b"appendonly"))
        if value not in ("yes", b"yes"):
            return False
        # A rewrite already under way may have started before the delete: wait for it, then
        # start ours (Redis refuses a second one while one runs).
        for _ in range(600):
            try:
                await self.r.bgrewriteaof()
                return True
            except ResponseError as exc:
                if "already in progress" not in str(exc):
                    raise
            await asyncio.sleep(0.05)
        log.error("could not start an AOF rewrite: one has been running for 30 s")
        return False

"""Redis side of windows: noise-initialised tables, window state, epoch pointers, the
count-period aggregate, the hot stream (docs/ARCHITECTURE.md). No rules here: see
``service.windows`` and ``service.lifecycle``."""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, cast

import numpy as np
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ResponseError

from service.core.tables import cells as cell_codec
from service.core.tables.aggregate import Aggregate
from service.lua import source
from service.stores.keys import Keys

log = logging.getLogger("selectivity.windows")

STAGE_TTL_SECONDS = 600  # staging keys a crash left behind go after this
MGET_STEP = 8  # tables per MGET: ~2.6 MB at 16384 x 5 cells, ~1 ms of Redis time


async def mget_stepwise(r: Redis, keys: Sequence[str]) -> list[bytes | None]:
    """MGET of ``keys`` in steps of ``MGET_STEP``, each awaited before the next is sent (a
    pipeline would be executed by Redis in one go, serving nobody else meanwhile)."""
    out: list[bytes | None] = []
    for i in range(0, len(keys), MGET_STEP):
        out += cast(list[bytes | None], await r.mget(keys[i : i + MGET_STEP]))
    return out


# Entries read by one XRANGE of hot_chunk: Redis serves other clients between the steps, each
# ~0.3 ms of Redis time. (A Lua script that joined the rows in Redis held every other client
# up for 200-640 ms a 20,000-entry run, ~13x the Redis time of XRANGE: bench roll's slow log,
# issue 17.)
HOT_STEP = 500


class WindowStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.r = redis
        self.k = keys
        self._prepare = redis.register_script(source("prepare"))
        self._move = redis.register_script(source("move"))
        self._move_agg = redis.register_script(source("move_agg"))
        self._fold = redis.register_script(source("fold"))

    # -- window tables ---------------------------------------------------------------
    async def state(self, s: str, w: int) -> str | None:
        v = await self.r.hget(self.k.meta(s, w), "state")
        return cast(bytes, v).decode() if v is not None else None

    async def write_tables(
        self,
        s: str,
        w: int,
        tables: dict[int, np.ndarray],
        prior: np.ndarray,
        *,
        state: str,
        parts: int = 1,
    ) -> bool:
        """Write noise-initialised tables unless the window already opened; atomic per part.
        The tables are staged by plain SETs (Redis serves others in between) and moved into
        place by ``prepare.lua`` with RENAME, so no script holds Redis for their bytes. With
        ``parts`` > 1, parts 1 … parts − 1 get tables of zeros first and part 0, whose state is
        the window's, gets the noise last: the window's noise is drawn once, and a window's
        tables summed over its parts are noise + exact counts as with one part. A crash
        between parts leaves part 0 unprepared, so the next call prepares every part again
        (a part already open or closed is left as it is)."""
        written = False
        for p in reversed(range(parts)):
            if p:
                zeros = {tid: np.zeros_like(cells) for tid, cells in tables.items()}
                written = await self._write_part(s, w, p, zeros, np.zeros_like(prior), state)
            else:
                written = await self._write_part(s, w, 0, tables, prior, state)
        return written

    async def _write_part(
        self,
        s: str,
        w: int,
        p: int,
        tables: dict[int, np.ndarray],
        prior: np.ndarray,
        state: str,
    ) -> bool:
        values = {self.k.table(s, w, tid, p): cells for tid, cells in tables.items()}
        values[self.k.prior(s, w, p)] = prior
        meta = self.k.meta(s, w, p)
        return bool(await self._staged_move(self._prepare, meta, values, [state, len(values)]))

    async def _staged_move(
        self, script: Any, meta: str, values: dict[str, np.ndarray], args: list[Any]
    ) -> Any:
        """Stage ``values`` (key → cells) by plain SETs under keys of their own (Redis serves
        others between them), then run ``script`` (``prepare.lua``, ``fold.lua``) on the meta
        hash, the keys and their staging keys, which moves them into place by RENAME; the
        staging keys are deleted if anything fails before."""
        token = secrets.token_hex(8)
        stages = [f"{key}:stage:{token}" for key in values]
        try:
            for stage, cells in zip(stages, values.values(), strict=True):
                await self.r.set(stage, cell_codec.encode(cells), ex=STAGE_TTL_SECONDS)
            return await script(keys=[meta, *values, *stages], args=args)
        except BaseException:
            await asyncio.shield(self.r.delete(*stages))
            raise

    async def set_state(self, s: str, w: int, state: str, *, parts: int = 1) -> None:
        """Set the window's state in every part, part 0 (whose state is the window's) last,
        so a crash in between is seen as the state not set yet and the caller sets it again."""
        for p in reversed(range(parts)):
            await self.r.hset(self.k.meta(s, w, p), "state", state)

    async def read_window(
        self, s: str, w: int, table_ids: Sequence[int], *, cells: int, parts: int = 1
    ) -> np.ndarray | None:
        """A window's tables (in ``table_ids`` order) and its prior table as one flat int64
        array, summed over its ``parts`` parts; None if the window has no tables (never
        existed or deleted). A table missing in a window that has others reads as zeros (it
        did not exist yet); a table has ``cells`` cells.

        A window of several parts may be folded (``fold``) while it is read: part 0 then
        becomes the sum and the other parts go. Part 0's ``folded`` flag is read before and
        after part 0 (the fold sets it in the script that moves the sum into place): set
        before, part 0 alone is the window; clear both times, part 0 was read unfolded and the
        other parts are added, and one found gone was folded meanwhile: the read starts
        again. So no part's counts are ever added twice, nor a folded window's left out."""
        if parts == 1:
            return await self._read_part(s, w, 0, table_ids, cells)
        while True:
            if await self.folded(s, w):
                return await self._read_part(s, w, 0, table_ids, cells)
            total = await self._read_part(s, w, 0, table_ids, cells)
            if total is None:  # deleted (every part goes in one roll): none of it is counted
                return None
            if await self.folded(s, w):
                continue  # folded during the read: part 0 may be a mix
            for p in range(1, parts):
                flat = await self._read_part(s, w, p, table_ids, cells)
                if flat is None:
                    break
                total += flat
            else:
                return total
            if not await self.folded(s, w):
                return None  # deleted, not folded

    async def folded(self, s: str, w: int) -> bool:
        return await self.r.hget(self.k.meta(s, w, 0), "folded") == b"1"

    async def fold(self, s: str, w: int, table_ids: Sequence[int], *, parts: int) -> bool:
        """Fold a closed window's parts into part 0 and delete the others' tables: part 0's
        tables (those it has; a table added after the window began has none) become the sum
        over the parts (``sum_into_part_0``), then the other parts' tables go. Only for a
        window counted to its end (no count writes to its parts any more). Exact counts of a
        part p ≥ 1 carry no noise: once the window's raw rows are deleted they must not be
        left in Redis (docs/PRIVACY.md, "Partitions"). Idempotent: a second call, or one after
        a crash between the two steps, deletes what is left. Returns whether the window is
        folded (False: one part, or no tables)."""
        if parts == 1:
            return False
        if not await self.folded(s, w) and not await self.sum_into_part_0(
            s, w, table_ids, parts=parts
        ):
            return False
        for p in range(1, parts):
            await self.r.unlink(
                *[self.k.table(s, w, t, p) for t in table_ids], self.k.prior(s, w, p)
            )
        return True

    async def sum_into_part_0(
        self, s: str, w: int, table_ids: Sequence[int], *, parts: int
    ) -> bool:
        """``fold``'s first step: part 0's tables become the sum over the parts, moved into
        place with the ``folded`` flag by ``fold.lua``; the other parts are left as they are.
        Returns whether the window is folded (False: it has no tables)."""
        keys = [self.k.table(s, w, t, 0) for t in table_ids] + [self.k.prior(s, w, 0)]
        sums: list[np.ndarray | None] = [
            None if b is None else cell_codec.decode(b) for b in await mget_stepwise(self.r, keys)
        ]
        if sums[-1] is None:
            return False
        for p in range(1, parts):
            raw = await mget_stepwise(
                self.r, [self.k.table(s, w, t, p) for t in table_ids] + [self.k.prior(s, w, p)]
            )
            if raw[-1] is None:  # deleted, or folded by another caller meanwhile
                return await self.folded(s, w)
            for i, b in enumerate(raw):
                total = sums[i]
                if total is not None and b is not None:
                    total += cell_codec.decode(b)
        present = {k: v for k, v in zip(keys, sums, strict=True) if v is not None}
        moved = await self._staged_move(self._fold, self.k.meta(s, w, 0), present, [len(present)])
        return int(moved) >= 0

    async def _read_part(
        self, s: str, w: int, p: int, table_ids: Sequence[int], cells: int
    ) -> np.ndarray | None:
        keys = [self.k.table(s, w, t, p) for t in table_ids] + [self.k.prior(s, w, p)]
        # Several MGETs, one after the other, so Redis serves others in between. A deletion
        # removes every table and the prior in one DEL, and the prior is read last: if it is
        # there, every piece before it was read before any deletion.
        raw = await mget_stepwise(self.r, keys)
        if raw[-1] is None:
            return None
        zeros = cell_codec.zeros(cells)
        return cell_codec.decode(b"".join(b if b is not None else zeros for b in raw))

    async def read_tables(
        self, s: str, w: int, table_ids: Sequence[int], *, cells: int, parts: int = 1
    ) -> tuple[dict[int, np.ndarray], np.ndarray] | None:
        """The same, split per table: ({table id: cells}, prior)."""
        flat = await self.read_window(s, w, table_ids, cells=cells, parts=parts)
        if flat is None:
            return None
        n = cells
        tables = {tid: flat[i * n : (i + 1) * n] for i, tid in enumerate(table_ids)}
        return tables, flat[len(table_ids) * n :]

    async def delete_tables(
        self, s: str, w: int, table_ids: Sequence[int], *, parts: int = 1
    ) -> None:
        # UNLINK: gone from the keyspace at once, freed by Redis's background thread (a DEL of
        # big values frees them in the thread that serves every client). One command a part:
        # each part is its own cluster slot.
        for p in range(parts):
            await self.r.unlink(
                *[self.k.table(s, w, t, p) for t in table_ids], self.k.prior(s, w, p)
            )

    async def delete_hot(self, s: str, w: int, *, parts: int = 1) -> None:
        """Delete the window's raw rows (every part's hot stream, counted runs by column,
        per-user counters, listed batches) and the staging keys of counting runs a crash left
        (recorded in the part's meta: ``CountingStore.stage``), which in a part p ≥ 1 hold
        exact counts and must not outlive the raw rows."""
        for p in range(parts):
            meta = self.k.meta(s, w, p)
            runs = {
                k: v
                for k, v in cast(dict[bytes, bytes], await self.r.hgetall(meta)).items()
                if k.startswith(b"stage:")
            }
            for field, ids in runs.items():
                token = field.decode()[len("stage:") :]
                keys = [self.k.stage(s, w, token, int(t), p) for t in ids.split()]
                if keys:
                    await self.r.unlink(*keys)
                await self.r.hdel(meta, field)
            await self.r.unlink(
                self.k.hot(s, w, p),
                self.k.cols(s, w, p),
                self.k.users(s, w, p),
                self.k.batches(s, w, p),
                self.k.batch_ids(s, w, p),
            )

    async def delete_meta(self, s: str, w: int, *, parts: int = 1) -> None:
        for p in reversed(range(parts)):  # part 0, the window's state, last
            await self.r.delete(self.k.meta(s, w, p))

    async def hot_length(self, s: str, w: int, *, parts: int = 1) -> int:
        return sum([int(await self.r.xlen(self.k.hot(s, w, p))) for p in range(parts)])

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
        """The stored aggregate of ``epoch``, or None. Its metadata first, then its pieces
        one command each (Redis serves others in between); a piece gone meanwhile (the
        aggregate was rewritten: ``write_agg`` replaces the whole hash at once) starts the
        read again, so pieces of two versions are never mixed."""
        key = self.k.agg(s, epoch)
        while True:
            meta = cast(bytes | None, await self.r.hget(key, "meta"))
            if meta is None:
                return None
            data = {b"meta": meta}
            for field in Aggregate.chunks_of(meta):
                piece = cast(bytes | None, await self.r.hget(key, field))
                if piece is None:
                    break
                data[field.encode()] = piece
            else:
                return Aggregate.from_redis(data)

    async def agg_span(self, s: str, epoch: int) -> tuple[int, int] | None:
        """The stored aggregate's count period ``(lo, hi)``, or None: its metadata only."""
        meta = await self.r.hget(self.k.agg(s, epoch), "meta")
        return Aggregate.span_of(cast(bytes, meta)) if meta is not None else None

    def agg_stages(self, s: str) -> str:
        """The set of the stream's aggregate staging keys being written (``write_agg``), so
        that expiry finds and deletes those of epochs it expires."""
        return f"{self.k.agg(s, 0).rsplit(':', 1)[0]}-stages"

    async def write_agg(self, s: str, agg: Aggregate) -> bool:
        """Store (or replace) the aggregate of its epoch: its pieces are written to a staging
        key one command each, then moved into place by RENAME, O(1) (no command moves the
        whole aggregate, and readers see the old version or the new one whole). The staging
        key is listed in ``agg_stages`` while it exists. Never lands once the stream serves a
        later epoch (``move_agg.lua``: such an aggregate may hold a window expiry deleted);
        False then."""
        token = secrets.token_hex(8)
        key = self.k.agg(s, agg.epoch)
        stage = f"{key}:stage:{token}"
        stages = self.agg_stages(s)
        try:
            await self.r.sadd(stages, stage)
            for field, value in agg.to_redis(token).items():
                await self.r.hset(stage, field, value)
                await self.r.expire(stage, STAGE_TTL_SECONDS)
            moved = await self._move_agg(
                keys=[stage, key, self.k.served(s), stages], args=[agg.epoch]
            )
            return bool(moved)
        except BaseException:
            await asyncio.shield(self._drop_stage(stages, stage))
            raise

    async def _drop_stage(self, stages: str, stage: str) -> None:
        await self.r.delete(stage)
        await self.r.srem(stages, stage)

    async def delete_aggs_before(self, s: str, epoch: int, *, oldest: int) -> None:
        """Delete the aggregates of epochs ``oldest`` … ``epoch`` − 1 and every staging key of
        an aggregate of an epoch before ``epoch`` (a writer's, or one a crash left)."""
        keys = [self.k.agg(s, e) for e in range(max(oldest, 1), epoch)]
        stages = self.agg_stages(s)
        for raw in cast(set[bytes], await self.r.smembers(stages)):
            stage = raw.decode()
            if int(stage.rsplit(":stage:", 1)[0].rsplit(":", 1)[1]) < epoch:
                keys.append(stage)
                await self.r.srem(stages, stage)
        if keys:
            await self.r.unlink(*keys)

    async def delete_agg(self, s: str, epoch: int) -> None:
        await self.r.unlink(self.k.agg(s, epoch))

    # -- hot stream ---------------------------------------------------------------------
    async def hot_last_id(self, s: str, w: int, p: int = 0) -> bytes | None:
        last = await self.r.xrevrange(self.k.hot(s, w, p), count=1)
        return cast(bytes, last[0][0]) if last else None

    async def hot_chunk(
        self, s: str, w: int, start: bytes | str, end: bytes | str, count: int, p: int = 0
    ) -> tuple[bytes, int, bytes] | None:
        """Up to ``count`` entries of window ``w``'s hot stream in ``[start, end]``:
        ``(last entry id, number of entries, b'row,row,...')`` with each entry's raw JSON row
        (``service.core.features.hotrows`` reads it), or None when there are none. Read by plain
        ``XRANGE`` in steps of ``HOT_STEP`` entries, joined here: Redis, which every client
        shares, only hands back stored bytes. ``p``: the window's part."""
        key = self.k.hot(s, w, p)
        parts: list[bytes] = []
        total, last = 0, b""
        while total < count:
            step = min(HOT_STEP, count - total)
            entries = cast(
                list[tuple[bytes, dict[bytes, bytes]]],
                await self.r.xrange(key, min=start, max=end, count=step),
            )
            if not entries:
                break
            try:
                parts.append(b",".join([fields[b"d"] for _, fields in entries]))
            except KeyError:
                bad = next(eid for eid, fields in entries if b"d" not in fields)
                raise RuntimeError(f"hot entry {bad.decode()} has no d field") from None
            last, total = bytes(entries[-1][0]), total + len(entries)
            if len(entries) < step:
                break
            start = b"(" + last
        if not parts:
            return None
        return last, total, b",".join(parts)

    async def hot_rows(
        self, s: str, w: int, *, parts: int = 1, count: int = HOT_STEP
    ) -> AsyncIterator[bytes]:
        """Every hot entry of window ``w`` as chunks of ``row,row,...`` (``hot_chunk``, up to
        ``count`` entries each), part by part, each part in entry order."""
        for p in range(parts):
            start: bytes | str = "-"
            while True:
                chunk = await self.hot_chunk(s, w, start, "+", count, p)
                if chunk is None:
                    break
                last, n, rows = chunk
                yield rows
                if n < count:
                    break
                start = b"(" + last

    async def cols_length(self, s: str, w: int, p: int = 0) -> int:
        return int(await self.r.llen(self.k.cols(s, w, p)))

    async def cols_at(self, s: str, w: int, i: int, p: int = 0) -> bytes | None:
        """The ``i``-th counted run of part ``p`` of window ``w`` (``hotrows.to_ipc``); runs
        never change."""
        return cast(bytes | None, await self.r.lindex(self.k.cols(s, w, p), i))

    async def hot_range(
        self, s: str, w: int, start: bytes | str, end: bytes | str, count: int, p: int = 0
    ) -> list[tuple[bytes, dict[bytes, bytes]]]:
        entries = await self.r.xrange(self.k.hot(s, w, p), min=start, max=end, count=count)
        return cast(list[tuple[bytes, dict[bytes, bytes]]], entries)

    # -- locks --------------------------------------------------------------------------
    def lock(self, s: str, what: str, *, timeout: float, blocking_timeout: float | None):
        return self.r.lock(self.k.lock(s, what), timeout=timeout, blocking_timeout=blocking_timeout)

    async def rewrite_aof(self) -> bool:
        """Rewrite the AOF so deleted hot data leaves the persistence files
        (docs/ARCHITECTURE.md, "Storage"): of every primary of a Redis Cluster (a keyless
        command has no slot to be routed by, and each master holds its own AOF). True if a
        rewrite was started on every node with the AOF on (and at least one)."""
        if isinstance(self.r, RedisCluster):
            started = [
                await self._rewrite_aof_on(
                    functools.partial(self.r.execute_command, target_nodes=node)
                )
                for node in self.r.get_primaries()
            ]
            return any(started)
        return await self._rewrite_aof_on(self.r.execute_command)

    async def _rewrite_aof_on(self, execute: Callable[..., Awaitable[Any]]) -> bool:
        try:
            conf = await execute("CONFIG GET", "appendonly")
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
                await execute("BGREWRITEAOF")
                return True
            except ResponseError as exc:
                if "already in progress" not in str(exc):
                    raise
            await asyncio.sleep(0.05)
        log.error("could not start an AOF rewrite: one has been running for 30 s")
        return False

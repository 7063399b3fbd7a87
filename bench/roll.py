"""Roll time as tables grow, and Redis memory per window against the cells × 4 bytes floor.

`selectivity bench roll [--quick]`: for 10, 40 and 100 tables (default sketch 16384 × 5, two
labels), a stream in an embedded Redis (``bench.harness``) is rolled past its retention so that
every roll adds the entering window and subtracts the leaving one. Ahead of each timed roll the
bench does what the previous roll's follow-up does in the worker: noise for the next window,
and, with two or more hot windows (the default; ``--hot-windows 1`` for one), the aggregate the
roll will serve (after counting the window that enters the count period to its end), so the
roll itself moves the ``served`` pointer and commits (the build is timed apart: "built
ahead"). Baselines measured in the same run: reading and writing the same bytes raw (one
window's tables GET + SET), the I/O floor of an aggregate update. Memory: `MEMORY USAGE` of
one window's table keys against cells × 4 bytes. Targets: a roll under 1 s at 40 tables;
memory at most 1.1× the floor.

Blocking (issue 17): after the timed rolls, ``STALL_ROLLS`` more rolls run while a client in
another process (its own app context on the same Redis and SQL, as a second API process would
be) ingests batches of 10 rows and featurizes one row, alternately, without pause, and a third
process runs the worker's counting job every second. Per roll:
the longest an operation took or the client waited for one to finish while the roll ran
(``stall``), against the same measure over an equal stretch before the roll (``quiet``); and
how long featurize still answered with the previous epoch after ingest already went to the
new window (``stale``: from the first ingest accepted into the new window to the first
featurize answer of the new epoch). Target: both ≤ 50 ms at 100 tables.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing
import statistics
import time
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from bench.harness import PREFIX, InProcess
from bench.report import Plot, Table, plot_path, pyplot, write_section
from service import resources
from service.config import Settings
from service.counting import service as counting
from service.features import service as features
from service.ingest import service as ingest
from service.ingest.schemas import IngestIn
from service.lifecycle import followups
from service.lifecycle import roll as lifecycle_roll
from service.lifecycle import streams as lifecycle_streams
from service.streams import service as streams
from service.streams.schemas import StreamCreate
from service.windows import service as windows

RETENTION = 4
SIZES = (10, 40, 100)
STALL_ROLLS = 3  # rolls with the client running, per size
STALL_TARGET = 0.050  # s
ROLL_RATIO_TARGET = 1.2  # roll / raw GET + SET of one window, issue 17


def _rows(n_tables: int, j0: int, n: int) -> list[dict[str, Any]]:
    return [
        {
            "features": {f"f{i}": str(j * 31 + i) for i in range(n_tables - 1)},
            "label": str(j % 2),
        }
        for j in range(j0, j0 + n)
    ]


async def _client_loop(
    settings: Settings, name: str, n_tables: int, stop: Event, ready: Event
) -> list[tuple[str, float, float, int]]:
    """Ingest 10 rows, featurize 1 row, again and again until ``stop``: (kind, start, end,
    window or epoch; -1 for a refused call) per call, monotonic clock."""
    ctx = await resources.build(settings)
    out: list[tuple[str, float, float, int]] = []
    try:
        j = 10_000
        while not stop.is_set():
            body = IngestIn.model_validate({"observations": _rows(n_tables, j, 10)})
            j += 10
            t = time.monotonic()
            kind = "ingest"
            try:
                res, _ = await ingest.ingest(ctx=ctx, name=name, body=body, idempotency_key=None)
                got = res.window
            except Exception as exc:  # refused: recorded with its type
                kind, got = f"ingest refused: {type(exc).__name__}", -1
            out.append((kind, t, time.monotonic(), got))
            row = _rows(n_tables, j, 1)[0]["features"]
            t = time.monotonic()
            kind = "featurize"
            try:
                fz = await features.featurize(ctx=ctx, name=name, rows=[row])
                got = int(fz["epoch"])
            except Exception as exc:
                kind, got = f"featurize refused: {type(exc).__name__}", -1
            out.append((kind, t, time.monotonic(), got))
            if len(out) >= 40:
                ready.set()
    finally:
        await resources.close(ctx)
    return out


def _client(
    data_dir: str, socket: str, name: str, n_tables: int, stop: Event, ready: Event, q: Any
) -> None:
    """The client process (spawned): a second app context on the bench's Redis and SQLite."""
    q.put(asyncio.run(_client_loop(_settings(data_dir, socket), name, n_tables, stop, ready)))


def _settings(data_dir: str, socket: str) -> Settings:
    return Settings(
        env="development",
        data_dir=Path(data_dir),
        redis_url=f"unix://{socket}",
        database_url=None,
        redis_prefix=PREFIX,
        embedded_worker=False,
    )


async def _count_loop(settings: Settings, name: str, stop: Event) -> None:
    """The worker's counting job, every second, until ``stop`` (as ``SELECTIVITY_COUNT_SECONDS``
    = 1 in the speed benchmark): a roll then counts only what arrived since its last run."""
    ctx = await resources.build(settings)
    try:
        while not stop.is_set():
            epoch = await ctx.stores.windows.epoch(name)
            if epoch is not None:
                rt = await streams.runtime(ctx=ctx, name=name)
                try:
                    await counting.count_hot(ctx=ctx, rt=rt, epoch=epoch)
                except Exception as exc:  # a window expired under it: next second
                    print(f"  counting: {type(exc).__name__}", flush=True)
            await asyncio.sleep(1.0)
    finally:
        await resources.close(ctx)


def _counter(data_dir: str, socket: str, name: str, stop: Event) -> None:
    asyncio.run(_count_loop(_settings(data_dir, socket), name, stop))


def _worst(ops: list[tuple[str, float, float, int]], lo: float, hi: float) -> float:
    """The longest call that ran into [lo, hi], or wait within it between two calls' ends."""
    inside = [o for o in ops if o[2] >= lo and o[1] <= hi]
    longest = max((e - s for _, s, e, _ in inside), default=0.0)
    ends = sorted([lo] + [e for _, _, e, _ in inside if lo <= e <= hi] + [hi])
    gaps = max((b - a for a, b in zip(ends, ends[1:], strict=False)), default=0.0)
    return max(longest, gaps)


def _mark(marks: list[tuple[str, float]], at: str) -> None:
    marks.append((at, time.perf_counter()))


async def _ahead(svc: InProcess, name: str) -> float:
    """What the roll's follow-up does in the worker before the next roll: noise for the next
    window, and (two or more hot windows) the aggregate the next roll serves. Its seconds."""
    ctx = svc.ctx
    t = time.perf_counter()
    await windows.prepare_next(ctx=ctx, name=name)
    rt = await streams.runtime(ctx=ctx, name=name)
    epoch = await ctx.stores.windows.epoch(name)
    assert epoch is not None
    await followups.build_next(ctx=ctx, rt=rt, epoch=epoch)
    return time.perf_counter() - t


async def stalls(svc: InProcess, name: str, n_tables: int, rolls: int) -> dict[str, float]:
    """``rolls`` rolls with the client running: the worst ``stall``, ``quiet`` and ``stale``
    (seconds) over them, and ``follow``: the worst stall while the follow-up work before each
    roll ran (``_ahead``: what the worker does between two rolls)."""
    ctx = svc.ctx
    mp = multiprocessing.get_context("spawn")
    stop, ready, q = mp.Event(), mp.Event(), mp.Queue()
    proc = mp.Process(
        target=_client,
        args=(svc._tmp.name, svc.embedded.socket, name, n_tables, stop, ready, q),
    )
    proc.start()
    worker = mp.Process(target=_counter, args=(svc._tmp.name, svc.embedded.socket, name, stop))
    worker.start()
    marks: list[tuple[float, float, float, int]] = []
    aheads: list[tuple[float, float]] = []  # the follow-up's work before each roll
    await ctx.redis.config_set("slowlog-log-slower-than", 10_000)  # µs
    await ctx.redis.slowlog_reset()
    try:
        while not ready.is_set():
            await asyncio.sleep(0.05)
            if not proc.is_alive():
                raise RuntimeError("the stall client died")
        took = 0.5
        for _ in range(rolls):
            a0 = time.monotonic()
            await _ahead(svc, name)
            aheads.append((a0, time.monotonic()))
            # a stretch as long as a roll, with nothing else running (at least 1 s: the client
            # loads the next epoch's featurizer in the background meanwhile)
            quiet_for = max(took + 0.2, 1.0)
            await asyncio.sleep(quiet_for + 0.1)
            t0 = time.monotonic()
            target = await lifecycle_roll.roll(ctx=ctx, name=name)
            t1 = time.monotonic()
            took = t1 - t0
            marks.append((t0 - quiet_for, t0, t1, target))
            await asyncio.sleep(0.3)
    finally:
        stop.set()
    ops: list[tuple[str, float, float, int]] = await asyncio.to_thread(q.get, True, 120)
    proc.join(30)
    worker.join(30)
    stall = quiet = stale = 0.0
    follow = max((_worst(ops, a0, a1) for a0, a1 in aheads), default=0.0)
    for q0, t0, t1, target in marks:
        stall = max(stall, _worst(ops, t0, t1))
        quiet = max(quiet, _worst(ops, max(q0, t0 - (t1 - t0)), t0))
        inside = sorted((o for o in ops if o[2] >= t0 and o[1] <= t1), key=lambda o: o[1] - o[2])
        print(
            "  slowest calls during the roll: "
            + ", ".join(f"{k} at {s - t0:+.3f} s for {e - s:.3f} s" for k, s, e, _ in inside[:3]),
            flush=True,
        )
        into = [e for k, _, e, w in ops if k == "ingest" and w == target]
        served = [e for k, _, e, w in ops if k == "featurize" and w == target]
        if into and served:
            stale = max(stale, min(served) - min(into))
        print(
            f"  {n_tables} tables: roll to {target} took {t1 - t0:.3f} s; first ingest into it "
            f"at {min(into, default=float('nan')) - t0:+.3f} s, first featurize of it at "
            f"{min(served, default=float('nan')) - t0:+.3f} s",
            flush=True,
        )
    for entry in reversed(await ctx.redis.slowlog_get(128)):
        command = entry["command"]
        text = command.decode(errors="replace") if isinstance(command, bytes) else str(command)
        print(f"  redis slowlog: {entry['duration'] / 1e3:.1f} ms: {text[:60]}", flush=True)
    refused = sorted({k for k, _, _, _ in ops if "refused" in k})
    if refused:
        print(f"  {n_tables} tables: refused calls: {refused}", flush=True)
    return {"stall": stall, "quiet": quiet, "stale": max(stale, 0.0), "follow": follow}


async def one(
    svc: InProcess, n_tables: int, rolls: int, width: int, hot_windows: int
) -> dict[str, float]:
    ctx = svc.ctx
    name = f"roll{n_tables}"
    body = StreamCreate.model_validate(
        {
            "name": name,
            "features": [{"name": f"f{i}"} for i in range(n_tables - 1)],
            "labels": ["0", "1"],
            "hot_windows": hot_windows,
            "retention_windows": RETENTION,
            "sketch": {"width": width, "depth": 5},
            "max_tables": n_tables,
            "privacy": {"mechanism": "laplace", "epsilon": 1.0},
        }
    )
    await lifecycle_streams.create(ctx=ctx, stream_in=body)
    rows = IngestIn.model_validate({"observations": _rows(n_tables, 0, 200)})
    times: list[float] = []
    aheads: list[float] = []
    for k in range(RETENTION + hot_windows + rolls):
        await ingest.ingest(ctx=ctx, name=name, body=rows, idempotency_key=None)
        ahead = await _ahead(svc, name)  # ahead of time, as the worker does
        t = time.perf_counter()
        marks: list[tuple[str, float]] = []
        await lifecycle_roll.roll(ctx=ctx, name=name, step=functools.partial(_mark, marks))
        dt = time.perf_counter() - t
        steps = [(at, b - a) for (at, b), (_, a) in zip(marks, [("", t)] + marks, strict=False)]
        print("    steps: " + ", ".join(f"{at} {sec * 1e3:.0f} ms" for at, sec in steps))
        if k >= RETENTION + hot_windows:  # steady state: a window enters and one leaves
            times.append(dt)
            aheads.append(ahead)
        print(
            f"  {n_tables} tables: roll {k + 1} took {dt:.3f} s (ahead {ahead:.3f} s)", flush=True
        )
    rt = await streams.runtime(ctx=ctx, name=name)
    epoch = await ctx.stores.windows.epoch(name)
    assert epoch is not None
    w = epoch - 1
    keys = [ctx.keys.table(name, w, t.id) for t in rt.tables] + [ctx.keys.prior(name, w)]
    # raw I/O floor: one window's tables read and written back
    t = time.perf_counter()
    blobs = await ctx.redis.mget(keys)
    pipe = ctx.redis.pipeline(transaction=False)
    for key, blob in zip(keys, blobs, strict=True):
        assert blob is not None
        pipe.set(key + ":copy", blob)
    await pipe.execute()
    raw = time.perf_counter() - t
    await ctx.redis.delete(*[k + ":copy" for k in keys])
    used = 0
    for key in keys:
        used += int(await ctx.redis.memory_usage(key, samples=0) or 0)
    floor = (rt.spec.cells * len(rt.tables) + rt.spec.n_labels) * 4
    blocked = await stalls(svc, name, n_tables, STALL_ROLLS)
    print(f"  {n_tables} tables: with a client: {blocked}", flush=True)
    return {
        "tables": n_tables,
        "roll": statistics.median(times),
        "ahead": statistics.median(aheads),
        "raw": raw,
        "memory": used,
        "floor": floor,
        **blocked,
    }


async def run(
    sizes: tuple[int, ...], rolls: int, width: int, hot_windows: int
) -> list[dict[str, float]]:
    async with InProcess() as svc:
        return [await one(svc, n, rolls, width, hot_windows) for n in sizes]


def plot(results: list[dict[str, float]], width: int) -> Plot:
    plt = pyplot()
    sizes = [int(r["tables"]) for r in results]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(sizes, [r["roll"] for r in results], "o-", label="roll (median)")
    a.plot(sizes, [r["ahead"] for r in results], "^-", label="built ahead by the worker")
    a.plot(sizes, [r["raw"] for r in results], "s--", label="raw GET+SET of one window")
    a.axhline(1.0, color="grey", lw=0.8, ls=":", label="1 s target at 40 tables")
    a.set_xlabel("tables")
    a.set_ylabel("seconds")
    a.set_title(f"Roll time (sketch {width}×5, 2 labels)")
    a.legend()
    ratios = [r["memory"] / r["floor"] for r in results]
    b.bar([f"{s} tables" for s in sizes], ratios)
    b.axhline(1.1, color="red", lw=0.8, ls="--", label="1.1× target")
    b.set_ylim(0.9, max(1.2, max(ratios) + 0.05))
    b.set_xlabel("tables")
    b.set_ylabel("Redis memory / (cells × 4 B)")
    b.set_title("Memory per window")
    b.legend()
    fig.tight_layout()
    png = plot_path("roll")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return Plot("roll", png)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="selectivity bench roll", description=__doc__)
    p.add_argument("--quick", action="store_true", help="fewer rolls, narrower sketch")
    p.add_argument(
        "--tables", type=int, nargs="+", default=list(SIZES), help="table counts to measure"
    )
    p.add_argument(
        "--hot-windows",
        type=int,
        default=2,
        help="hot windows of the streams (2, the default: the next aggregate is built ahead of "
        "the roll; 1: the roll builds it after counting the window it closes)",
    )
    p.add_argument(
        "--no-report", action="store_true", help="print the section instead of appending it"
    )
    args = p.parse_args(argv)
    rolls, width = (2, 4096) if args.quick else (5, 16384)
    results = asyncio.run(run(tuple(args.tables), rolls, width, args.hot_windows))
    rows = [
        [
            int(r["tables"]),
            r["roll"],
            r["ahead"],
            r["raw"],
            r["roll"] / r["raw"],
            "yes" if r["roll"] / r["raw"] <= ROLL_RATIO_TARGET else "**no**",
            r["memory"] / 2**20,
            r["floor"] / 2**20,
            r["memory"] / r["floor"],
            "yes" if r["memory"] / r["floor"] <= 1.1 else "**no**",
        ]
        for r in results
    ]
    blocking = Table(
        [
            "tables",
            "stall during a roll, ms (worst)",
            "quiet stretch before it, ms (worst)",
            "stale epoch served, ms (worst)",
            f"both ≤ {STALL_TARGET * 1e3:.0f} ms",
            "stall during the follow-up before it, ms (worst)",
        ],
        [
            [
                int(r["tables"]),
                r["stall"] * 1e3,
                r["quiet"] * 1e3,
                r["stale"] * 1e3,
                "yes" if max(r["stall"], r["stale"]) <= STALL_TARGET else "**no**",
                r["follow"] * 1e3,
            ]
            for r in results
        ],
    )
    header = [
        "tables",
        "roll s (median)",
        "built ahead s (median)",
        "raw GET+SET s",
        "roll / raw",
        f"roll / raw ≤ {ROLL_RATIO_TARGET}×",
        "memory MiB",
        "floor MiB",
        "memory / floor",
        "memory ≤ 1.1× floor",
    ]
    target = Table(
        ["target", "measured", "met"],
        [
            [
                "roll < 1 s at 40 tables",
                f"{r['roll']:.3f} s",
                "yes" if r["roll"] < 1 else "**no**",
            ]
            for r in results
            if r["tables"] == 40
        ],
    )
    setup = Table(
        ["setup", ""],
        [
            ["sketch", f"{width} × 5, two labels"],
            ["retention", f"{RETENTION} windows (a timed roll adds one window, subtracts one)"],
            ["hot windows", args.hot_windows],
            [
                "ahead of each roll (the worker's follow-up of the roll before)",
                "laplace ε = 1 noise for the next window"
                + ("; the aggregate the roll serves" if args.hot_windows >= 2 else ""),
            ],
            ["timed rolls per size", rolls],
            ["rolls with a client ingesting and featurizing, per size", STALL_ROLLS],
        ],
    )
    parts: list[Table | Plot] = [setup, Table(header, rows), target, blocking, plot(results, width)]
    command = (
        "selectivity bench roll"
        + (" --quick" if args.quick else "")
        + (f" --hot-windows {args.hot_windows}" if args.hot_windows != 2 else "")
    )
    write_section(
        "Roll time and memory per window", parts, command=command, write=not args.no_report
    )

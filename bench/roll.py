"""Roll time as tables grow, and Redis memory per window against the cells × 4 bytes floor.

`selectivity bench roll [--quick]`: for 10, 40 and 100 tables (default sketch 16384 × 5, two
labels), a stream in an embedded Redis (``bench.harness``) is rolled past its retention so that
every roll adds the entering window and subtracts the leaving one; the next window is prepared
(noise) ahead of each timed roll, as the worker does. Baselines measured in the same run:
reading and writing the same bytes raw (one window's tables GET + SET), the I/O floor of an
aggregate update. Memory: `MEMORY USAGE` of one window's table keys against cells × 4 bytes.
Targets: a roll under 1 s at 40 tables; memory at most 1.1× the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from bench.harness import InProcess
from bench.report import Plot, Table, append_section, plot_path, pyplot
from service.context import AppContext
from service.ingest import service as ingest
from service.ingest.schemas import IngestIn
from service.lifecycle import roll as lifecycle_roll
from service.lifecycle import streams as lifecycle_streams
from service.streams import service as streams
from service.streams.schemas import StreamCreate
from service.windows import service as windows

RETENTION = 4
SIZES = (10, 40, 100)


async def one(ctx: AppContext, n_tables: int, rolls: int, width: int) -> dict[str, float]:
    name = f"roll{n_tables}"
    body = StreamCreate.model_validate(
        {
            "name": name,
            "features": [{"name": f"f{i}"} for i in range(n_tables - 1)],
            "labels": ["0", "1"],
            "hot_windows": 1,
            "retention_windows": RETENTION,
            "sketch": {"width": width, "depth": 5},
            "max_tables": n_tables,
            "privacy": {"mechanism": "laplace", "epsilon": 1.0},
        }
    )
    async with ctx.sessionmaker() as session, session.begin():
        await lifecycle_streams.create(ctx=ctx, session=session, stream_in=body)
    rows = IngestIn.model_validate(
        {
            "observations": [
                {
                    "features": {f"f{i}": str(j * 31 + i) for i in range(n_tables - 1)},
                    "label": str(j % 2),
                }
                for j in range(200)
            ]
        }
    )
    times: list[float] = []
    for k in range(RETENTION + 1 + rolls):
        await ingest.ingest(ctx=ctx, name=name, body=rows, idempotency_key=None)
        await windows.prepare_next(ctx=ctx, name=name)  # ahead of time, as the worker does
        t = time.perf_counter()
        await lifecycle_roll.roll(ctx=ctx, name=name)
        dt = time.perf_counter() - t
        if k > RETENTION:  # steady state: a window enters and one leaves
            times.append(dt)
        print(f"  {n_tables} tables: roll {k + 1} took {dt:.3f} s", flush=True)
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
    return {
        "tables": n_tables,
        "roll": statistics.median(times),
        "raw": raw,
        "memory": used,
        "floor": floor,
    }


async def run(sizes: tuple[int, ...], rolls: int, width: int) -> list[dict[str, float]]:
    async with InProcess() as svc:
        return [await one(svc.ctx, n, rolls, width) for n in sizes]


def plot(results: list[dict[str, float]], width: int) -> Plot:
    plt = pyplot()
    sizes = [int(r["tables"]) for r in results]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(sizes, [r["roll"] for r in results], "o-", label="roll (median)")
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
    args = p.parse_args(argv)
    rolls, width = (2, 4096) if args.quick else (5, 16384)
    results = asyncio.run(run(SIZES, rolls, width))
    rows = [
        [
            int(r["tables"]),
            r["roll"],
            r["raw"],
            r["roll"] / r["raw"],
            r["memory"] / 2**20,
            r["floor"] / 2**20,
            r["memory"] / r["floor"],
            "yes" if r["memory"] / r["floor"] <= 1.1 else "**no**",
        ]
        for r in results
    ]
    header = [
        "tables",
        "roll s (median)",
        "raw GET+SET s",
        "roll / raw",
        "memory MiB",
        "floor MiB",
        "memory / floor",
        "memory ≤ 1.1× floor",
    ]
    roll40 = next(r for r in results if r["tables"] == 40)
    target = Table(
        ["target", "measured", "met"],
        [
            [
                "roll < 1 s at 40 tables",
                f"{roll40['roll']:.3f} s",
                "yes" if roll40["roll"] < 1 else "**no**",
            ]
        ],
    )
    setup = Table(
        ["setup", ""],
        [
            ["sketch", f"{width} × 5, two labels"],
            ["retention", f"{RETENTION} windows (a timed roll adds one window, subtracts one)"],
            ["noise", "laplace ε = 1, prepared ahead of each roll"],
            ["timed rolls per size", rolls],
        ],
    )
    append_section(
        "Roll time and memory per window",
        [setup, Table(header, rows), target, plot(results, width)],
        command="selectivity bench roll" + (" --quick" if args.quick else ""),
    )

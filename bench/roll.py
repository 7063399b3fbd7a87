"""Roll time as tables grow, and Redis memory per window against the cells × 4 bytes floor.

`selectivity bench roll [--quick]`: for 10, 40 and 100 tables (default sketch 16384 × 5, two
labels), a stream in an embedded Redis is rolled past its retention so that every roll adds the
entering window and subtracts the leaving one; the next window is prepared (noise) ahead of
each timed roll, as the worker does. Baselines measured in the same run: reading and writing
the same bytes raw (one window's tables GET + SET), the I/O floor of an aggregate update. Memory:
`MEMORY USAGE` of one window's table keys against cells × 4 bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench.report import append_section, markdown_table, plot_path  # noqa: E402
from service import resources  # noqa: E402
from service.config import Settings  # noqa: E402
from service.db.migrate import upgrade  # noqa: E402
from service.ingest import service as ingest  # noqa: E402
from service.ingest.schemas import IngestIn  # noqa: E402
from service.streams import service as streams  # noqa: E402
from service.streams.schemas import StreamCreate  # noqa: E402
from service.windows import service as windows  # noqa: E402

RETENTION = 4


async def one(ctx, n_tables: int, rolls: int, width: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
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
        await streams.create(ctx=ctx, session=session, stream_in=body)
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
        await windows.roll(ctx=ctx, name=name)
        dt = time.perf_counter() - t
        if k > RETENTION:  # steady state: a window enters and one leaves
            times.append(dt)
        print(f"  {n_tables} tables: roll {k + 1} took {dt:.3f} s", flush=True)
    rt = await streams.runtime(ctx=ctx, name=name)
    epoch = await windows.store_of(ctx).epoch(name)
    assert epoch is not None
    w = epoch - 1
    keys = [ctx.keys.table(name, w, t.id) for t in rt.tables] + [ctx.keys.prior(name, w)]
    # raw I/O floor: one window's tables read and written back
    t = time.perf_counter()
    blobs = await ctx.redis.mget(keys)
    pipe = ctx.redis.pipeline(transaction=False)
    for key, blob in zip(keys, blobs, strict=True):
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


async def run(sizes: list[int], rolls: int, width: int) -> list[dict[str, float]]:
    tmp = Path(tempfile.mkdtemp(prefix="selectivity-bench-"))
    settings = Settings(data_dir=tmp, embedded_worker=False)
    upgrade(settings.resolved_database_url)
    embedded = resources.EmbeddedRedis(settings)
    ctx = await resources.build(settings, embedded=embedded)
    ctx.executor = None
    try:
        return [await one(ctx, n, rolls, width) for n in sizes]
    finally:
        await resources.close(ctx)
        embedded.close()


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="selectivity bench roll", description=__doc__)
    p.add_argument("--quick", action="store_true", help="fewer rolls, narrower sketch")
    args = p.parse_args(argv)
    sizes = [10, 40, 100]
    rolls, width = (2, 4096) if args.quick else (5, 16384)
    results = asyncio.run(run(sizes, rolls, width))
    rows = [
        [
            int(r["tables"]),
            r["roll"],
            r["raw"],
            r["roll"] / r["raw"],
            r["memory"] / 2**20,
            r["floor"] / 2**20,
            r["memory"] / r["floor"],
        ]
        for r in results
    ]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(sizes, [r["roll"] for r in results], "o-", label="roll (median)")
    a.plot(sizes, [r["raw"] for r in results], "s--", label="raw GET+SET of one window")
    a.axhline(1.0, color="grey", lw=0.8, ls=":", label="1 s target at 40 tables")
    a.set_xlabel("tables")
    a.set_ylabel("seconds")
    a.set_title(f"Roll time (sketch {width}×5, 2 labels)")
    a.legend()
    b.bar([f"{s} tables" for s in sizes], [r["memory"] / r["floor"] for r in results])
    b.axhline(1.1, color="red", lw=0.8, ls="--", label="1.1× target")
    b.set_ylim(0.9, max(1.2, max(r["memory"] / r["floor"] for r in results) + 0.05))
    b.set_xlabel("tables")
    b.set_ylabel("Redis memory / (cells × 4 B)")
    b.set_title("Memory per window")
    b.legend()
    fig.tight_layout()
    png = plot_path("roll")
    fig.savefig(png, dpi=110)
    roll40 = next(r for r in results if r["tables"] == 40)
    worst = max(r["memory"] / r["floor"] for r in results)
    body = markdown_table(
        [
            "tables",
            "roll s (median)",
            "raw GET+SET s",
            "roll / raw",
            "memory MiB",
            "floor MiB",
            "memory / floor",
        ],
        rows,
    )
    body += (
        f"\n\nSketch {width} × 5, two labels, retention {RETENTION} windows (every timed "
        f"roll adds one window to the aggregate and subtracts one), laplace noise prepared "
        f"ahead of each roll as the worker does. Targets: roll < 1 s at 40 tables: "
        f"{'met' if roll40['roll'] < 1 else 'NOT met'} ({roll40['roll']:.3f} s); memory ≤ "
        f"1.1× the floor: {'met' if worst <= 1.1 else 'NOT met'} (worst {worst:.3f}×).\n\n"
        f"![roll](bench/plots/{png.name})"
    )
    append_section(
        "Roll time and memory per window",
        body,
        command="selectivity bench roll" + (" --quick" if args.quick else ""),
    )

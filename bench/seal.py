"""Sealing throughput against ingest throughput, measured in the same run.

`selectivity bench seal [--rows N] [--repeats K]`: the synthetic click log (26 categorical and
13 numeric features, `service/cli/synthetic.py`) is ingested through the service's ingest path in
process (batches of 1000, embedded Redis with AOF on, SQLite) and counted into the tables (the
counting job's work, timed with it: ingest is done when its rows are counted); then the window
is rolled and the `seal` job moves it into the cold store (HPKE X25519/HKDF-SHA256/AES-256-GCM,
zlib, 5000 entries per segment, atomic writes with fsync, index rows, read-back verification,
expire). Both are medians over repeats of observations per second; MB/s counts the raw rows
sealed (the plaintext) and the segment bytes written. Sealing keeps up with ingest when the
ratio is ≥ 1.
In-process ingest is faster than HTTP ingest, so the comparison is the conservative one.
Also timed: opening the segments again with the reconstructed key (what an export does).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from rich.progress import Progress
from sqlalchemy import select

from bench.harness import InProcess
from bench.report import Plot, Table, plot_path, pyplot, write_section
from service.cli.synthetic import ClickLog, generate, stream_body
from service.coldstore import crypto
from service.coldstore import service as coldstore
from service.counting import service as counting
from service.db.models import ColdSegment, ColdStoreKey, Stream
from service.ingest import service as ingest
from service.ingest.schemas import IngestIn
from service.lifecycle import roll as lifecycle_roll
from service.lifecycle import streams as lifecycle_streams
from service.streams import service as streams
from service.streams.schemas import StreamCreate

BATCH = 1000


async def one(
    svc: InProcess, k: int, log: ClickLog, shares: list[str], progress: Progress
) -> dict[str, float]:
    ctx = svc.ctx
    name = f"seal{k}"
    body = stream_body(name)
    body["hot_windows"] = 1
    await lifecycle_streams.create(ctx=ctx, stream_in=StreamCreate.model_validate(body))
    batches = [
        IngestIn.model_validate({"observations": log.observations(i, i + BATCH)})
        for i in range(0, len(log), BATCH)
    ]
    task = progress.add_task(f"run {k + 1}: ingest", total=len(batches))
    t = time.perf_counter()
    for b in batches:
        await ingest.ingest(ctx=ctx, name=name, body=b, idempotency_key=None)
        progress.advance(task)
    # ingest is done when the rows are counted too (the worker's counting job)
    rt = await streams.runtime(ctx=ctx, name=name)
    assert await counting.count_window(ctx=ctx, rt=rt, window=1) == len(log)
    t_ingest = time.perf_counter() - t
    await lifecycle_roll.roll(ctx=ctx, name=name)
    await lifecycle_roll.roll(ctx=ctx, name=name)  # window 1 leaves the hot period
    # the rolls' follow-ups (selection round, reference model) are not sealing's cost
    await svc.settle(name)
    raw_bytes = 0
    for _eid, fields in await ctx.stores.windows.hot_range(name, 1, "-", "+", len(log)):
        raw_bytes += len(fields[b"d"])
    progress.update(task, description=f"run {k + 1}: seal")
    t = time.perf_counter()
    stats = await coldstore.seal_stream(ctx=ctx, name=name)
    t_seal = time.perf_counter() - t
    assert stats.entries == len(log) and stats.windows_sealed >= 1, stats
    assert await ctx.stores.windows.hot_length(name, 1) == 0  # expired after verification
    async with ctx.sessionmaker() as session:
        sid = await session.scalar(select(Stream.id).where(Stream.name == name))
        segs = list(await session.scalars(select(ColdSegment).where(ColdSegment.stream_id == sid)))
        key = await coldstore.active_key(session)
        assert isinstance(key, ColdStoreKey)
    sk = crypto.combine(shares[:2], public_key=key.public_key, tag=key.verification_tag)
    t = time.perf_counter()
    opened = 0
    for s in segs:
        opened += len(crypto.open_segment(Path(s.path).read_bytes(), sk)[1])
    t_open = time.perf_counter() - t
    assert opened == len(log)
    progress.remove_task(task)
    return {
        "ingest": len(log) / t_ingest,
        "seal": len(log) / t_seal,
        "open": len(log) / t_open,
        "raw_mb_s": raw_bytes / t_seal / 1e6,
        "written_mb_s": stats.bytes / t_seal / 1e6,
        "ratio": t_ingest / t_seal,
        "compression": raw_bytes / stats.bytes,
        "segments": stats.segments,
    }


async def run(rows: int, repeats: int) -> list[dict[str, float]]:
    async with InProcess() as svc:
        shares = svc.cold_shares
        log = generate(rows, seed=7)
        with Progress() as progress:
            return [await one(svc, k, log, shares, progress) for k in range(repeats)]


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="selectivity bench seal", description=__doc__)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--no-report", action="store_true", help="print the section instead of writing it"
    )
    args = p.parse_args(argv)
    results = asyncio.run(run(args.rows, args.repeats))

    def med(k: str) -> float:
        return statistics.median(r[k] for r in results)

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = ["ingest (in process)", "seal", "open (export)"]
    vals = [med("ingest"), med("seal"), med("open")]
    ax.bar(labels, vals, color=["#888", "#2a7", "#27a"])
    ax.set_ylabel("observations / s (median)")
    ax.set_title(f"Sealing vs ingest, {args.rows:,} rows × {args.repeats}")
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom")
    fig.tight_layout()
    png = plot_path("seal")
    fig.savefig(png, dpi=110)
    plt.close(fig)

    def runs(key: str, fmt: str) -> str:
        return ", ".join(fmt.format(r[key]) for r in results)

    rows: list[list[Any]] = [
        ["ingest, observations/s", f"{med('ingest'):,.0f}", runs("ingest", "{:,.0f}")],
        ["seal, observations/s", f"{med('seal'):,.0f}", runs("seal", "{:,.0f}")],
        ["seal / ingest", f"{med('ratio'):.2f}×", runs("ratio", "{:.2f}")],
        ["sealing keeps up with ingest (≥ 1×)", "yes" if med("ratio") >= 1 else "**no**", ""],
        ["seal, MB/s of raw rows in", f"{med('raw_mb_s'):.1f}", ""],
        ["seal, MB/s of segments written", f"{med('written_mb_s'):.1f}", ""],
        ["compression (raw / sealed bytes)", f"{med('compression'):.2f}×", ""],
        ["open (decrypt + decompress), observations/s", f"{med('open'):,.0f}", ""],
        ["rows of the synthetic click log per run", f"{args.rows:,}", ""],
        ["segments of ≤ 5000 entries", int(results[0]["segments"]), ""],
    ]
    write_section(
        "Cold-store sealing vs ingest",
        [Table(["measure", "median", "runs"], rows), Plot("seal", png)],
        command=f"selectivity bench seal --rows {args.rows} --repeats {args.repeats}",
        write=not args.no_report,
    )

"""``selectivity bench scale``: throughput against the number of API processes and workers.

For each Redis (a standalone redis-server, and the three-master Redis Cluster the test suite
starts, ``tests/test_redis_cluster.py``; AOF on in both, RDB off) and a fresh SQL database (a new
PostgreSQL schema with ``--database-url``, else SQLite), N ``selectivity serve`` processes on
their own ports and M ``selectivity worker`` processes (N, M in {1, 2}) are started as production
starts them, and a load generator of ``--clients`` further processes (one connection each,
requests round-robin over the API processes) measures:

1. **counted ingest**: ``--rows`` rows of the synthetic click log (39 features, batches of
   ``--batch``) into S streams (S in ``--streams``, client c to stream c mod S; the same
   streams in every run, so that the counting job has as many streams to look at in each),
   from the common start until the worker's counting job has counted the last of them (every
   stream's window checkpoint reaches its hot stream's last entry): rows/s accepted, and
   rows/s accepted **and counted** (the sustained rate).
2. **featurize**: single-row ``POST /featurize`` requests one after another from each client
   for ``--seconds``, on a stream rolled once before (its aggregate served): requests/s and
   latency.

Each (N, M) is started afresh for every repeat, the configurations in a rotated order per
repeat, so that a drift of the machine's load spreads over all; figures are medians over
``--repeats``, and each ratio is to the 1 API / 1 worker configuration on the same Redis
(median of the per-repeat ratios). The CPU seconds of every process tree (API, worker, each
Redis node, clients) are read around each measurement: CPU per row or request, and each
role's share of the machine, say where the time goes.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench import report
from bench.report import Plot, Table
from bench.scale.deploy import (
    KINDS,
    Backend,
    Processes,
    TreeCpu,
    backend,
    create_stream,
    wait_counted,
)
from bench.scale.load import job_featurize, job_ingest, warm
from bench.scale.report import Run, plot, render
from bench.speed.load import log_of
from bench.speed.server import api, request, wait_served
from service.jobs import queue_name

CONFIGS = ((1, 1), (2, 1), (1, 2), (2, 2))  # (API processes, workers)
SEED = 5
Say = Callable[[str], None]


@dataclass(frozen=True)
class Options:
    rows: int  # rows per counted-ingest run
    batch: int
    streams: tuple[int, ...]
    clients: int
    seconds: float  # featurize run length
    repeats: int
    kinds: tuple[str, ...]
    database_url: str | None
    bound: float  # longest wait for counting to catch up
    report: bool
    quick: bool = False
    json: Path | None = None

    @property
    def command(self) -> str:
        db = " --database-url URL" if self.database_url else ""
        return (
            f"selectivity bench scale --rows {self.rows} --streams "
            f"{','.join(map(str, self.streams))} --clients {self.clients} --seconds "
            f"{self.seconds:g} --repeats {self.repeats} --redis {','.join(self.kinds)}{db}"
        )


def parse(argv: list[str]) -> Options:
    assert __doc__ is not None
    p = argparse.ArgumentParser(prog="selectivity bench scale", description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=None, help="rows per ingest run (40,000)")
    p.add_argument("--batch", type=int, default=1000, help="ingest batch size (1000)")
    p.add_argument("--streams", default="1,4", help="stream counts (1,4)")
    p.add_argument("--clients", type=int, default=4, help="load-generator processes (4)")
    p.add_argument("--seconds", type=float, default=None, help="featurize run length (5)")
    p.add_argument("--repeats", type=int, default=None, help="repeats (3)")
    p.add_argument("--redis", default=",".join(KINDS), help="standalone,cluster (both)")
    p.add_argument(
        "--database-url",
        default=None,
        help="PostgreSQL to make a fresh schema in (dropped at the end); default SQLite",
    )
    p.add_argument("--max-seconds", type=float, default=300.0, help="bound of a counting wait")
    p.add_argument("--quick", action="store_true", help="small sizes, one repeat (a smoke run)")
    p.add_argument("--no-report", action="store_true", help="print, do not append to BENCHMARKS.md")
    p.add_argument("--json", type=Path, help="also write the raw runs as JSON to this file")
    a = p.parse_args(argv)
    kinds = tuple(k for k in a.redis.split(",") if k)
    if not kinds or any(k not in KINDS for k in kinds):
        p.error(f"--redis: a comma-separated subset of {','.join(KINDS)}, got {a.redis!r}")
    streams = tuple(int(s) for s in a.streams.split(",") if s)
    if not streams or min(streams) < 1 or a.clients < 1 or a.batch < 1:
        p.error("--streams, --clients and --batch must be ≥ 1")
    q = a.quick
    return Options(
        rows=a.rows or (4000 if q else 40_000),
        batch=a.batch,
        streams=streams,
        clients=a.clients,
        seconds=a.seconds or (1.5 if q else 5.0),
        repeats=a.repeats or (1 if q else 3),
        kinds=kinds,
        database_url=a.database_url,
        bound=a.max_seconds,
        report=not a.no_report,
        quick=q,
        json=a.json,
    )


def quiet(be: Backend, bound: float) -> None:
    """Wait until the job queue holds no job but the crons (the roll's follow-ups done): the
    workers are then as idle as they get (the counting job lingers, polling every open
    window, by design)."""
    q = f"saq:{queue_name(be.keys)}"
    deadline = time.monotonic() + bound
    r = be.client()
    try:
        while time.monotonic() < deadline:
            ids = r.lrange(f"{q}:active", 0, -1) + r.lrange(f"{q}:queued", 0, -1)
            if all(b":cron:" in i for i in ids):
                time.sleep(0.5)
                return
            time.sleep(0.2)
    finally:
        r.close()
    raise RuntimeError(f"the workers' jobs were still running after {bound:.0f} s")


class Bench:
    """One Redis kind: its backend, the load generator's pool, the keys and the served
    stream, shared by every (N, M) started on it."""

    def __init__(self, opt: Options, be: Backend, root: Path) -> None:
        self.opt, self.be, self.root = opt, be, root
        self.n_log = max(opt.rows, 10_000)
        ctx = multiprocessing.get_context("spawn")
        self.pool = concurrent.futures.ProcessPoolExecutor(opt.clients, mp_context=ctx)
        for f in [self.pool.submit(warm, self.n_log, SEED, 1.0) for _ in range(opt.clients)]:
            f.result()
        self.redis_meters = [TreeCpu(p) for p in be.redis_pids()]
        self.producer = self.model = ""
        # The same streams for every run (a fresh set per run would leave the counting job
        # more streams to poll at each run)
        self.streams: set[str] = set()

    def redis_cpu(self) -> list[float]:
        return [m() for m in self.redis_meters]

    def cpu(self, ps: Processes) -> dict[str, list[float]]:
        return ps.cpu() | {"redis": self.redis_cpu()}

    def setup(self) -> None:
        """Keys, and the featurize stream: filled, counted and rolled once (its aggregate
        served), by 1 API and 1 worker of their own, stopped once the roll's follow-ups (the
        next window's noise, the selection round) are done and the worker is idle again."""
        ps = Processes(self.be, 1, 1, self.root / "logs" / "setup")
        try:
            self._setup(ps)
            quiet(self.be, self.opt.bound)
        finally:
            ps.close()

    def _setup(self, ps: Processes) -> None:
        port, admin = ps.ports[0], self.be.admin
        self.producer = api(port, "POST", "/v1/admin/keys", admin, {"role": "producer"})["key"]
        self.model = api(port, "POST", "/v1/admin/keys", admin, {"role": "model"})["key"]
        create_stream(self.be, port, "feat")
        log = log_of(self.n_log, SEED)
        for s in range(0, 5000, 1000):
            api(
                port,
                "POST",
                "/v1/streams/feat/observations",
                self.producer,
                {"observations": log.observations(s, s + 1000)},
            )
        wait_counted(self.be, ["feat"], self.opt.bound)
        api(port, "POST", "/v1/streams/feat/roll", admin)
        wait_served(port, self.model, "feat")

    def ingest(self, ps: Processes, n_streams: int) -> dict[str, Any]:
        opt, be = self.opt, self.be
        names = [f"s{n_streams}x{j}" for j in range(n_streams)]
        log = log_of(self.n_log, SEED)
        for name in names:  # created once, and each API process and the worker warmed on it
            if name not in self.streams:
                create_stream(be, ps.ports[0], name)
                self.streams.add(name)
            for port in ps.ports:
                api(
                    port,
                    "POST",
                    f"/v1/streams/{name}/observations",
                    self.producer,
                    {"observations": log.observations(0, 10)},
                )
        wait_counted(be, names, opt.bound)
        quiet(be, opt.bound)
        per = opt.rows // opt.clients
        start_at = time.time() + 1.0
        futures = [
            self.pool.submit(
                job_ingest,
                ps.ports,
                self.producer,
                names[c % n_streams],
                self.n_log,
                SEED,
                c * per,
                (c + 1) * per,
                opt.batch,
                c,
                start_at,
            )
            for c in range(opt.clients)
        ]
        time.sleep(max(0.0, start_at - time.time()))
        c0 = self.cpu(ps)  # from the common start
        out = [f.result() for f in futures]
        t_counted = wait_counted(be, names, opt.bound)
        c1 = self.cpu(ps)
        t0 = min(o["start"] for o in out)
        t_accepted = max(o["end"] for o in out)
        return {
            "rows": sum(o["rows"] for o in out),
            "accepted_s": t_accepted - t0,
            "counted_s": t_counted - t0,
            "client_cpu": sum(o["client_cpu"] for o in out),
            "cpu": {k: [b - a for a, b in zip(c0[k], c1[k], strict=True)] for k in c0},
        }

    def featurize(self, ps: Processes) -> dict[str, Any]:
        body = orjson.dumps({"rows": log_of(self.n_log, SEED).rows(0, 1)})
        for port in ps.ports:  # each API process loads the served aggregate first
            for _ in range(20):
                status, data = request(port, "POST", "/v1/streams/feat/featurize", body, self.model)
                if status != 200:
                    raise RuntimeError(f"featurize warm-up: {status} {data[:300]!r}")
        quiet(self.be, self.opt.bound)
        start_at = time.time() + 1.0
        futures = [
            self.pool.submit(
                job_featurize,
                ps.ports,
                self.model,
                "feat",
                self.n_log,
                SEED,
                c,
                start_at,
                self.opt.seconds,
            )
            for c in range(self.opt.clients)
        ]
        time.sleep(max(0.0, start_at - time.time()))
        c0 = self.cpu(ps)  # from the common start
        out = [f.result() for f in futures]
        c1 = self.cpu(ps)
        lat = sorted(x for o in out for x in o["latencies"])
        wall = max(o["end"] for o in out) - min(o["start"] for o in out)
        return {
            "requests": sum(o["requests"] for o in out),
            "seconds": wall,
            "p50": lat[len(lat) // 2],
            "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
            "client_cpu": sum(o["client_cpu"] for o in out),
            "cpu": {k: [b - a for a, b in zip(c0[k], c1[k], strict=True)] for k in c0},
        }

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def run_kind(opt: Options, kind: str, root: Path, say: Say) -> list[Run]:
    runs: list[Run] = []
    say(f"{kind}: starting Redis and the database ({root})")
    with backend(kind, root, opt.database_url) as be:
        bench = Bench(opt, be, root)
        try:
            say(f"{kind}: keys and the featurize stream (filled, rolled)")
            bench.setup()
            for rep in range(opt.repeats):
                k = rep % len(CONFIGS)
                for n_api, n_worker in CONFIGS[k:] + CONFIGS[:k]:
                    ps = Processes(be, n_api, n_worker, root / "logs" / f"{n_api}-{n_worker}")
                    try:
                        load = os.getloadavg()[0]
                        for s in opt.streams:
                            r = bench.ingest(ps, s)
                            runs.append(Run(kind, n_api, n_worker, rep, "ingest", s, r, load))
                            say(
                                f"{kind} {n_api} API {n_worker} worker, {s} stream(s), repeat "
                                f"{rep + 1}: {r['rows'] / r['accepted_s']:,.0f} rows/s accepted,"
                                f" {r['rows'] / r['counted_s']:,.0f} rows/s counted"
                            )
                        f = bench.featurize(ps)
                        runs.append(Run(kind, n_api, n_worker, rep, "featurize", 0, f, load))
                        say(
                            f"{kind} {n_api} API {n_worker} worker, repeat {rep + 1}: featurize "
                            f"{f['requests'] / f['seconds']:,.0f} req/s, p50 "
                            f"{1e3 * f['p50']:.1f} ms"
                        )
                    finally:
                        ps.close()
        finally:
            bench.close()
    return runs


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    opt = parse(argv)
    # SIGTERM stops the run through its cleanup (processes, Redis, the schema)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    say = report.Clock()
    say(f"scale benchmark: {opt}")
    tmp = Path(tempfile.mkdtemp(prefix="selectivity-scale-"))
    runs: list[Run] = []
    try:
        for kind in opt.kinds:
            runs += run_kind(opt, kind, tmp / kind, say)
    except BaseException:
        say(f"failed: the processes' logs are kept in {tmp}")
        raise
    shutil.rmtree(tmp, ignore_errors=True)
    if opt.json:
        opt.json.write_text(orjson.dumps([r.asdict() for r in runs]).decode())
    parts: list[Table | Plot] = [*render(runs), plot(runs, tag="_quick" if opt.quick else "")]
    if opt.report:
        report.write_section("Scale: API processes and workers", parts, command=opt.command)
    else:
        print(report.section("Scale: API processes and workers", parts, command=opt.command))
    say(f"median load average during the runs: {statistics.median(r.load for r in runs):.1f}")

"""``selectivity bench scale``: one hot stream's counted ingest across worker processes,
partitions and Redis masters.

For each Redis (a standalone redis-server, and the three-master Redis Cluster the test suite
starts, ``tests/test_redis_cluster.py``; AOF on in both, RDB off) and a fresh SQL database (a new
PostgreSQL schema with ``--database-url``, else SQLite), ``--apis`` ``selectivity serve``
processes on their own ports and W ``selectivity worker`` processes (W in ``--workers``) are
started as production starts them, and a load generator of further processes (one connection
each, requests round-robin over the API processes) measures, in each repeat:

1. **counted ingest of one stream**: ``--rows`` rows of the synthetic click log (39 features,
   batches of ``--batch``) from ``--clients`` processes into ONE stream of P partitions (P in
   ``--partitions``; the same stream of each P in every run), from the common start until the
   counting jobs have counted the last row of every partition (each partition's checkpoint
   reaches its hot stream's last entry): rows/s accepted, and rows/s accepted **and counted**;
2. **the baseline, pipelined XADD**: the same rows as the service stores them (the hot
   stream's JSON entries), XADDed straight into one stream key by one redis-py client,
   pipelined ``--batch`` at a time, no service (run before the repeat's processes start);
3. **featurize**: single-row ``POST /featurize`` requests one after another from each of C
   concurrent clients (C in ``--concurrency``) for ``--seconds``, on a stream rolled once
   before (its aggregate served): requests/s, p50 and p99 latency.

The CPU seconds of every process tree (each API process, each worker, each Redis node, the
clients) are read around each measurement: CPU per row by role. The ratios, each within one
run: counted ingest per worker core (rows/s ÷ (worker CPU s / wall s)) ÷ pipelined XADD per
Redis core (XADD rows/s ÷ (Redis CPU s / wall s)), with the XADD of the same repeat; and W
workers ÷ 1 worker (counted rows/s, same repeat, Redis and P). The worker counts run in a
rotated order per repeat (a drift of the machine's load spreads over all); figures are medians
over ``--repeats``. From the CPU per row with one worker and each partition's share of the rows,
the report projects the counted rate on N cores (Amdahl: the counting of the largest partition
is the serial part, and one Redis process can use one core at most).
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
from collections.abc import Callable, Sequence
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
    part_rows,
    wait_counted,
)
from bench.scale.load import job_featurize, job_ingest, job_xadd, warm
from bench.scale.report import TITLE, Run, plot, render
from bench.speed.load import log_of
from bench.speed.server import api, request, wait_served
from service.jobs import queue_name

SEED = 5
Say = Callable[[str], None]


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _joined(xs: tuple[object, ...]) -> str:
    return ",".join(map(str, xs))


@dataclass(frozen=True)
class Options:
    rows: int  # rows per counted-ingest run (and per XADD run)
    batch: int
    workers: tuple[int, ...]
    partitions: tuple[int, ...]
    apis: int
    clients: int  # ingest load-generator processes
    concurrency: tuple[int, ...]  # featurize clients at once
    seconds: float  # featurize run length
    repeats: int
    kinds: tuple[str, ...]
    database_url: str | None
    bound: float  # longest wait for counting to catch up
    report: bool
    quick: bool = False
    json: Path | None = None
    from_json: tuple[Path, ...] = ()

    @property
    def command(self) -> str:
        db = " --database-url URL" if self.database_url else ""
        j = _joined
        return (
            f"selectivity bench scale --rows {self.rows} --workers {j(self.workers)} "
            f"--partitions {j(self.partitions)} --apis {self.apis} --clients {self.clients} "
            f"--concurrency {j(self.concurrency)} --seconds {self.seconds:g} --repeats "
            f"{self.repeats} --redis {j(self.kinds)}{db}"
        )


def parse(argv: list[str]) -> Options:
    assert __doc__ is not None
    p = argparse.ArgumentParser(
        prog="selectivity bench scale",
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rows", type=int, default=None, help="rows per ingest run (40,000)")
    p.add_argument("--batch", type=int, default=1000, help="ingest and XADD batch size (1000)")
    p.add_argument("--workers", default="1,2,4", help="worker process counts (1,2,4)")
    p.add_argument("--partitions", default="1,4", help="partitions of the stream (1,4)")
    p.add_argument("--apis", type=int, default=2, help="API processes (2)")
    p.add_argument("--clients", type=int, default=4, help="ingest load-generator processes (4)")
    p.add_argument("--concurrency", default="1,8", help="featurize clients at once (1,8)")
    p.add_argument("--seconds", type=float, default=None, help="featurize run length (4)")
    p.add_argument("--repeats", type=int, default=None, help="repeats (2)")
    p.add_argument("--redis", default=",".join(KINDS), help="standalone,cluster (both)")
    p.add_argument(
        "--database-url",
        default=None,
        help="PostgreSQL to make a fresh schema in (dropped at the end); default SQLite",
    )
    p.add_argument("--max-seconds", type=float, default=300.0, help="bound of a counting wait")
    p.add_argument("--quick", action="store_true", help="small sizes, one repeat (a smoke run)")
    p.add_argument("--no-report", action="store_true", help="print, do not write BENCHMARKS.md")
    p.add_argument("--json", type=Path, help="also write the raw runs as JSON to this file")
    p.add_argument(
        "--from-json",
        type=Path,
        action="append",
        help="measure nothing: the report of the runs --json files hold (repeated: their "
        "repeats together, numbered on; with the first file's command)",
    )
    a = p.parse_args(argv)
    kinds = tuple(k for k in a.redis.split(",") if k)
    if not kinds or any(k not in KINDS for k in kinds):
        p.error(f"--redis: a comma-separated subset of {','.join(KINDS)}, got {a.redis!r}")
    try:
        workers, partitions, conc = _ints(a.workers), _ints(a.partitions), _ints(a.concurrency)
    except ValueError:
        p.error("--workers, --partitions and --concurrency: comma-separated integers")
    if not workers or min(workers) < 1 or 1 not in workers:
        p.error("--workers: counts ≥ 1, 1 among them (the ratios' base)")
    if not partitions or min(partitions) < 1:
        p.error("--partitions: counts ≥ 1 (the service bounds them too)")
    if not conc or min(conc) < 1 or min(a.apis, a.clients, a.batch) < 1:
        p.error("--concurrency, --apis, --clients and --batch must be ≥ 1")
    q = a.quick
    return Options(
        rows=a.rows or (3000 if q else 40_000),
        batch=a.batch,
        workers=tuple(sorted(set(workers))),
        partitions=tuple(sorted(set(partitions))),
        apis=a.apis,
        clients=a.clients,
        concurrency=tuple(sorted(set(conc))),
        seconds=a.seconds or (1.0 if q else 4.0),
        repeats=a.repeats or (1 if q else 2),
        kinds=kinds,
        database_url=a.database_url,
        bound=a.max_seconds,
        report=not a.no_report,
        quick=q,
        json=a.json,
        from_json=tuple(a.from_json or ()),
    )


Pool = concurrent.futures.ProcessPoolExecutor


def feat_rows(opt: Options) -> int:
    """Rows of the featurize stream, from the log too (fewer in a quick run)."""
    return 1000 if opt.quick else 5000


def n_log(opt: Options) -> int:
    return max(opt.rows, 2 * feat_rows(opt), 2 * opt.batch)


def load_pool(opt: Options) -> Pool:
    """The load generator: a spawn pool of as many processes as clients at once, each with the
    click log built (shared by every Redis kind)."""
    n = max(opt.clients, *opt.concurrency)
    pool = Pool(n, mp_context=multiprocessing.get_context("spawn"))
    for f in [pool.submit(warm, n_log(opt), SEED, 0.5) for _ in range(n)]:
        f.result()
    return pool


def quiet(be: Backend, bound: float) -> None:
    """Wait until the job queue holds no job but the crons (the roll's follow-ups and the
    counting jobs done): the workers are then as idle as they get."""
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


def _delta(c0: dict[str, list[float]], c1: dict[str, list[float]]) -> dict[str, list[float]]:
    return {k: [b - a for a, b in zip(c0[k], c1[k], strict=True)] for k in c0}


class Bench:
    """One Redis kind: its backend, the load generator's pool, the keys and the streams,
    shared by every worker count started on it."""

    def __init__(self, opt: Options, be: Backend, root: Path, pool: Pool) -> None:
        self.opt, self.be, self.root, self.pool = opt, be, root, pool
        self.n_log = n_log(opt)
        self.redis_meters = [TreeCpu(p) for p in be.redis_pids()]
        self.producer = self.model = ""
        self.xadd_key = "bench:{xadd}:one"
        # the load generator's jobs build their bodies, then start together this long after
        # their submission
        self.lead = 0.3 if opt.quick else 1.0

    def redis_cpu(self) -> list[float]:
        return [m() for m in self.redis_meters]

    def cpu(self, ps: Processes | None) -> dict[str, list[float]]:
        roles = ps.cpu() if ps else {"api": [], "worker": []}
        return roles | {"redis": self.redis_cpu()}

    def setup(self, ps: Processes | None = None) -> None:
        """Keys, the featurize stream (filled, counted and rolled once: its aggregate served)
        and the measured streams (created, warmed), by ``ps`` or else 1 API and 1 worker of
        their own, stopped once the roll's follow-ups are done and the worker is idle again."""
        own = ps is None
        ps = ps or Processes(self.be, 1, 1, self.root / "logs" / "setup")
        try:
            self._setup(ps)
            quiet(self.be, self.opt.bound)
        finally:
            if own:
                ps.close()

    def _setup(self, ps: Processes) -> None:
        port, admin = ps.ports[0], self.be.admin
        self.producer = api(port, "POST", "/v1/admin/keys", admin, {"role": "producer"})["key"]
        self.model = api(port, "POST", "/v1/admin/keys", admin, {"role": "model"})["key"]
        create_stream(self.be, port, "feat")
        log = log_of(self.n_log, SEED)
        for s in range(0, feat_rows(self.opt), 1000):
            api(
                port,
                "POST",
                "/v1/streams/feat/observations",
                self.producer,
                {"observations": log.observations(s, s + 1000)},
            )
        wait_counted(self.be, {"feat": 1}, self.opt.bound)
        api(port, "POST", "/v1/streams/feat/roll", admin)
        wait_served(port, self.model, "feat")
        # the measured streams, one per P, each created and warmed here (its first tables
        # written, its first counting runs done) so that no measured run pays for it
        for parts in self.opt.partitions:
            name = f"one{parts}"
            create_stream(self.be, port, name, parts)
            for s in range(0, 2 * self.opt.batch, self.opt.batch):
                api(
                    port,
                    "POST",
                    f"/v1/streams/{name}/observations",
                    self.producer,
                    {"observations": log.observations(s, s + self.opt.batch)},
                )
            wait_counted(self.be, {name: parts}, self.opt.bound)

    def xadd(self) -> dict[str, Any]:
        """The baseline, with no service process running: the rows into one stream key."""
        opt = self.opt
        start_at = time.time() + self.lead
        fut = self.pool.submit(
            job_xadd,
            self.be.port_of(self.xadd_key),
            self.xadd_key,
            self.n_log,
            SEED,
            0,
            opt.rows,
            opt.batch,
            start_at,
        )
        time.sleep(max(0.0, start_at - time.time()))
        c0 = self.cpu(None)
        out = fut.result()
        c1 = self.cpu(None)
        return out | {"cpu": _delta(c0, c1)}

    def ingest(self, ps: Processes, partitions: int) -> dict[str, Any]:
        opt, be = self.opt, self.be
        name = f"one{partitions}"
        log = log_of(self.n_log, SEED)
        # one batch through each API process first, counted (the counting of each partition
        # warmed too)
        for port in ps.ports:
            api(
                port,
                "POST",
                f"/v1/streams/{name}/observations",
                self.producer,
                {"observations": log.observations(0, opt.batch)},
            )
        wait_counted(be, {name: partitions}, opt.bound)
        quiet(be, opt.bound)
        with be.client() as r:
            before = part_rows(r, be.keys, name, partitions)
        per = opt.rows // opt.clients
        start_at = time.time() + self.lead
        futures = [
            self.pool.submit(
                job_ingest,
                ps.ports,
                self.producer,
                name,
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
        t_counted = wait_counted(be, {name: partitions}, opt.bound)
        c1 = self.cpu(ps)
        with be.client() as r:
            after = part_rows(r, be.keys, name, partitions)
        t0 = min(o["start"] for o in out)
        return {
            "rows": sum(o["rows"] for o in out),
            "accepted_s": max(o["end"] for o in out) - t0,
            "counted_s": t_counted - t0,
            "client_cpu": sum(o["client_cpu"] for o in out),
            "cpu": _delta(c0, c1),
            "parts": [b - a for a, b in zip(before, after, strict=True)],
        }

    def featurize(self, ps: Processes, clients: int) -> dict[str, Any]:
        body = orjson.dumps({"rows": log_of(self.n_log, SEED).rows(0, 1)})
        for port in ps.ports:  # each API process loads the served aggregate first
            for _ in range(20):
                status, data = request(port, "POST", "/v1/streams/feat/featurize", body, self.model)
                if status != 200:
                    raise RuntimeError(f"featurize warm-up: {status} {data[:300]!r}")
        quiet(self.be, self.opt.bound)
        start_at = time.time() + self.lead
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
            for c in range(clients)
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
            "cpu": _delta(c0, c1),
        }


def _rotated(xs: tuple[int, ...], k: int) -> tuple[int, ...]:
    k %= len(xs)
    return xs[k:] + xs[:k]


def run_kind(opt: Options, kind: str, root: Path, pool: Pool, say: Say) -> list[Run]:
    runs: list[Run] = []
    say(f"{kind}: starting Redis and the database ({root})")
    with backend(kind, root, opt.database_url) as be:
        bench = Bench(opt, be, root, pool)
        say(f"{kind}: keys and the featurize stream (filled, rolled)")
        bench.setup()
        for rep in range(opt.repeats):
            x = bench.xadd()
            runs.append(Run(kind, "xadd", rep, 0, 0, 1, x, os.getloadavg()[0]))
            say(
                f"{kind} repeat {rep + 1}: pipelined XADD {x['rows'] / x['seconds']:,.0f} "
                f"rows/s, Redis {1e6 * sum(x['cpu']['redis']) / x['rows']:.1f} µs/row"
            )
            order = _rotated(opt.workers, rep)
            for n_worker in order:
                log_dir = root / "logs" / f"{rep}-{n_worker}"
                ps = Processes(be, opt.apis, n_worker, log_dir)
                try:
                    for parts in _rotated(opt.partitions, rep):
                        load = os.getloadavg()[0]
                        r = bench.ingest(ps, parts)
                        run = Run(kind, "ingest", rep, n_worker, parts, opt.clients, r, load)
                        runs.append(run)
                        say(
                            f"{kind} {n_worker} worker(s), P = {parts}, repeat {rep + 1}: "
                            f"{run.accepted:,.0f} rows/s accepted, {run.rate:,.0f} rows/s "
                            f"counted; worker {run.per_unit('worker'):.1f} µs/row"
                        )
                    if n_worker != order[0]:
                        continue
                    for c in _rotated(opt.concurrency, rep):
                        load = os.getloadavg()[0]
                        f = bench.featurize(ps, c)
                        runs.append(Run(kind, "featurize", rep, n_worker, 0, c, f, load))
                        say(
                            f"{kind} repeat {rep + 1}: featurize, {c} client(s): "
                            f"{f['requests'] / f['seconds']:,.0f} req/s, p50 "
                            f"{1e3 * f['p50']:.2f} ms, p99 {1e3 * f['p99']:.1f} ms"
                        )
                finally:
                    ps.close()
    return runs


def measure(opt: Options, say: Say) -> list[Run]:
    tmp = Path(tempfile.mkdtemp(prefix="selectivity-scale-"))
    runs: list[Run] = []
    say("the load generator's processes")
    pool = load_pool(opt)
    try:
        for kind in opt.kinds:
            runs += run_kind(opt, kind, tmp / kind, pool, say)
    except BaseException:
        say(f"failed: the processes' logs are kept in {tmp}")
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return runs


def saved_runs(paths: Sequence[Path]) -> tuple[list[Run], str, bool]:
    """The runs of ``--json`` files, each file's repeats numbered after the previous ones';
    the first file's command (and how many runs, when several) and quick flag."""
    runs: list[Run] = []
    command, quick = "", False
    for i, path in enumerate(paths):
        saved = orjson.loads(path.read_bytes())
        offset = 1 + max((r.rep for r in runs), default=-1)
        runs += [Run(**(r | {"rep": r["rep"] + offset})) for r in saved["runs"]]
        if i == 0:
            command, quick = saved["command"], saved.get("quick", False)
        elif saved["command"] != command:
            raise SystemExit(f"{path}: another command than {paths[0]}'s")
    if len(paths) > 1:
        command += f"  # {len(paths)} runs one after the other, their repeats together"
    return runs, command, quick


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    opt = parse(argv)
    # SIGTERM stops the run through its cleanup (processes, Redis, the schema)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    say = report.Clock()
    if opt.from_json:
        runs, command, quick = saved_runs(opt.from_json)
    else:
        say(f"scale benchmark: {opt}")
        runs, command, quick = measure(opt, say), opt.command, opt.quick
    if opt.json:
        raw = {"command": command, "quick": quick, "runs": [r.asdict() for r in runs]}
        opt.json.write_bytes(orjson.dumps(raw))
    parts: list[Table | Plot] = [*render(runs), plot(runs, tag="_quick" if quick else "")]
    if opt.report:
        report.write_section(TITLE, parts, command=command)
    else:
        print(report.section(TITLE, parts, command=command))
    say(f"median load average during the runs: {statistics.median(r.load for r in runs):.1f}")

"""2-4. Over HTTP, against the bench server (``bench.speed.server``): ingest against pipelined
XADD, single-row featurize latency against the no-op, the train set against XRANGE."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import shutil
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.speed.load import (
    job_ingest,
    job_latency,
    job_trainset,
    job_wait_counted,
    job_xadd,
    job_xrange,
    log_of,
)
from bench.speed.server import Server, api, cpu_seconds, wait_served
from service.cli.synthetic import stream_body
from service.features.service import TRAINSET_CHUNK
from service.stores.keys import Keys

Say = Callable[[str], None]


@dataclass
class HttpResult:
    latency: dict[str, list[float]]  # every repeat's latencies, pooled (the CDF plot)
    ingest: list[dict[str, float]]
    xadd: list[dict[str, float]]
    trainset: list[dict[str, float]]
    xrange: list[dict[str, float]]
    batch: int
    hot_bytes: float = float("nan")  # Redis memory of the hot window's stream, per row
    cols_bytes: float = float("nan")  # ... of its counted runs by column, per row
    latency_runs: list[dict[str, list[float]]] = field(default_factory=list)  # per repeat


def bench_http(
    http_rows: int,
    batch: int,
    requests: int,
    repeats: int,
    bound: float,
    say: Say,
    *,
    featurize_only: bool = False,
) -> HttpResult:
    """Ingest (count period, window 1) against XADD, the latency of featurize against the
    no-op after the roll, then the train set of a filled hot window (window 2) against
    XRANGE. ``featurize_only``: the count period ingested untimed, then the latency only."""
    data_dir = Path(tempfile.mkdtemp(prefix="selectivity-speed-"))
    say(f"http: starting the embedded Redis and the bench server ({data_dir})")
    server = Server(data_dir)
    ctx = multiprocessing.get_context("spawn")
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx)
    try:
        port, admin = server.port, server.admin
        with redis.Redis(unix_socket_path=server.socket) as r:
            redis_pid = int(r.info("server")["process_id"])
        producer = api(port, "POST", "/v1/admin/keys", admin, {"role": "producer"})["key"]
        model = api(port, "POST", "/v1/admin/keys", admin, {"role": "model"})["key"]
        name = "clicks"
        api(port, "POST", "/v1/streams", admin, stream_body(name))
        keys = Keys("bench")
        n = 2 * http_rows
        seed = 3
        raw_key = "bench:{raw}:xadd"

        def run(fn: Callable[..., Any], *args: Any) -> Any:
            """A load-generator job, with the server's and Redis's CPU time during it."""
            s0, r0 = cpu_seconds(server.proc.pid), cpu_seconds(redis_pid)
            w0 = cpu_seconds(server.worker.pid)
            out = pool.submit(fn, *args).result()
            if isinstance(out, dict) and "seconds" in out:
                out["server_cpu"] = cpu_seconds(server.proc.pid) - s0
                out["redis_cpu"] = cpu_seconds(redis_pid) - r0
                out["worker_cpu"] = cpu_seconds(server.worker.pid) - w0
            return out

        # Count period (window 1): the timed ingest runs, each against raw XADD of its rows.
        if not featurize_only:
            say(f"ingest: {http_rows:,} rows in batches of {batch} vs pipelined XADD")
        run(log_of, n, seed)
        b = batch
        run(job_ingest, port, producer, name, n, seed, 0, b, b, bound)  # warm-up, not timed
        run(job_xadd, server.socket, raw_key, n, seed, 0, b, b, bound)
        ingest, xadd = [], []
        per = (http_rows - b) // repeats
        for r in range(0 if featurize_only else repeats):
            lo, hi = b + r * per, b + (r + 1) * per
            ingest.append(run(job_ingest, port, producer, name, n, seed, lo, hi, b, bound))
            # then until the counting job has counted all of it (its CPU is in the server's)
            drain = run(
                job_wait_counted, server.socket, keys.meta(name, 1), keys.hot(name, 1), bound
            )
            ingest[-1]["count_wait"] = drain["seconds"]
            ingest[-1]["count_server_cpu"] = drain["server_cpu"]
            ingest[-1]["count_redis_cpu"] = drain["redis_cpu"]
            ingest[-1]["count_worker_cpu"] = drain["worker_cpu"]
            xadd.append(run(job_xadd, server.socket, raw_key, n, seed, lo, hi, b, bound))
            i, x = ingest[-1], xadd[-1]
            say(
                f"ingest: repeat {r + 1}/{repeats}: HTTP {i['rows'] / i['seconds']:,.0f} "
                f"rows/s accepted, {i['rows'] / (i['seconds'] + i['count_wait']):,.0f} rows/s "
                f"counted, XADD {x['rows'] / x['seconds']:,.0f} rows/s; CPU µs/row while "
                f"accepting: API {1e6 * i['server_cpu'] / i['rows']:.1f}, worker "
                f"{1e6 * i['worker_cpu'] / i['rows']:.1f}, Redis "
                f"{1e6 * i['redis_cpu'] / i['rows']:.1f}, client "
                f"{1e6 * i['client_cpu'] / i['rows']:.1f}"
            )
        if featurize_only:
            say(f"ingest: {http_rows - b:,} rows of the count period (not timed)")
            run(job_ingest, port, producer, name, n, seed, b, http_rows, b, bound)
            run(job_wait_counted, server.socket, keys.meta(name, 1), keys.hot(name, 1), bound)
        say("roll: window 1 joins the count period")
        api(port, "POST", f"/v1/streams/{name}/roll", admin)
        wait_served(port, model, name)

        runs: list[dict[str, list[float]]] = []
        for r in range(repeats):
            say(f"latency: repeat {r + 1}/{repeats}: single-row featurize, no-op, interleaved")
            runs.append(run(job_latency, port, model, name, n, seed, requests, bound, r))
            p50 = {k: statistics.median(v) for k, v in runs[-1].items()}
            say(
                f"latency: p50 featurize {1e3 * p50['featurize']:.3f} ms, no-op "
                f"{1e3 * p50['noop']:.3f} ms ({p50['featurize'] / p50['noop']:.2f}×), first "
                f"figures' no-op {1e3 * p50['noop_last']:.3f} ms "
                f"({p50['featurize'] / p50['noop_last']:.2f}×)"
            )
        latency = {k: [x for run_ in runs for x in run_[k]] for k in runs[0]}
        if featurize_only:
            return HttpResult(latency, [], [], [], [], batch, latency_runs=runs)

        say(f"hot window: ingesting {http_rows:,} rows into window 2 (not timed)")
        run(job_ingest, port, producer, name, n, seed, http_rows, n, b, bound)
        hot = keys.hot(name, 2)
        # the worker counts the window as it fills (every second); the train set then reads
        # the counted rows by column, as it would a minute after they arrived
        run(job_wait_counted, server.socket, keys.meta(name, 2), hot, bound)
        with redis.Redis(unix_socket_path=server.socket) as r:
            rows_hot = int(r.xlen(hot))
            hot_bytes = int(r.memory_usage(hot, samples=0) or 0) / rows_hot
            cols_bytes = int(r.memory_usage(keys.cols(name, 2), samples=0) or 0) / rows_hot
        say(f"hot window: {hot_bytes:.0f} B/row as JSON, {cols_bytes:.0f} B/row by column")
        say("trainset: warm-up (not timed)")
        run(job_trainset, port, model, name)
        run(job_xrange, server.socket, hot, TRAINSET_CHUNK)
        trainset, xrange = [], []
        for r in range(repeats):
            trainset.append(run(job_trainset, port, model, name))
            xrange.append(run(job_xrange, server.socket, hot, TRAINSET_CHUNK))
            t, x = trainset[-1], xrange[-1]
            say(
                f"trainset: repeat {r + 1}/{repeats}: Arrow {t['rows'] / t['seconds']:,.0f} "
                f"rows/s ({t['bytes'] / 1e6:.0f} MB), XRANGE {x['rows'] / x['seconds']:,.0f} rows/s"
                f"; CPU µs/row: API {1e6 * t['server_cpu'] / t['rows']:.1f}, "
                f"Redis {1e6 * t['redis_cpu'] / t['rows']:.1f}, "
                f"client {1e6 * t['client_cpu'] / t['rows']:.1f}"
            )
        return HttpResult(
            latency, ingest, xadd, trainset, xrange, batch, hot_bytes, cols_bytes, runs
        )
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        server.close()
        shutil.rmtree(data_dir, ignore_errors=True)

"""The load generator's jobs, each run in a process of its own (a spawn pool of ``clients``
processes, one connection per API process): its bodies are built first, then it waits for the
common start time, so that every client starts together; requests go round-robin over the API
processes, as a load balancer would send them. The baseline, ``job_xadd``, writes the same rows
straight into one Redis stream key, no service in between."""

from __future__ import annotations

import http.client
import time
from typing import Any

import numpy as np
import orjson
import redis

from bench.ingestload import Ingest, ingest_bodies
from bench.speed.load import log_of, stored_rows


def warm(n: int, seed: int, hold: float) -> int:
    """Build the click log in this process (cached), then hold it for ``hold`` s, so that
    ``clients`` concurrent calls warm ``clients`` distinct processes of the pool."""
    log_of(n, seed)
    time.sleep(hold)
    return n


def _until(start_at: float) -> None:
    wait = start_at - time.time()
    if wait > 0:
        time.sleep(wait)


def _conns(ports: list[int]) -> list[http.client.HTTPConnection]:
    return [http.client.HTTPConnection("127.0.0.1", p, timeout=600) for p in ports]


def job_ingest(
    ports: list[int],
    key: str,
    stream: str,
    n: int,
    seed: int,
    lo: int,
    hi: int,
    batch: int,
    first: int,
    start_at: float,
) -> dict[str, float]:
    """Rows ``lo:hi`` of the log into ``stream`` in batches of ``batch``, batch i to API
    process ``(first + i) % N``: rows accepted, start and end (epoch seconds), client CPU."""
    bodies = ingest_bodies(log_of(n, seed), lo, hi, batch)
    conns = _conns(ports)
    ingest = Ingest(stream, key)
    rows = 0
    _until(start_at)
    t0, c0 = time.time(), time.process_time()
    for i, body in enumerate(bodies):
        rows += ingest.post(conns[(first + i) % len(conns)], body)
    t1, cpu = time.time(), time.process_time() - c0
    for c in conns:
        c.close()
    return {"rows": rows, "start": t0, "end": t1, "client_cpu": cpu}


def job_featurize(
    ports: list[int],
    key: str,
    stream: str,
    n: int,
    seed: int,
    first: int,
    start_at: float,
    seconds: float,
) -> dict[str, Any]:
    """Single-row ``POST /featurize`` requests one after another for ``seconds``, request i
    to API process ``(first + i) % N``: requests, their latencies, start, end, client CPU."""
    log = log_of(n, seed)
    rng = np.random.default_rng(seed + first)
    picks = rng.integers(0, len(log), 2000).tolist()
    bodies = [orjson.dumps({"rows": log.rows(i, i + 1)}) for i in picks]
    conns = _conns(ports)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    path = f"/v1/streams/{stream}/featurize"
    latencies: list[float] = []
    _until(start_at)
    t0, c0 = time.time(), time.process_time()
    stop = t0 + seconds
    i = 0
    while time.time() < stop:
        t = time.perf_counter()
        conn = conns[(first + i) % len(conns)]
        conn.request("POST", path, body=bodies[i % len(bodies)], headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"featurize: {resp.status} {data[:300]!r}")
        latencies.append(time.perf_counter() - t)
        i += 1
    t1, cpu = time.time(), time.process_time() - c0
    for c in conns:
        c.close()
    return {"requests": i, "latencies": latencies, "start": t0, "end": t1, "client_cpu": cpu}


def job_xadd(
    port: int, stream_key: str, n: int, seed: int, lo: int, hi: int, batch: int, start_at: float
) -> dict[str, float]:
    """The baseline: rows ``lo:hi`` as the service stores them (the hot stream's JSON entry)
    XADDed into ``stream_key`` of the Redis at ``port`` by one redis-py client, pipelined
    ``batch`` at a time (no transaction): rows, seconds, client CPU. The key is emptied
    first, before the clock."""
    rows = stored_rows(log_of(n, seed), lo, hi)
    r = redis.Redis(port=port)
    r.delete(stream_key)
    _until(start_at)
    t0, c0 = time.perf_counter(), time.process_time()
    for s in range(0, len(rows), batch):
        pipe = r.pipeline(transaction=False)
        for row in rows[s : s + batch]:
            pipe.xadd(stream_key, {"d": row})
        pipe.execute()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    r.close()
    return {"rows": len(rows), "seconds": dt, "client_cpu": cpu}

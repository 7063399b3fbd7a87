"""The load generator's jobs, run in a process of their own (one request or pipeline in flight):
each returns its row count, wall seconds and its own CPU seconds."""

from __future__ import annotations

import functools
import http.client
import time

import numpy as np
import orjson
import pyarrow as pa
import redis

from bench.ingestload import Ingest, ingest_bodies
from service.cli.synthetic import ClickLog, generate


@functools.lru_cache(maxsize=1)
def log_of(n: int, seed: int) -> ClickLog:
    """The load generator process's click log (generated once, used by every job)."""
    return generate(n, seed=seed)


def _progress(what: str, done: int, total: int, t0: float) -> None:
    dt = time.perf_counter() - t0
    print(f"          {what}: {done:,}/{total:,} in {dt:.1f} s", flush=True)


def job_ingest(
    port: int, key: str, stream: str, n: int, seed: int, lo: int, hi: int, batch: int, bound: float
) -> dict[str, float]:
    bodies = ingest_bodies(log_of(n, seed), lo, hi, batch)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    ingest = Ingest(stream, key)
    rows = 0
    t0, c0 = time.perf_counter(), time.process_time()
    step = max(1, len(bodies) // 4)
    for i, body in enumerate(bodies):
        rows += ingest.post(conn, body)
        if (i + 1) % step == 0:
            _progress("ingest rows", rows, hi - lo, t0)
        if time.perf_counter() - t0 > bound:
            break
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    conn.close()
    return {"rows": rows, "seconds": dt, "client_cpu": cpu}


def job_wait_counted(sock: str, meta_key: str, hot_key: str, bound: float) -> dict[str, float]:
    """Seconds until the counting job has counted every accepted entry of a window (its
    checkpoint reaches the hot stream's last entry)."""
    r = redis.Redis(unix_socket_path=sock)
    t0 = time.perf_counter()
    last = r.xrevrange(hot_key, count=1)
    while last and r.hget(meta_key, "counted") != last[0][0]:
        if time.perf_counter() - t0 > bound:
            raise RuntimeError("the counting job did not catch up")
        time.sleep(0.01)
    r.close()
    return {"seconds": time.perf_counter() - t0}


def stored_rows(log: ClickLog, lo: int, hi: int) -> list[bytes]:
    """The hot-stream entries the service writes for these observations."""
    return [
        orjson.dumps({"id": o["id"], "f": o["features"], "y": o["label"], "t": None})
        for o in log.observations(lo, hi)
    ]


def job_xadd(
    sock: str, stream_key: str, n: int, seed: int, lo: int, hi: int, batch: int, bound: float
) -> dict[str, float]:
    log = log_of(n, seed)
    rows = stored_rows(log, lo, hi)
    r = redis.Redis(unix_socket_path=sock)
    r.delete(stream_key)
    done = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for s in range(0, len(rows), batch):
        pipe = r.pipeline(transaction=False)
        for row in rows[s : s + batch]:
            pipe.xadd(stream_key, {"d": row})
        pipe.execute()
        done += len(rows[s : s + batch])
        if time.perf_counter() - t0 > bound:
            break
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    r.delete(stream_key)
    r.close()
    return {"rows": done, "seconds": dt, "client_cpu": cpu}


def job_latency(
    port: int,
    key: str,
    stream: str,
    n: int,
    seed: int,
    requests: int,
    bound: float,
    repeat: int = 0,
) -> dict[str, list[float]]:
    """Round-robin single-row requests: featurize, the no-op (same body), the no-op of the first
    figures, healthz; each round starts one endpoint later, so no endpoint always follows
    another. Each repeat draws other rows (featurize has not seen them: its key cache helps no
    more than it would a client's fresh rows)."""
    log = log_of(n, seed)
    rng = np.random.default_rng([seed, repeat])
    picks = rng.integers(0, len(log), requests + 50).tolist()
    bodies = [orjson.dumps({"rows": log.rows(i, i + 1)}) for i in picks]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    auth = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    endpoints = [
        ("featurize", "POST", f"/v1/streams/{stream}/featurize", True),
        ("noop", "POST", f"/v1/streams/{stream}/noop", True),
        ("noop_last", "POST", "/bench/noop", True),
        ("healthz", "GET", "/healthz", False),
    ]
    out: dict[str, list[float]] = {name: [] for name, *_ in endpoints}
    t0 = time.perf_counter()
    for i, body in enumerate(bodies):
        k = i % len(endpoints)
        for name, method, path, with_body in endpoints[k:] + endpoints[:k]:
            t = time.perf_counter()
            if with_body:
                conn.request(method, path, body=body, headers=auth)
            else:
                conn.request(method, path)
            resp = conn.getresponse()
            data = resp.read()
            dt = time.perf_counter() - t
            if resp.status != 200:
                raise RuntimeError(f"{path}: {resp.status} {data[:300]!r}")
            if i >= 50:  # the first 50 rounds warm up
                out[name].append(dt)
        if (i + 1) % max(1, len(bodies) // 4) == 0:
            _progress("latency rounds", i + 1, len(bodies), t0)
        if time.perf_counter() - t0 > bound:
            break
    conn.close()
    return out


def job_trainset(port: int, key: str, stream: str) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0, c0 = time.perf_counter(), time.process_time()
    conn.request(
        "GET",
        f"/v1/streams/{stream}/trainset?format=arrow",
        headers={"Authorization": f"Bearer {key}"},
    )
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"trainset: {resp.status} {data[:300]!r}")
    table = pa.ipc.open_stream(data).read_all()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    conn.close()
    return {
        "rows": table.num_rows,
        "seconds": dt,
        "client_cpu": cpu,
        "bytes": len(data),
        "columns": table.num_columns,
    }


def job_xrange(sock: str, stream_key: str, chunk: int) -> dict[str, float]:
    r = redis.Redis(unix_socket_path=sock)
    rows = 0
    t0, c0 = time.perf_counter(), time.process_time()
    start: bytes | str = "-"
    while True:
        entries = r.xrange(stream_key, min=start, max="+", count=chunk)
        if not entries:
            break
        rows += len(entries)
        if len(entries) < chunk:
            break
        last = entries[-1][0]
        assert isinstance(last, bytes)
        start = b"(" + last
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    r.close()
    return {"rows": rows, "seconds": dt, "client_cpu": cpu}

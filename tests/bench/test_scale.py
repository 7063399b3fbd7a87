"""The scale benchmark's pieces: its options, its bookkeeping (ratios within one repeat: W
workers ÷ 1 worker, counted ingest per worker core ÷ XADD per Redis core; CPU per row; the
projection to N cores) producing its tables, prose and plot from the runs' data, and one tiny
run of real processes on a standalone Redis (no timings asserted)."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from bench.report import Plot, Table
from bench.scale.cli import Bench, load_pool, parse, saved_runs
from bench.scale.deploy import Processes, TreeCpu, backend, counted_up, part_rows
from bench.scale.report import (
    Amdahl,
    Prose,
    Run,
    amdahl,
    efficiency,
    plot,
    render,
    to_one_worker,
    to_xadd,
)


def test_options() -> None:
    opt = parse([])
    assert (opt.rows, opt.workers, opt.partitions, opt.concurrency) == (
        40_000,
        (1, 2, 4),
        (1, 4),
        (1, 8),
    )
    assert opt.kinds == ("standalone", "cluster") and opt.database_url is None
    quick = parse(["--quick", "--redis", "cluster", "--partitions", "2,1", "--workers", "2,1"])
    assert quick.rows < opt.rows and quick.repeats == 1 and quick.kinds == ("cluster",)
    assert quick.partitions == (1, 2) and quick.workers == (1, 2)
    assert "--partitions 1,2" in quick.command and "--redis cluster" in quick.command
    for bad in (["--redis", "sentinel"], ["--partitions", "0"], ["--workers", "2,4"],
                ["--concurrency", "x"]):  # fmt: skip
        with pytest.raises(SystemExit):
            parse(bad)


def _ingest(
    kind: str, w: int, p: int, rep: int, counted_s: float, worker: float, redis_s: list[float]
) -> Run:
    data = {
        "rows": 10_000,
        "accepted_s": counted_s / 2,
        "counted_s": counted_s,
        "client_cpu": 0.01,
        "cpu": {"api": [0.2, 0.2], "worker": [worker] + [0.0] * (w - 1), "redis": redis_s},
        "parts": [10_000 // p] * p,
    }
    return Run(kind, "ingest", rep, w, p, 4, data, 1.0)


def _xadd(kind: str, rep: int, redis_s: float) -> Run:
    data = {"rows": 10_000, "seconds": 0.1, "client_cpu": 0.05, "cpu": {"redis": [redis_s]}}
    return Run(kind, "xadd", rep, 0, 0, 1, data, 1.0)


def test_ratios_are_within_one_repeat() -> None:
    runs = [
        _ingest("standalone", 1, 1, 0, 2.0, 0.5, [0.1]),
        _ingest("standalone", 2, 1, 0, 1.0, 0.5, [0.1]),
        _ingest("standalone", 1, 1, 1, 4.0, 0.5, [0.1]),  # a slower repeat: its own base
        _ingest("standalone", 2, 1, 1, 4.0, 1.0, [0.1]),  # 1.5 CPU s where 1 worker took 1.0
        _ingest("standalone", 2, 1, 2, 1.0, 0.5, [0.1]),  # no base in repeat 2: left out
        _xadd("standalone", 0, 0.05),
        _xadd("standalone", 1, 0.1),
    ]
    two = [r for r in runs if r.workers == 2]
    one = [r for r in runs if r.what == "ingest" and r.workers == 1]
    assert runs[0].rate == pytest.approx(5000.0) and runs[0].accepted == pytest.approx(10_000)
    assert to_one_worker(runs, two) == pytest.approx(1.5)  # median of 2.0 and 1.0
    # rows/s per busy core: repeat 0 on the same CPU as 1 worker (1×), repeat 1 on 1.5× its CPU
    assert efficiency(runs, two) == pytest.approx((1 + 1 / 1.5) / 2)
    assert runs[1].per_unit("api") == pytest.approx(40.0)  # 0.4 s over 10,000 rows
    assert runs[1].cores() == pytest.approx(0.4 + 0.5 + 0.1)
    assert runs[1].busiest("worker") == pytest.approx(0.5)
    # 20,000 rows per worker CPU s against 200,000 (repeat 0) and 100,000 (repeat 1) XADD
    # rows per Redis CPU s
    assert runs[0].per_core("worker") == pytest.approx(20_000)
    assert to_xadd(runs, one) == pytest.approx((0.1 + 0.2) / 2)


def test_amdahl_projection() -> None:
    m = Amdahl("standalone", 4, 1, total_us=100.0, worker_us=40.0, share=0.25, redis_node_us=20.0)
    assert m.serial_us == pytest.approx(10.0) and m.fraction == pytest.approx(0.1)
    assert m.rate(1) == pytest.approx(10_000)
    assert m.rate(2) == pytest.approx(1e6 / (10 + 45))
    assert m.rate(math.inf) == pytest.approx(50_000) and m.limit == "Redis"  # 1e6 / 20 µs
    one = Amdahl("cluster", 1, 1, total_us=100.0, worker_us=40.0, share=1.0, redis_node_us=10.0)
    assert one.rate(math.inf) == pytest.approx(25_000) and one.limit == "counting"
    # from the runs: per (Redis, partitions), from the runs with the fewest and the most workers
    models = {(m.kind, m.partitions, m.workers): m for m in amdahl(_runs())}
    assert sorted(models) == [(k, p, w) for k in ("cluster", "standalone") for p in (1, 4)
                              for w in (1, 4)]  # fmt: skip
    m = models[("cluster", 4, 1)]
    assert (m.total_us, m.worker_us, m.share, m.redis_node_us) == pytest.approx((100, 50, 0.25, 6))


def _runs() -> list[Run]:
    nodes = {"standalone": [0.1], "cluster": [0.06, 0.03, 0.01]}
    runs = [
        _ingest(kind, w, p, rep, 2.0 / w, 0.5, nodes[kind])
        for kind in ("standalone", "cluster")
        for p in (1, 4)
        for w in (1, 2, 4)
        for rep in range(2)
    ]
    runs += [_xadd(kind, rep, 0.05) for kind in ("standalone", "cluster") for rep in range(2)]
    for kind in ("standalone", "cluster"):
        for c in (1, 8):
            feat: dict[str, Any] = {"requests": 900 * c, "seconds": 3.0, "p50": 0.002 * c,
                                    "p99": 0.01 * c, "client_cpu": 0.1}  # fmt: skip
            feat["cpu"] = {"api": [0.3, 0.3], "worker": [0.0], "redis": [0.05]}
            runs += [Run(kind, "featurize", rep, 1, 0, c, feat, 1.0) for rep in range(2)]
    return runs


def test_tables_prose_and_plot_come_from_the_runs(tmp_path: Path) -> None:
    runs = _runs()
    tables = render(runs)
    assert all(isinstance(t, Table) for t in tables) and isinstance(tables[-1], Prose)
    md = [t.markdown() for t in tables]
    # the ratios: 2 and 4 workers ÷ 1 (rate 2/w s), per worker core ÷ per Redis core
    # (20,000 rows per worker CPU s ÷ 200,000 per Redis CPU s), rows/s ÷ XADD rows/s
    assert "| standalone | 4 | 0.10× | 2.00× | 4.00× | 0.05× |" in md[0]
    assert "| standalone | 1 | 2 | 20,000 | 10,000 | 2.00× | 0.5 s |" in md[1]
    assert "| cluster | 1 | 1 | 40.0 | 50.0 | 10.0 | 6.0 / 3.0 / 1.0 | 1.0 | 100.0 |" in md[2]
    assert "| 0.10× |" in md[3] and "| standalone | 100,000 | 5.0 | 5.0 | 200,000 |" in md[4]
    assert "| cluster | 8 | 2,400 | 16.00 ms | 80.0 ms |" in md[5]
    # Amdahl: T = 100 µs, worker 50, share 25 % (P = 4): s = 12.5 µs; the cluster's busiest
    # Redis node 6 µs a row
    assert "| cluster | 4 | 1 worker | 100.0 | 50.0 | 25 % | 12.5 | 12 % | 6.0 |" in md[6]
    assert "| cluster | 4 | 4 workers | 100.0 |" in md[6]
    assert "| 10,000 | 17,778 |" in md[6]  # 1 core, 2 cores: 1e6 / (12.5 + 87.5 / 2)
    assert "cluster, P = 4, CPU per row of the runs with 1 worker: T = 100.0 µs" in md[7]
    assert "N → ∞ 80,000 rows/s" in md[7] and "P = 4 against P = 1" in md[7]
    assert "4 workers against 1" in md[7]
    p = plot(runs, tag="_test", directory=tmp_path)
    assert isinstance(p, Plot) and p.path.stat().st_size > 1000


def test_tree_cpu_never_goes_back() -> None:
    meter = TreeCpu(os.getpid())
    a = meter()
    t = time.process_time()
    while time.process_time() - t < 0.1:
        pass
    assert meter() >= a + 0.05  # (the kernel counts in 10 ms ticks: room for two)
    assert TreeCpu(2**22 + 12345)() == 0.0  # no such process


@pytest.mark.slow
def test_a_tiny_run_counts_every_row(tmp_path: Path) -> None:
    """Standalone Redis (AOF on), SQLite, 1 API and 1 worker, one load-generator process, a
    stream of two partitions: every row is accepted and counted, the XADD baseline runs, and
    featurize answers."""
    opt = parse(["--quick", "--rows", "400", "--batch", "100", "--clients", "1", "--apis", "1",
                 "--concurrency", "1", "--seconds", "0.3", "--redis", "standalone",
                 "--partitions", "2", "--max-seconds", "60"])  # fmt: skip
    with backend("standalone", tmp_path, None) as be:
        with redis.Redis(port=be.ports[0]) as r:
            assert r.config_get("appendonly") == {"appendonly": "yes"}
        pool = load_pool(opt)
        bench = Bench(opt, be, tmp_path, pool)
        ps = Processes(be, 1, 1, tmp_path / "logs")
        try:
            bench.setup(ps)
            x = bench.xadd()
            assert x["rows"] == 400 and x["seconds"] > 0 and len(x["cpu"]["redis"]) == 1
            got = bench.ingest(ps, 2)  # two partitions: both counted, the rows split
            assert got["rows"] == 400 and got["counted_s"] >= got["accepted_s"] > 0
            assert sum(got["parts"]) == 400 and min(got["parts"]) > 0
            with be.client() as r:
                assert counted_up(r, be.keys, "one2", 1, 2)
                assert sum(part_rows(r, be.keys, "one2", 2)) == 400 + 100 + 200  # + warm-ups
            assert got["cpu"]["worker"][0] > 0 and len(got["cpu"]["redis"]) == 1
            f = bench.featurize(ps, 1)
            assert f["requests"] > 0 and 0 < f["p50"] <= f["p99"]
        finally:
            ps.close()
            pool.shutdown()


def test_saved_runs_merge_their_repeats(tmp_path: Path) -> None:
    runs = _runs()
    for name in ("a", "b"):
        raw = {"command": "selectivity bench scale", "runs": [r.asdict() for r in runs]}
        (tmp_path / f"{name}.json").write_bytes(orjson.dumps(raw))
    merged, command, quick = saved_runs([tmp_path / "a.json", tmp_path / "b.json"])
    assert len(merged) == 2 * len(runs) and {r.rep for r in merged} == {0, 1, 2, 3}
    assert command.startswith("selectivity bench scale  # 2 runs") and not quick
    assert render(merged)[0].markdown() == render(runs)[0].markdown()  # the same figures twice

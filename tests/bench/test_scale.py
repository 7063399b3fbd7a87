"""The scale benchmark's pieces: its options, its bookkeeping (medians, ratios to 1 API / 1
worker of the same repeat, CPU per row) and one tiny run of
real processes on a standalone Redis (no timings asserted)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis

from bench.report import Plot, Table
from bench.scale.cli import Bench, parse, quiet
from bench.scale.deploy import Processes, TreeCpu, backend, counted_up
from bench.scale.report import Run, plot, ratio_to_base, render


def test_options() -> None:
    opt = parse([])
    assert (opt.rows, opt.streams, opt.clients, opt.repeats) == (40_000, (1, 4), 4, 3)
    assert opt.kinds == ("standalone", "cluster") and opt.database_url is None
    quick = parse(["--quick", "--redis", "cluster", "--streams", "2"])
    assert quick.rows < opt.rows and quick.repeats == 1 and quick.kinds == ("cluster",)
    assert "--streams 2" in quick.command and "--redis cluster" in quick.command
    with pytest.raises(SystemExit):
        parse(["--redis", "sentinel"])
    with pytest.raises(SystemExit):
        parse(["--streams", "0"])


def _ingest(kind: str, n: int, m: int, rep: int, counted_s: float, worker: float) -> Run:
    data = {
        "rows": 10_000,
        "accepted_s": counted_s / 2,
        "counted_s": counted_s,
        "client_cpu": 0.01,
        "cpu": {"api": [0.2] * n, "worker": [worker] + [0.0] * (m - 1), "redis": [0.1]},
    }
    return Run(kind, n, m, rep, "ingest", 1, data, 1.0)


def test_ratios_are_per_repeat_against_one_api_one_worker() -> None:
    runs = [
        _ingest("standalone", 1, 1, 0, 2.0, 0.5),
        _ingest("standalone", 2, 1, 0, 1.0, 0.5),
        _ingest("standalone", 1, 1, 1, 4.0, 0.5),  # a slower repeat: its own base
        _ingest("standalone", 2, 1, 1, 4.0, 0.5),
        _ingest("standalone", 2, 1, 2, 1.0, 0.5),  # no base in repeat 2: left out
    ]
    two = [r for r in runs if r.n_api == 2]
    assert runs[0].rate == pytest.approx(5000.0) and runs[0].accepted == pytest.approx(10_000)
    assert ratio_to_base(runs, two) == pytest.approx(1.5)  # median of 2.0 and 1.0
    assert runs[1].per_unit("api") == pytest.approx(40.0)  # 0.4 s over 10,000 rows
    assert runs[1].cores() == pytest.approx((0.4 + 0.5 + 0.1 + 0.01) / 1.0)
    assert runs[1].busiest("worker") == pytest.approx(0.5)


def test_tables_and_plot(tmp_path: Path) -> None:
    runs = [
        _ingest(kind, n, m, rep, 2.0 / n, 0.5)
        for kind in ("standalone", "cluster")
        for n, m in ((1, 1), (2, 1), (1, 2), (2, 2))
        for rep in range(2)
    ]
    feat: dict[str, Any] = {
        "requests": 900,
        "seconds": 3.0,
        "p50": 0.002,
        "p99": 0.01,
        "client_cpu": 0.1,
    }
    feat["cpu"] = {"api": [0.3], "worker": [0.0], "redis": [0.05]}
    runs += [Run(k, 1, 1, rep, "featurize", 0, feat, 1.0) for k in ("standalone", "cluster")
             for rep in range(2)]  # fmt: skip
    tables = render(runs)
    assert all(isinstance(t, Table) for t in tables) and len(tables) == 5
    ingest = tables[0].markdown()
    assert "| standalone | 1 | 2 | 1 | 20,000 | 10,000 | 2.00× |" in ingest
    assert "| 300 | 1.00× | 2.00 ms |" in tables[2].markdown()
    assert (
        "| standalone | counting: the one counting job at a time | worker | 50.0 | 20,000 rows/s |"
        in (tables[3].markdown())
    )
    assert "| featurize | 1 | 1 | 1.00× |" in tables[4].markdown()
    p = plot(runs, tag="_test", directory=tmp_path)
    assert isinstance(p, Plot) and p.path.stat().st_size > 1000


def test_tree_cpu_never_goes_back() -> None:
    import os

    meter = TreeCpu(os.getpid())
    a = meter()
    t = time.process_time()
    while time.process_time() - t < 0.05:
        pass
    assert meter() >= a + 0.04
    assert TreeCpu(2**22 + 12345)() == 0.0  # no such process


@pytest.mark.slow
def test_a_tiny_run_counts_every_row(tmp_path: Path) -> None:
    """Standalone Redis (AOF on), SQLite, 1 API and 1 worker, two load-generator processes:
    every row is accepted and counted, and featurize answers."""
    opt = parse(["--quick", "--rows", "400", "--batch", "100", "--clients", "2",
                 "--seconds", "0.5", "--redis", "standalone"])  # fmt: skip
    with backend("standalone", tmp_path, None) as be:
        with redis.Redis(port=be.ports[0]) as r:
            assert r.config_get("appendonly") == {"appendonly": "yes"}
        bench = Bench(opt, be, tmp_path)
        try:
            bench.setup()
            ps = Processes(be, 1, 1, tmp_path / "logs")
            try:
                got = bench.ingest(ps, 2)
                assert got["rows"] == 400 and got["counted_s"] >= got["accepted_s"] > 0
                with be.client() as r:
                    assert all(counted_up(r, be.keys, f"s2x{j}") for j in range(2))
                    assert sum(r.xlen(be.keys.hot(f"s2x{j}", 1)) for j in range(2)) == 400 + 2 * 10
                assert got["cpu"]["worker"][0] > 0 and len(got["cpu"]["redis"]) == 1
                f = bench.featurize(ps)
                assert f["requests"] > 0 and 0 < f["p50"] <= f["p99"]
                quiet(be, 60)
            finally:
                ps.close()
        finally:
            bench.close()

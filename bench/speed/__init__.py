"""``selectivity bench speed``: the hot paths against baselines measured in the same run (the
description and the options: ``bench.speed.cli``).

The package: ``cli`` (options, the run), ``batch`` (featurize batch in process), ``server`` (the
bench server in a subprocess), ``load`` (the load generator's jobs), ``http_bench`` (ingest,
latency and train set over HTTP), ``profile`` (the same paths timed piece by piece in process),
``report`` and ``plots`` (tables and PNGs)."""

from bench.speed.cli import main

__all__ = ["main"]

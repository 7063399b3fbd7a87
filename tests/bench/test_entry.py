"""``selectivity bench <name>`` offers exactly the benchmarks ``python -m bench`` runs (the
service never imports ``bench``, so the two lists are kept apart), and each one imports."""

from __future__ import annotations

import importlib

from bench.__main__ import BENCHES
from service.cli import entry


def test_the_cli_offers_the_benchmarks_python_m_bench_runs() -> None:
    assert entry.BENCHES == BENCHES


def test_every_benchmark_has_a_main() -> None:
    for name in BENCHES:
        assert callable(importlib.import_module(f"bench.{name.replace('-', '_')}").main), name

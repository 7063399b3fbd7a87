"""`selectivity demo` against `selectivity serve`, as the README's quick start runs it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.serving import cli, serving

pytestmark = pytest.mark.slow  # `selectivity serve` and `selectivity demo` in subprocesses


def test_demo_runs_end_to_end_against_the_server(tmp_path: Path) -> None:
    with serving(tmp_path) as server:
        p = cli(
            *("demo", "--url", server.base, "--windows", "3", "--rows", "2000"),
            env=server.env,  # finds the bootstrap admin key in the data dir
            timeout=300,
        )
        server.stop()
    assert p.returncode == 0, p.stdout + p.stderr
    out = " ".join(p.stdout.split())
    assert re.search(r"train set at epoch 3: 2,000 rows", out), out
    assert re.search(r"log-loss \d\.\d+ vs the label prior's \d\.\d+", out), out
    assert "ε = 1.0" in out

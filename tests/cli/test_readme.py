"""The README's five-minute walkthrough, run as written (bash + curl) against `selectivity
serve` on the embedded defaults, so the quick start cannot silently go stale."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.serving import serving

pytestmark = pytest.mark.slow  # `selectivity serve` in a subprocess, the walkthrough in bash

README = Path(__file__).resolve().parents[2] / "README.md"


def _walkthrough() -> str:
    text = README.read_text()
    section = text.split("## Five-minute walkthrough", 1)[1]
    m = re.search(r"```sh\n(.*?)```", section, re.S)
    assert m, "the walkthrough has no sh block"
    return m.group(1)


@pytest.mark.skipif(shutil.which("curl") is None, reason="the walkthrough uses curl")
def test_readme_walkthrough_works_as_written(tmp_path: Path) -> None:
    script = _walkthrough()
    assert "ADMIN=$(cat .selectivity/admin.key)" in script and "API=http://127.0.0.1:8000" in script
    with serving(tmp_path) as server:
        # the same script, pointed at this server's port and data dir; every command's
        # output is printed on its own line so that each can be checked
        body = script.replace("API=http://127.0.0.1:8000", f"API={server.base}")
        body = body.replace(".selectivity/admin.key", str(server.data_dir / "admin.key"))
        body = 'curl() { command curl "$@"; echo; }\n' + body
        p = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", body], capture_output=True, text=True, timeout=120
        )
        server.stop()
    assert p.returncode == 0, p.stderr
    outputs = [line for line in p.stdout.splitlines() if line.strip()]
    ingest, roll, ingest2, featurize = (orjson.loads(x) for x in outputs[1:5])
    assert orjson.loads(outputs[0])["name"] == "movielens"
    assert ingest == {"accepted": 3, "window": 1}
    assert roll == {"epoch": 2}
    assert ingest2["window"] == 2
    assert featurize["epoch"] == 2 and len(featurize["rows"]) == 1
    trainset = [orjson.loads(x) for x in outputs[5:-1]]
    assert len(trainset) == 1 and trainset[0]["label"] == "1"
    assert orjson.loads(outputs[-1])["epoch"] == 2
    assert '"error"' not in p.stdout

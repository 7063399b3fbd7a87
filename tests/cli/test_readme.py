"""The code blocks of the README and of the guides (docs/USING.md, docs/OPERATIONS.md), run as
written (bash + curl) against `selectivity serve` on the embedded defaults, so that none can
silently go stale: the two commands, the five-minute walkthrough, the annotation queue (in the
walkthrough's shell), the key ceremony and break glass. ``test_every_block_is_run`` fails when a
block is added that no test runs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.serving import cli, cli_env, serving

pytestmark = pytest.mark.slow  # `selectivity serve` in a subprocess, the walkthrough in bash

README = Path(__file__).resolve().parents[2] / "README.md"
DOCS = [README, README.parent / "docs" / "USING.md", README.parent / "docs" / "OPERATIONS.md"]


def _text() -> str:
    return "\n".join(doc.read_text() for doc in DOCS)


def _blocks() -> list[str]:
    return re.findall(r"```(?:sh|bash)\n(.*?)```", _text(), re.S)


def _block(heading: str) -> str:
    """The first code block under ``heading`` (in the README, then the guides)."""
    section = _text().split(heading, 1)[1]
    m = re.search(r"```(?:sh|bash)\n(.*?)```", section, re.S)
    assert m, f"{heading!r} has no code block"
    return m.group(1)


def _walkthrough() -> str:
    return _block("## Five-minute walkthrough")


def _on(server_base: str, data_dir: Path, script: str) -> str:
    """``script`` pointed at this server's port and data dir; each curl's output on a line."""
    body = script.replace("API=http://127.0.0.1:8000", f"API={server_base}")
    body = body.replace(".selectivity/admin.key", str(data_dir / "admin.key"))
    return 'curl() { command curl "$@"; echo; }\n' + body


def _bash(script: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=timeout
    )


RUN_BY = {
    "make run": "test_the_two_commands_are_make_targets",
    "ADMIN=$(cat .selectivity/admin.key)": "test_readme_walkthrough_works_as_written",
    "CURATOR=$(key curator)": "test_readme_annotation_queue_works_as_written",
    "selectivity admin init-coldstore": "test_readme_key_ceremony_works_as_written",
    "selectivity unlock request": "test_readme_break_glass_works_as_written",
}


def test_every_block_is_run() -> None:
    blocks = _blocks()
    assert len(blocks) == len(RUN_BY), f"{len(blocks)} blocks, {len(RUN_BY)} known: add a test"
    for block in blocks:
        assert any(marker in block for marker in RUN_BY), f"no test runs:\n{block[:300]}"


def test_the_two_commands_are_make_targets() -> None:
    block = _block("## The two commands")
    for line in block.splitlines():
        command = line.split("#", 1)[0].strip()
        p = subprocess.run(
            ["make", "-n", *command.split()[1:]],
            cwd=README.parent,
            capture_output=True,
            text=True,
        )
        assert p.returncode == 0, p.stderr


@pytest.mark.skipif(shutil.which("curl") is None, reason="the walkthrough uses curl")
def test_readme_walkthrough_works_as_written(tmp_path: Path) -> None:
    script = _walkthrough()
    assert "ADMIN=$(cat .selectivity/admin.key)" in script and "API=http://127.0.0.1:8000" in script
    with serving(tmp_path) as server:
        p = _bash(_on(server.base, server.data_dir, script))
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


@pytest.mark.skipif(shutil.which("curl") is None, reason="the README uses curl")
def test_readme_annotation_queue_works_as_written(tmp_path: Path) -> None:
    """The queue block, in the walkthrough's shell: the candidates are released after the
    period and one is labelled and exported (the worker runs the release every second)."""
    script = _walkthrough() + _block("## Annotation queues")
    with serving(tmp_path, SCHEDULER_SECONDS="1") as server:
        p = _bash(_on(server.base, server.data_dir, script), timeout=180)
        server.stop()
    assert p.returncode == 0, p.stderr + p.stdout[-2000:]
    outputs = [orjson.loads(x) for x in p.stdout.splitlines() if x.strip()]
    queue, received, labelled, export = outputs[-4:]
    assert queue["name"] == "intents" and queue["delta"] < 1e-6
    assert received == {"received": 300}
    assert labelled["label"] == "1"
    assert [x["label"] for x in export["labels"]] == ["1"]
    assert export["labels"][0]["text"] == "turn on the lights"


def test_readme_key_ceremony_works_as_written(tmp_path: Path) -> None:
    """The key ceremony on a production-like first start: migrated, no key yet."""
    env = cli_env(DATA_DIR=str(tmp_path / "data"))
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    assert cli("migrate", env=env).returncode == 0
    p = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _block("**Key ceremony.**")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    shares = re.findall(r"^share (\d): (.+)$", p.stdout, re.M)
    assert [n for n, _ in shares] == ["1", "2", "3", "4", "5"]
    assert "any 3 open it" in p.stdout
    assert len({s for _, s in shares}) == 5 and all(len(s.split()) >= 20 for _, s in shares)


@pytest.mark.skipif(shutil.which("curl") is None, reason="the README uses curl")
def test_readme_break_glass_works_as_written(tmp_path: Path) -> None:
    """The unlock block, in the walkthrough's shell, with two of the shares of the first start
    (written to a shares file, as an operator whose console is collected would) typed at its
    prompts: granted at 2 of 3, listed, exported with its manifest, closed; the shares and the
    export live in a new private directory (0700, files 0600) under $TMPDIR, the shares only
    until the approvals, and nothing is written where the block runs."""
    shares_file = tmp_path / "shares.txt"
    work = tmp_path / "work"
    work.mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = _walkthrough() + _block("**Unlock (break glass).**")
    with serving(tmp_path, SCHEDULER_SECONDS="1", COLDSTORE_SHARES_FILE=str(shares_file)) as server:
        shares = re.findall(r"^share \d: (.+)$", shares_file.read_text(), re.M)
        env = {**server.env, "PATH": f"{Path(sys.executable).parent}:{server.env['PATH']}"}
        p = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", _on(server.base, server.data_dir, script)],
            input="".join(share + "\n" for share in shares[:2]),
            capture_output=True,
            text=True,
            timeout=180,
            cwd=work,
            env={k: v for k, v in env.items() if not k.startswith("SELECTIVITY_")}
            | {"TMPDIR": str(tmp)},
        )
        server.stop()
    assert p.returncode == 0, p.stderr + p.stdout[-2000:]
    assert list(work.iterdir()) == []
    [private] = tmp.iterdir()
    assert private.stat().st_mode & 0o777 == 0o700
    assert [f.name for f in private.iterdir()] == ["complaint.ndjson"]  # shares removed
    assert (private / "complaint.ndjson").stat().st_mode & 0o777 == 0o600
    assert f"exported to {private}/complaint.ndjson" in p.stdout
    assert not any(share in p.stdout + p.stderr for share in shares)
    exported = [orjson.loads(x) for x in (private / "complaint.ndjson").read_text().splitlines()]
    rows = [x for x in exported if "manifest" not in x]
    manifest = exported[-1]["manifest"]
    assert sorted(r["observation"]["id"] for r in rows) == ["r1", "r2", "r3"], exported
    assert {r["window"] for r in rows} == {1}
    assert '"status": "granted"' in p.stdout and '"status": "closed"' in p.stdout
    assert "window 1: 3 rows" in p.stdout + p.stderr and "window 2" in p.stdout + p.stderr
    assert manifest["rows_per_window"] == [{"window": 1, "rows": 3}]
    assert [w["window"] for w in manifest["not_sealed"]] == [2] and manifest["complete"]

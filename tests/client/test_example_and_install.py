"""The model manager example against the real server (trains, serves, retrains when told),
and ``pip install ./clients/python`` in a fresh venv without the server package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import venv
from importlib import metadata
from pathlib import Path

import httpx
import pytest
import selectivity_client
from selectivity_client import Client

from tests.helpers import stream_body
from tests.serving import serving

pytestmark = pytest.mark.slow  # servers, subprocesses and a venv

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "model_manager" / "model_manager.py"
CLIENT = ROOT / "clients" / "python"


def _rows(n: int, start: int) -> list[dict[str, object]]:
    return [
        {
            "user": f"u{i % 7}",
            "item": f"i{i % 4}",
            "age": 20 + i % 30,
            "label": str(i % 7 < 3 and 1 or 0),
        }
        for i in range(start, start + n)
    ]


def test_the_model_manager_trains_serves_and_retrains_when_told(tmp_path: Path) -> None:
    with serving(tmp_path) as server:
        try:
            _manage(server.base, server.admin_key, tmp_path)
        finally:
            server.stop()


def _example(base: str, key: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--url", base, "--stream", "mm", *args],
        env={
            **os.environ,
            "SELECTIVITY_API_KEY": key,
            # the client as this suite imports it: installed, or its source dir
            "PYTHONPATH": str(Path(selectivity_client.__file__).parents[1]),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _until(proc: subprocess.Popen[str], prefix: str, lines: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(prefix):
            return
    raise AssertionError(f"no line {prefix!r}:\n{''.join(lines)}")


def _manage(base: str, admin_key: str, tmp_path: Path) -> None:
    """The hot period has 1 row when the manager starts: it says what it waits for (50 rows,
    5 of each label), trains once they are there, scores held-out rows, serves; retrains at
    the next roll. Run again, it reuses its model (no 409); --model-name registers another."""
    admin = httpx.Client(
        base_url=base,
        headers={"Authorization": f"Bearer {admin_key}"},
        timeout=60,
    )
    keys = {
        role: admin.post("/v1/admin/keys", json={"role": role}).json()["key"]
        for role in ("model", "producer")
    }
    assert admin.post("/v1/streams", json=stream_body("mm")).status_code == 201
    producer = Client(base, keys["producer"], stream="mm")
    producer.ingest(_rows(200, 0))
    assert admin.post("/v1/streams/mm/roll").json() == {"epoch": 2}
    producer.ingest(_rows(1, 1000))
    serve = tmp_path / "rows.ndjson"
    serve.write_text(
        "".join(
            json.dumps({k: v for k, v in r.items() if k != "label"}) + "\n" for r in _rows(5, 0)
        )
    )
    proc = _example(
        base, keys["model"], "--serve", str(serve), "--retrains", "1", "--poll-seconds", "0.2"
    )
    lines: list[str] = []
    try:
        _until(proc, "waiting for the train set of epoch 2: 1 rows", lines)
        assert "needs 49 more rows" in lines[-1], lines
        producer.ingest(_rows(100, 1001))
        _until(proc, "served 5 rows at epoch 2", lines)
        assert any(x.startswith("trained at epoch 2 on 101 rows") for x in lines), lines
        held_out = next(x for x in lines if x.startswith("held out the newest 20 rows"))
        assert "AUC 1.000" in held_out, held_out  # the label is the user's: learnt exactly
        _until(proc, "following the stream's events", lines)
        assert admin.post("/v1/streams/mm/roll").json() == {"epoch": 3}
        time.sleep(1)
        producer.ingest(_rows(60, 2000))
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(lines) + out
    scored = [x for x in lines if x.startswith("  {")]
    assert len(scored) == 5 and all("with probability" in x for x in scored), lines
    assert "retrain required at epoch 3" in out
    assert "served 5 rows at epoch 3" in out, out
    model_id = lines[0].split()[1]
    assert "registered" in lines[0] and "reused" not in lines[0], lines[0]
    status = Client(base, keys["model"], stream="mm").model(model_id)
    assert status["status"] == "current" and status["trained_epoch"] == 3

    again = _example(base, keys["model"], "--once")
    out, _ = again.communicate(timeout=120)
    assert again.returncode == 0, out
    first = out.splitlines()[0]
    assert first.startswith(f"model {model_id} of stream mm ('lightgbm', registered before: reused")
    assert "trained at epoch 3 on 60 rows" in out and "Conflict" not in out, out

    other = _example(base, keys["model"], "--once", "--model-name", "ranker")
    out, _ = other.communicate(timeout=120)
    assert other.returncode == 0, out
    assert out.startswith("model m_") and "('ranker', registered)" in out.splitlines()[0]
    assert out.split()[1] != model_id
    producer.close()
    admin.close()


def test_the_model_manager_retries_what_a_roll_answers_for_a_moment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """409 (not RetrainRequired), 422 and 503 are retried with backoff; RetrainRequired and
    the last failure are raised."""
    import importlib.util

    from selectivity_client import Conflict, RetrainRequired, Unavailable, ValidationError

    spec = importlib.util.spec_from_file_location("model_manager_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mm)
    slept: list[float] = []
    monkeypatch.setattr(mm.time, "sleep", slept.append)
    errors = [Unavailable("rolling"), Conflict("moved"), ValidationError("epoch: ahead")]

    def flaky() -> str:
        if errors:
            raise errors.pop(0)
        return "ok"

    assert mm.retrying("x", flaky) == "ok" and slept == [1.0, 2.0, 4.0]

    def refused() -> None:
        raise RetrainRequired("retrain")

    with pytest.raises(RetrainRequired):
        mm.retrying("x", refused)

    def down() -> None:
        raise Unavailable("down")

    with pytest.raises(Unavailable):
        mm.retrying("x", down, attempts=3)


def _closure(*names: str) -> set[str]:
    """The installed distributions ``names`` need (their requirements without extras)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
        for req in dist.requires or []:
            if "extra ==" in req:
                continue
            todo.append(
                req.split(";")[0]
                .split("[")[0]
                .split("(")[0]
                .strip()
                .split(" ")[0]
                .split(">")[0]
                .split("<")[0]
                .split("=")[0]
                .split("!")[0]
                .split("~")[0]
            )
    return seen


def test_pip_install_in_a_fresh_venv_without_the_server(tmp_path: Path) -> None:
    """``pip install --no-deps ./clients/python`` (pip fetches only the build backend, as
    ``make install`` does) in a venv that has only httpx and pyarrow and their dependencies,
    linked from this one: the package imports, and ``service`` is not importable there."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    deps = tmp_path / "deps"
    deps.mkdir()
    for name in _closure("httpx", "pyarrow"):
        for f in metadata.distribution(name).files or []:
            top = f.parts[0]
            src = Path(str(f.locate())).parents[len(f.parts) - 1] / top
            if top.endswith(".pth") or top == ".." or top.startswith("__"):
                continue
            if src.exists() and not (deps / top).exists():
                (deps / top).symlink_to(src)
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "deps.pth").write_text(str(deps) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    source = shutil.copytree(
        CLIENT,
        tmp_path / "client",
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
    )  # the build writes beside the sources
    pip = subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            str(source),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert pip.returncode == 0, pip.stderr + pip.stdout
    check = subprocess.run(
        [
            str(py),
            "-c",
            "import importlib.util, sys, selectivity_client as s\n"
            "assert 'site-packages' in s.__file__, s.__file__\n"
            "assert importlib.util.find_spec('service') is None\n"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('service', 'workers')]\n"
            "s.Client('http://127.0.0.1:9', 'k', stream='x').close()\n"
            "print(sorted(s.__all__)[:2])",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == "['AsyncClient', 'BadRequest']"

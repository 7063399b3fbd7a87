"""`selectivity audit reidentify` against `selectivity serve` on the embedded defaults (its
in-process worker runs the audit at the paper's budgets): the CLI shows the audit's progress
stage by stage and prints the release's guarantee and per attack the accuracy over the draws
with its spread, precision, recall and gains, which the stream's privacy ledger then shows."""

from __future__ import annotations

import random
import re
from pathlib import Path

import httpx
import pytest

from tests.serving import cli, serving

pytestmark = pytest.mark.slow  # `selectivity serve` and the CLI in subprocesses


def test_the_cli_shows_progress_and_the_results(tmp_path: Path) -> None:
    with serving(tmp_path) as server:
        env, base = server.env, server.base
        h = {"Authorization": f"Bearer {server.admin_key}"}
        http = httpx.Client(timeout=60)  # a loaded 2-core machine
        body = {
            "name": "clicks",
            "features": [{"name": "user"}, {"name": "item"}],
            "labels": ["0", "1"],
            "hot_windows": 1,
            "privacy": {"mechanism": "laplace", "epsilon": 1.0},
        }
        assert http.post(f"{base}/v1/streams", headers=h, json=body).status_code == 201
        rnd = random.Random(5)
        obs = []
        for _ in range(150):
            item = rnd.randint(0, 9)
            user = f"u{rnd.randint(0, 9)}"
            obs.append(
                {"features": {"user": user, "item": f"i{item}"}, "label": str(int(item < 4))}
            )
        keys = {}
        for role in ("producer", "analyst"):
            p = cli("admin", "create-key", "--role", role, env=env)
            assert p.returncode == 0, p.stderr
            keys[role] = p.stdout.strip()
        ph = {"Authorization": f"Bearer {keys['producer']}"}
        url = f"{base}/v1/streams/clicks/observations"
        assert http.post(url, headers=ph, json={"observations": obs}).status_code == 202
        assert http.post(f"{base}/v1/streams/clicks/roll", headers=h).json() == {"epoch": 2}
        assert http.post(url, headers=ph, json={"observations": obs}).status_code == 202

        p = cli(
            "audit", "reidentify", "--url", base, "--key", keys["analyst"], "--stream", "clicks",
            "--positive-label", "1", "--release", "count_tables",
            "--attacks", "growpu", "nnpu", "kmeans", "--draws", "2", env=env, timeout=600,
        )  # fmt: skip
        assert p.returncode == 0, p.stdout + p.stderr
        out = p.stdout
        assert re.search(r"audit ra_[0-9a-f]{32} started", out), out
        stages = re.findall(r"^\s*(\d+\.\d) % (.+)$", out, flags=re.M)
        # one line per stage seen by the CLI's polls (every 0.5 s): some of the attacks', done
        assert any(s.startswith(("growpu", "nnpu", "oracle")) for _, s in stages), out
        assert stages[-1] == ("100.0", "done"), out
        shares = [float(v) for v, _ in stages]
        assert shares == sorted(shares) and any(0 < v < 100 for v in shares), out
        assert "stream:clicks, release count_tables (ε = 1, laplace): n = 150 records" in out
        assert "guarantee: ε = 1 (laplace), one observation of the count period" in out, out
        for row in ("growPU", "nnPU", "K-means (best assignment)", "prior", "oracle"):
            assert re.search(rf"{re.escape(row)}.*\d+\.\d %", out), (row, out)
        for head in ("precision", "recall", "gain (accuracy)", "s.d.", "draws"):
            assert head in out, (head, out)
        assert re.search(r"growPU .*\d+\.\d-\d+\.\d .* 2 ", out), out  # range, 2 draws

        ah = {"Authorization": f"Bearer {keys['analyst']}"}
        led = http.get(f"{base}/v1/streams/clicks/privacy", headers=ah).json()
        ri = led["reidentification"]
        assert ri["release"] == "count_tables" and ri["epsilon"] == 1.0 and ri["n"] == 150
        assert set(ri["accuracy"]) == {"growpu", "nnpu", "kmeans", "prior", "oracle"}
        prior = f"{100 * ri['accuracy']['prior']:.1f} %"
        assert re.search(rf"prior \(majority class\)\s.*{re.escape(prior)}", out), out
        server.stop()

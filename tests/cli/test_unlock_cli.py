"""Issue 5's flow as an operator runs it, with the real CLI against `selectivity serve` on the
embedded defaults: the first start creates the cold-store key (3 shares, threshold 2) and writes
its shares to the file the operator named outside the data dir (SELECTIVITY_COLDSTORE_SHARES_FILE);
ingest, rolls, the in-process worker seals and expires; an analyst requests, two admins approve
with their shares on stdin (an admin key of the analyst's own actor is refused), the analyst
exports; `audit verify` passes."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests.serving import cli, serving

pytestmark = pytest.mark.slow  # `selectivity serve` and the CLI in subprocesses


def _cli(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    p = cli(*args, env=env, stdin=stdin)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_unlock_flow_over_the_cli(tmp_path: Path) -> None:
    shares_file = tmp_path / "offline" / "shares.txt"
    shares_file.parent.mkdir()
    with (
        serving(tmp_path, SCHEDULER_SECONDS="1", COLDSTORE_SHARES_FILE=str(shares_file)) as server,
        httpx.Client(timeout=60) as http,  # a loaded machine
    ):
        env, base, data = server.env, server.base, server.data_dir
        admin = (data / "admin.key").read_text().strip()
        assert shares_file.stat().st_mode & 0o777 == 0o600
        shares = [
            line.split(": ", 1)[1]
            for line in shares_file.read_text().splitlines()
            if line.startswith("share ")
        ]
        assert len(shares) == 3
        h = {"Authorization": f"Bearer {admin}"}
        body = {
            "name": "clicks",
            "features": [{"name": "user"}, {"name": "item"}],
            "labels": ["0", "1"],
            "hot_windows": 1,
        }
        r = http.post(f"{base}/v1/streams", headers=h, json=body)
        assert r.status_code == 201, r.text
        producer = _cli(env, "admin", "create-key", "--role", "producer").strip()
        analyst = _cli(env, "admin", "create-key", "--role", "analyst", "--actor", "alice").strip()
        admin2 = _cli(env, "admin", "create-key", "--role", "admin").strip()
        alice_admin = _cli(env, "admin", "create-key", "--role", "admin", "--actor", "alice")
        obs = [
            {"id": f"o{i}", "features": {"user": f"u{i % 3}", "item": f"i{i}"}, "label": str(i % 2)}
            for i in range(40)
        ]
        r = http.post(
            f"{base}/v1/streams/clicks/observations",
            headers={"Authorization": f"Bearer {producer}"},
            json={"observations": obs},
        )
        assert r.status_code == 202
        for _ in range(2):
            assert http.post(f"{base}/v1/streams/clicks/roll", headers=h).status_code == 200
        deadline = time.time() + 120
        while time.time() < deadline:  # the worker seals window 1, then expire deletes it
            w = http.get(f"{base}/v1/streams/clicks/windows", headers=h).json()["windows"]
            if any(x["epoch"] == 1 and x["hot_deleted_at"] for x in w):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"window 1 was not sealed and expired: {w}")

        common = ["--url", base]
        out = _cli(
            env,
            "unlock",
            "request",
            *common,
            "--key",
            analyst,
            "--stream",
            "clicks",
            "--from-window",
            "1",
            "--to-window",
            "1",
            "--justification",
            "ticket 42: verify a label",
        )
        rid = orjson.loads(out)["id"]
        assert orjson.loads(out)["requester_actor"] == "alice"
        # alice's admin key cannot approve alice's request (separation of duties)
        p = cli(
            "unlock", "approve", *common, "--key", alice_admin.strip(), rid,
            env=env, stdin=shares[1] + "\n",
        )  # fmt: skip
        assert p.returncode != 0 and "403" in p.stderr and "SelfApproval" in p.stderr
        assert shares[1] not in p.stdout + p.stderr
        out = _cli(env, "unlock", "approve", *common, "--key", admin, rid, stdin=shares[0] + "\n")
        assert orjson.loads(out)["status"] == "pending"
        out = _cli(env, "unlock", "approve", *common, "--key", admin2, rid, stdin=shares[2] + "\n")
        assert orjson.loads(out)["status"] == "granted"
        out = _cli(env, "unlock", "list", *common, "--key", admin, "--status", "granted")
        assert rid in out and "granted" in out and "windows 1..1" in out and "(alice)" in out
        out = _cli(env, "unlock", "list", *common, "--key", admin, "--status", "pending")
        assert rid not in out and "no unlock requests with status pending" in out
        out = _cli(env, "unlock", "list", *common, "--key", analyst)  # an analyst's own
        assert rid in out and "granted" in out
        p = cli("unlock", "list", *common, "--key", producer, env=env)
        assert p.returncode != 0 and "403" in p.stderr
        dest = tmp_path / "export.ndjson"
        out = _cli(env, "unlock", "export", *common, "--key", analyst, rid, "--out", str(dest))
        assert "window 1: 40 rows" in out
        lines = [orjson.loads(x) for x in dest.read_bytes().splitlines()]
        assert lines.pop()["manifest"]["rows_per_window"] == [{"window": 1, "rows": 40}]
        # a second request reaching the open window: the export names it
        out = _cli(
            env,
            "unlock",
            "request",
            *common,
            "--key",
            analyst,
            "--stream",
            "clicks",
            "--from-window",
            "1",
            "--to-window",
            "3",
            "--justification",
            "ticket 43: the open window",
        )
        rid3 = orjson.loads(out)["id"]
        _cli(env, "unlock", "approve", *common, "--key", admin, rid3, stdin=shares[1] + "\n")
        _cli(env, "unlock", "approve", *common, "--key", admin2, rid3, stdin=shares[0] + "\n")
        arrow = tmp_path / "export3.arrow"
        out = _cli(
            env, "unlock", "export", *common, "--key", analyst, rid3, "--format", "arrow",
            "--out", str(arrow),
        )  # fmt: skip
        assert "window 1: 40 rows" in out and "window 3 (open): not (yet) sealed" in out
        p = cli(
            "unlock", "request", *common, "--key", analyst, "--stream", "clicks",
            "--from-window", "1", "--to-window", "4", "--justification", "ticket 44: the future",
            env=env,
        )  # fmt: skip
        assert p.returncode != 0 and "to_window" in p.stderr and "current window is 3" in p.stderr
        _cli(env, "unlock", "close", *common, "--key", analyst, rid3)
        assert sorted(x["observation"]["id"] for x in lines) == sorted(f"o{i}" for i in range(40))
        assert dest.stat().st_mode & 0o077 == 0
        _cli(env, "unlock", "close", *common, "--key", analyst, rid)
        out = _cli(env, "audit", "verify")
        assert out.startswith("ok:")
        actions = [
            e["action"]
            for e in http.get(f"{base}/v1/admin/audit?limit=1000", headers=h).json()["entries"]
        ]
        for a in (
            "coldstore.init_key",
            "stream.create",
            "admin.create_key",
            "stream.forced_roll",
            "unlock.request",
            "unlock.approve",
            "unlock.refused",
            "unlock.grant",
            "unlock.export",
            "unlock.close",
        ):
            assert a in actions, a
        server.stop()
    log = server.log
    assert "OFFLINE" in log and str(shares_file) in log
    for share in shares:  # no share, and no observation, in the server's log
        assert share not in log
    assert "u1" not in log.split() and "o17" not in log

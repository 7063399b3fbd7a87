"""`selectivity audit verify` as an operator runs it (issue 12, item 13): it prints the head and
the anchor; `--expect-head SEQ:HASH` checks the entry at SEQ even after the log grew; a wrong
hash or a log cut at the end fails (exit 1); a malformed value is a one-line error (exit 2)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from tests.serving import cli, cli_env

pytestmark = pytest.mark.slow  # the CLI in subprocesses


def test_audit_verify_checks_the_noted_head_and_the_anchor(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    env = cli_env(DATA_DIR=str(tmp_path / "data"), DATABASE_URL=f"sqlite:///{db}")
    cli("migrate", env=env).check_returncode()
    cli("admin", "create-key", "--role", "model", env=env).check_returncode()  # audited

    ok = cli("audit", "verify", env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    m = re.search(r"head seq (\d+) hash ([0-9a-f]{64})", ok.stdout)
    assert m is not None, ok.stdout
    noted = f"{m[1]}:{m[2]}"
    assert f"seq {m[1]} hash {m[2]}" in ok.stdout.split("anchor ", 1)[1]  # the anchor is shown

    cli("admin", "create-key", "--role", "model", env=env).check_returncode()  # the log grows
    p = cli("audit", "verify", "--expect-head", noted, env=env)
    assert p.returncode == 0 and f"entry {m[1]} has the expected hash" in p.stdout, p.stdout

    wrong = f"{m[1]}:{'0' * 64}"
    p = cli("audit", "verify", "--expect-head", wrong, env=env)
    assert p.returncode == 1 and f"TAMPERED: entry {m[1]}" in p.stdout, p.stdout + p.stderr

    for bad in ("36:0000", f"{m[1]}:{m[2]}:x"):  # (each run of the CLI takes seconds)
        p = cli("audit", "verify", "--expect-head", bad, env=env)
        assert p.returncode == 2, (bad, p.stdout, p.stderr)
        assert p.stdout == "" and len(p.stderr.strip().splitlines()) == 1, (bad, p.stderr)
        assert p.stderr.startswith("error: --expect-head must be SEQ:HASH"), p.stderr

    with sqlite3.connect(db) as conn:  # entries cut from the end, behind the service's back
        conn.execute("DELETE FROM audit_log WHERE seq = (SELECT max(seq) FROM audit_log)")
    p = cli("audit", "verify", env=env)
    assert p.returncode == 1 and "cut from the end" in p.stdout, p.stdout + p.stderr

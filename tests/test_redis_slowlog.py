"""Redis's slow log keeps the first arguments of every slow command in memory, under no key
the expiry deletes: a script call's candidates, a batch's rows. The embedded server and the
compose deployment run with it off."""

from __future__ import annotations

from pathlib import Path

import redis
import yaml

from service import resources
from service.config import Settings
from tests.conftest import Api

ROOT = Path(__file__).resolve().parent.parent
CANARY = "CANARY-SLOWLOG-51c2"


def test_the_embedded_redis_keeps_no_slow_log_of_arguments(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        redis_url=None,
        database_url=None,
        redis_prefix="slowlog",
        embedded_worker=False,
    )
    embedded = resources.EmbeddedRedis(settings)
    try:
        r = redis.Redis(unix_socket_path=embedded.socket)
        assert int(r.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]) < 0
        # a script that takes a while, with a raw value among its arguments
        r.eval("local x = 0 for i = 1, 3000000 do x = x + i end return ARGV[1]", 0, CANARY)
        r.set("k", CANARY)
        assert r.slowlog_len() == 0
        assert CANARY not in repr(r.slowlog_get(128))
        r.close()
    finally:
        embedded.close()


def test_compose_runs_redis_without_a_slow_log() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = compose["services"]["redis"]["command"]
    i = command.index("--slowlog-log-slower-than")
    assert int(command[i + 1]) < 0


async def test_the_service_turns_the_slow_log_off_on_the_redis_it_runs_on(api: Api) -> None:
    """Embedded, or an operator's Redis (the CI's local server): ``resources.build`` turns it
    off where the server allows CONFIG."""
    got = await api.ctx.redis.config_get("slowlog-log-slower-than")
    assert int(got["slowlog-log-slower-than"]) < 0


def test_compose_runs_redis_with_every_write_in_the_aof_before_its_answer() -> None:
    """With ``appendfsync everysec`` a stalled fsync makes Redis hold its AOF writes back for
    up to 2 s while it still answers: a SIGKILL then loses acknowledged batches
    (tests/deploy/test_compose_up.py kills Redis mid-ingest)."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = compose["services"]["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "always"

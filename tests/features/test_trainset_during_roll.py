"""The train set fetched with ``model_id`` while a roll is under way records the training at
the epoch it served, never a 422 (``service.models.service.report_trained``): a roll serves
its new epoch before its commit moves the stream's epoch in SQL."""

from __future__ import annotations

import asyncio

import pytest

from service.lifecycle import roll as lifecycle_roll
from tests.conftest import Api
from tests.helpers import ingest, new_stream, obs


class Stop(Exception):
    pass


async def _model(api: Api, name: str) -> str:
    r = await api.post(f"/v1/streams/{name}/models", role="model", json={"name": "m"})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _trainset(name: str, mid: str) -> str:
    return f"/v1/streams/{name}/trainset?format=ndjson&model_id={mid}"


@pytest.mark.parametrize("hot_windows", [1, 2])
async def test_a_trainset_between_the_served_pointer_and_the_commit(
    api: Api, hot_windows: int
) -> None:
    """The roll stopped after it served epoch 2 and before its commit (the state every poll
    during a roll can meet): the train set of epoch 2 records a training at 2, the model is
    current once the roll completes, and no retraining is asked of it."""
    name = await new_stream(api, "trs", hot_windows=hot_windows, retention_windows=5)
    await ingest(api, name, [obs("u1", "i1", 20, "1"), obs("u2", "i2", 40, "0")])
    mid = await _model(api, name)

    def stop(mark: str) -> None:
        if mark == "aggregated":
            raise Stop(mark)

    with pytest.raises(Stop):
        await lifecycle_roll.roll(ctx=api.ctx, name=name, step=stop)
    assert await api.ctx.stores.windows.served(name) == 2
    r = await api.get(_trainset(name, mid), role="model")
    assert r.status_code == 200, r.text
    assert r.headers["X-Selectivity-Epoch"] == "2"
    # a training claimed beyond the roll under way is still refused
    r = await api.post(f"/v1/streams/{name}/models/{mid}/trained", role="model", json={"epoch": 3})
    assert r.status_code == 422, r.text
    assert await lifecycle_roll.roll(ctx=api.ctx, name=name) == 2  # completes the roll
    out = (await api.get(f"/v1/streams/{name}/models/{mid}", role="model")).json()
    assert out["epoch"] == 2 and out["trained_epoch"] == 2 and out["status"] == "current", out


async def test_polls_during_rolls_never_answer_422(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(api.ctx.settings.rate_limit_table, "export", None)  # polls back to back
    name = await new_stream(api, "trs", hot_windows=1, retention_windows=20)
    await ingest(api, name, [obs("u1", "i1", 20, "1"), obs("u2", "i2", 40, "0")])
    mid = await _model(api, name)
    rolling = True

    async def rolls() -> None:
        nonlocal rolling
        for _ in range(8):
            await lifecycle_roll.roll(ctx=api.ctx, name=name)
            await asyncio.sleep(0)
        rolling = False

    async def polls() -> list[tuple[int, str]]:
        seen = []
        while rolling:
            r = await api.get(_trainset(name, mid), role="model")
            seen.append((r.status_code, r.headers.get("X-Selectivity-Epoch", r.text)))
        return seen

    _, *answers = await asyncio.gather(rolls(), polls(), polls())
    seen = [a for batch in answers for a in batch]
    assert len(seen) >= 8
    assert [a for a in seen if a[0] != 200] == [], seen
    out = (await api.get(f"/v1/streams/{name}/models/{mid}", role="model")).json()
    assert out["epoch"] == 9 and out["trained_epoch"] is not None

"""What an annotator learns from a task id that is not its own (docs/ARCHITECTURE.md,
"Annotation queues", step 4): nothing. Labelling, heartbeating or skipping a task that is not
leased to it, nor labelled by it, gets one answer whether the task does not exist, waits in
the pool, is leased to another annotator or was labelled by another, with whichever label;
only the labeller gets the replay of its own label, and no error carries a label."""

from __future__ import annotations

from typing import Any

import pytest

from service.queues import service as qservice
from tests.conftest import Api
from tests.queues.test_queues import Clock, MaskSpy, make_queue, release, submit


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(qservice, "_now_ms", c)
    return c


@pytest.fixture
def keep_all(monkeypatch: pytest.MonkeyPatch) -> MaskSpy:
    s = MaskSpy(force=True)
    monkeypatch.setattr(qservice, "bernoulli_mask", s)
    return s


async def answer(api: Api, q: str, task: str, who: str, action: str, label: str) -> Any:
    body = {"label": label} if action == "label" else None
    r = await api.post(f"/v1/queues/{q}/tasks/{task}/{action}", who, json=body)
    return r.status_code, r.content.replace(task.encode(), b"<task>")


async def test_a_task_that_is_not_yours_answers_the_same_whatever_its_state_or_label(
    qapi: Api, keep_all: MaskSpy, clock: Clock
) -> None:
    q = await make_queue(qapi, beta=0.5, k=1)
    await submit(qapi, q, [f"task {i}" for i in range(5)])
    await release(qapi, q, clock)
    t = [x["id"] for x in (await qapi.get(f"/v1/queues/{q}/next?n=4", "ann1")).json()["tasks"]]
    labelled_1, labelled_0, leased = t[0], t[1], t[2]
    for task, lab in ((labelled_1, "1"), (labelled_0, "0")):
        r = await qapi.post(f"/v1/queues/{q}/tasks/{task}/label", "ann1", json={"label": lab})
        assert r.status_code == 200 and r.json()["replayed"] is False
    # t[3] is skipped back to the pool (ann1 will not see it again); one more was never leased
    assert (await qapi.post(f"/v1/queues/{q}/tasks/{t[3]}/skip", "ann1")).status_code == 200
    in_pool = t[3]
    states = {
        "labelled 1 by another": labelled_1,
        "labelled 0 by another": labelled_0,
        "leased to another": leased,
        "in the pool": in_pool,
        "no such task": "t_0123456789abcdef",
    }
    for action in ("label", "heartbeat", "skip"):
        for lab in ("0", "1"):
            seen = {
                s: await answer(qapi, q, task, "ann2", action, lab) for s, task in states.items()
            }
            assert len(set(seen.values())) == 1, (action, lab, seen)
            status, body = next(iter(seen.values()))
            assert status == 404 and b"not leased to you" in body
    # the state did not change: ann1 still holds its lease, the labels are the first ones
    r = await qapi.post(f"/v1/queues/{q}/tasks/{leased}/heartbeat", "ann1")
    assert r.status_code == 200
    # the labeller alone gets the replay of its label; a different one is refused, unnamed
    url = f"/v1/queues/{q}/tasks/{labelled_1}/label"
    r = await qapi.post(url, "ann1", json={"label": "1"})
    assert r.status_code == 200 and r.json()["replayed"] is True
    r = await qapi.post(url, "ann1", json={"label": "0"})
    assert r.status_code == 409 and r.json()["detail"] == (
        f"task '{labelled_1}' is already labelled by you; a label is final"
    )
    export = (await qapi.get(f"/v1/queues/{q}/labels", "curator")).json()["labels"]
    assert sorted((x["id"], x["label"]) for x in export) == sorted(
        [(labelled_1, "1"), (labelled_0, "0")]
    )

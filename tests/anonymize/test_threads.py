"""A k-anonymised release's computation, and an iML question's, run on ``audit_threads`` BLAS and
OpenMP threads (``service.core.threads``), as an audit's do: inside SaNGreeA every BLAS and
OpenMP library of the process reports that many threads, whatever the limit outside (3 here:
neither setting, nor this 2-core machine's default), and the limit found before is back after."""

from __future__ import annotations

import random
from typing import Any

import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from service.anonymize import service as anonymize_service
from tests.conftest import Api
from workers.jobs import anonymize_run

QIS = [{"name": "age", "kind": "range"}, {"name": "sex", "kind": "hierarchy"}]


def _rows(n: int) -> list[dict[str, Any]]:
    rnd = random.Random(11)
    return [{"age": rnd.randint(18, 80), "sex": rnd.choice(["F", "M"])} for _ in range(n)]


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[list[dict[str, Any]]]:
    """What threadpoolctl reports each time SaNGreeA starts."""
    seen: list[list[dict[str, Any]]] = []
    real = anonymize_service.anonymize

    def anonymize(*args: Any, **kwargs: Any) -> Any:
        seen.append(threadpool_info())
        return real(*args, **kwargs)

    monkeypatch.setattr(anonymize_service, "anonymize", anonymize)
    return seen


def _limits() -> list[tuple[str, int]]:
    return [(i["filepath"], i["num_threads"]) for i in threadpool_info()]


def _check(inside: list[dict[str, Any]], outside: list[tuple[str, int]], threads: int) -> None:
    assert {n for _, n in outside} == {3}
    assert {i["user_api"] for i in inside} >= {"blas"}, inside
    assert {(i["filepath"], i["num_threads"]) for i in inside} == {
        (path, threads) for path, _ in outside
    }


@pytest.mark.parametrize("threads", [1, 2])
async def test_a_release_runs_on_the_configured_threads(
    api: Api, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    seen = _spy(monkeypatch)
    monkeypatch.setattr(api.ctx.settings, "audit_threads", threads)
    body = {"source": {"rows": _rows(60)}, "k": 5, "quasi_identifiers": QIS}
    r = await api.post("/v1/anonymizations", role="analyst", json=body)
    assert r.status_code == 202, r.text
    with threadpool_limits(limits=3):
        outside = _limits()
        assert (await anonymize_run({"app": api.ctx}, id=r.json()["id"]))["status"] == "done"
        assert _limits() == outside
    [inside] = seen
    _check(inside, outside, threads)


async def test_an_iml_question_is_computed_on_the_configured_threads(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _spy(monkeypatch)
    monkeypatch.setattr(api.ctx.settings, "audit_threads", 2)
    url = "/v1/anonymizations/weights"
    body = {"source": {"rows": _rows(60)}, "k": 5, "quasi_identifiers": QIS}
    with threadpool_limits(limits=3):
        outside = _limits()
        r = await api.post(url, role="analyst", json=body)
        assert r.status_code == 201, r.text
        r = await api.post(f"{url}/{r.json()['session']}", role="analyst", json={"choice": 0})
        assert r.status_code == 200, r.text
        assert _limits() == outside
    assert len(seen) == 2  # the first question, then the next one after the answer
    for inside in seen:
        _check(inside, outside, 2)

"""iML weight sessions over HTTP: each answer moves the weights by the documented rule
(``service.anonymize.iml``), recomputed here from the question as shown (the row and the two
clusters' generalisations), and a simulated human who keeps choosing the cluster that
preserves one attribute drives that attribute's weight up."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from service.anonymize.iml import LEARNING_RATE
from tests.conftest import Api

URL = "/v1/anonymizations/weights"
QIS = [{"name": "age", "kind": "range"}, {"name": "sex", "kind": "hierarchy"}]


def _rows(n: int = 90) -> list[dict[str, Any]]:
    rnd = random.Random(21)
    return [{"age": rnd.randint(18, 80), "sex": rnd.choice(["F", "M"])} for _ in range(n)]


def _d(question: dict[str, Any], span: float) -> list[dict[str, float]]:
    """Per candidate, each attribute's normalised generalisation with the row added, from
    what the answer shows."""
    row = question["row"]
    out = []
    for cl in question["clusters"]:
        text = cl["values"]["age"]
        lo, _, hi = text.partition("-")
        lo_f, hi_f = float(lo), float(hi or lo)
        age = (max(hi_f, row["age"]) - min(lo_f, row["age"])) / span
        sex = 0.0 if cl["values"]["sex"] == row["sex"] else 1.0  # flat tree: leaf 0, '*' 1
        out.append({"age": age, "sex": sex})
    return out


async def _play(api: Api, prefers: str, answers: int) -> list[dict[str, float]]:
    rnd = random.Random(5)
    rows = _rows()
    span = max(r["age"] for r in rows) - min(r["age"] for r in rows)
    r = await api.post(
        URL, role="analyst", json={"source": {"rows": rows}, "k": 5, "quasi_identifiers": QIS}
    )
    assert r.status_code == 201, r.text
    out = r.json()
    session = out["session"]
    assert out["weights"] == pytest.approx({"age": 1.0, "sex": 1.0})
    history = [out["weights"]]
    for _ in range(answers):
        d = _d(out["question"], span)
        # the simulated human cares only for `prefers`: the cluster that generalises it less,
        # either one (at random, seeded) when both generalise it alike
        if d[0][prefers] == d[1][prefers]:
            choice = rnd.randint(0, 1)
        else:
            choice = 0 if d[0][prefers] < d[1][prefers] else 1
        w = out["weights"]
        raw = {a: w[a] * math.exp(LEARNING_RATE * (d[1 - choice][a] - d[choice][a])) for a in w}
        mean = sum(raw.values()) / len(raw)
        r = await api.post(f"{URL}/{session}", role="analyst", json={"choice": choice})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["weights"] == pytest.approx({a: v / mean for a, v in raw.items()}, rel=1e-9)
        history.append(out["weights"])
    assert out["answered"] == answers
    return history


@pytest.mark.parametrize(("prefers", "other"), [("age", "sex"), ("sex", "age")])
async def test_answers_move_the_weights_toward_the_preserved_attribute(
    api: Api, prefers: str, other: str
) -> None:
    history = await _play(api, prefers, 20)
    ratios = [w[prefers] / w[other] for w in history]
    # each answer's step is checked exactly in _play; over the game the attribute the human
    # keeps choosing by gains weight against the other
    assert ratios[-1] > ratios[0]
    assert history[-1][prefers] > 1.0 > history[-1][other]


async def test_sessions_limits_and_roles(api: Api) -> None:
    rows = _rows()
    body = {"source": {"rows": rows}, "k": 5, "quasi_identifiers": QIS}
    r = await api.post(URL, role="producer", json=body)
    assert r.status_code == 403, r.text
    r = await api.post(URL, role="analyst", json={**body, "k": 31})  # 90 rows < 3·31
    assert r.status_code == 422 and "sample" in r.json()["detail"], r.text
    r = await api.post(URL, role="analyst", json={**body, "sample": 2001})
    assert r.status_code == 422 and "sample" in r.json()["detail"], r.text
    r = await api.post(f"{URL}/iw_{'0' * 32}", role="analyst", json={"choice": 0})
    assert r.status_code == 404, r.text
    r = await api.post(URL, role="analyst", json=body)
    session = r.json()["session"]
    r = await api.post(f"{URL}/{session}", role="analyst", json={"choice": 2})
    assert r.status_code == 422 and "choice" in r.json()["detail"], r.text
    pttl = await api.ctx.redis.pttl(api.ctx.keys.anonymization(session, "iml"))
    assert 0 < pttl <= 3600 * 1000

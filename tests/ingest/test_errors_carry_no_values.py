"""A refused batch's error names the field and the rule, never the value it refused: an error
body is logged by proxies and clients, and must not become a copy of a raw row."""

from __future__ import annotations

from tests.conftest import Api, unique

CANARY = "CANARY-NUMERIC-9d1e"


async def test_a_numeric_feature_given_text_is_refused_without_repeating_it(api: Api) -> None:
    name = unique("noecho")
    body = {
        "name": name,
        "features": [{"name": "x", "kind": "numeric", "buckets": [0, 1]}, {"name": "c"}],
        "labels": ["0", "1"],
        "sketch": {"width": 64, "depth": 2},
        "privacy": {"mechanism": "none"},
    }
    r = await api.post("/v1/streams", json=body)
    assert r.status_code == 201, r.text
    rows = [{"features": {"x": CANARY, "c": "a"}, "label": "1"}]
    r = await api.post(
        f"/v1/streams/{name}/observations", role="producer", json={"observations": rows}
    )
    assert r.status_code == 422, r.text
    assert "x" in r.text and "number" in r.text
    assert CANARY not in r.text and CANARY[:20] not in r.text

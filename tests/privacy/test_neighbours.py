"""The count tables' per-observation guarantee against a brute-force neighbour search
(docs/ARCHITECTURE.md, "Privacy"; ``service.core.dp.budget``).

Every data set of up to three observations over a tiny domain (two users, two values of each
of two features, two labels: 16 observations, 4,368 ordered data sets), in arrival order,
goes through the counting path itself: hot rows as ingest writes them parsed by
``parse_rows``, the per-user bound ``within_bound``, ``count_increments`` with the stream's
own hash seed. For
every pair of neighbours (one observation added or removed; one replaced by another) the
difference of the tables is measured in L1 and L2, and checked against the noise the stream
was given and against what ``GET /v1/streams/{s}/privacy`` reports per observation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import orjson
import pytest

from service.core.features.columns import Encoded
from service.core.features.counting import Parsed, count_increments, parse_rows, within_bound
from service.core.features.runtime import StreamRuntime
from service.streams import service as streams
from tests.conftest import Api
from tests.helpers import new_stream

USERS = ("u1", "u2")
A = ("x", "y")
B = ("p", "q")
LABELS = ("0", "1")
DOMAIN = [
    {"user": u, "a": a, "b": b, "label": y} for u, a, b, y in itertools.product(USERS, A, B, LABELS)
]
MAX_LEN = 3


def _body(c: int, calibration: str, mechanism: str = "laplace") -> dict:
    budget = {"epsilon": 1.0} if mechanism == "laplace" else {"rho": 0.5}
    return {
        "features": [{"name": "user"}, {"name": "a"}, {"name": "b"}],
        "labels": list(LABELS),
        "max_tables": 4,
        "sketch": {"width": 64, "depth": 3},
        "privacy": {
            "mechanism": mechanism,
            **budget,
            "user_key": "user",
            "max_contributions_per_window": c,
            "table_calibration": calibration,
        },
    }


def _parsed(rt: StreamRuntime) -> Parsed:
    """Every observation of DOMAIN as ingest writes hot rows, parsed for counting."""
    rows = b",".join(
        orjson.dumps(
            {
                "id": None,
                "f": {k: v for k, v in o.items() if k != "label"},
                "y": o["label"],
                "t": None,
            }
        )
        for o in DOMAIN
    )
    return parse_rows(rt, rows, after=b"", last=b"1-1")[0]


def _tables(rt: StreamRuntime, data: tuple[int, ...], parsed: Parsed | None = None) -> np.ndarray:
    """The increments the counting path makes for ``data`` (indices into DOMAIN, in arrival
    order), as one dense vector: every table's cells, then the prior's."""
    parsed = parsed or _parsed(rt)
    assert parsed.users is not None
    size = len(rt.tables) * rt.spec.cells + rt.spec.n_labels
    out = np.zeros(size, np.int64)
    idx = np.array(data, np.int64)
    seen = np.zeros(len(parsed.user_ids), np.int64)
    bound = rt.config.privacy.max_contributions_per_window
    mask, _ = within_bound(parsed.users[idx], seen, bound)
    rows = idx[mask]
    encoded = {f: Encoded(e.codes[rows], e.keys) for f, e in parsed.encoded.items()}
    inc = count_increments(rt, rt.tables, encoded, parsed.labels[rows])
    for i in range(inc.n_tables):
        lo, hi = int(inc.bounds[i]), int(inc.bounds[i + 1])
        np.add.at(out, i * rt.spec.cells + inc.cells[lo:hi], inc.deltas[lo:hi])
    return out


def _search(rt: StreamRuntime) -> dict[str, tuple[int, float]]:
    """Max (L1, L2) of the tables' difference over every pair of neighbours: ``add_remove``
    (one observation added anywhere in the arrival order, or removed) and ``replace`` (one
    observation replaced by another at its place)."""
    datasets = [
        data for n in range(MAX_LEN + 1) for data in itertools.product(range(len(DOMAIN)), repeat=n)
    ]
    index = {data: i for i, data in enumerate(datasets)}
    parsed = _parsed(rt)
    vec = np.stack([_tables(rt, data, parsed) for data in datasets])
    pairs: dict[str, list[tuple[int, int]]] = {"add_remove": [], "replace": []}
    for data, i in index.items():
        for pos in range(len(data)):
            # (adding is the same pair, reversed)
            pairs["add_remove"].append((i, index[data[:pos] + data[pos + 1 :]]))
            for o in range(len(DOMAIN)):
                pairs["replace"].append((i, index[data[:pos] + (o,) + data[pos + 1 :]]))
    worst = {}
    for kind, pp in pairs.items():
        left, right = np.array(pp).T
        d = vec[left] - vec[right]
        worst[kind] = (int(np.abs(d).sum(axis=1).max()), float(np.sqrt((d * d).sum(axis=1).max())))
    return worst


async def _stream(api: Api, c: int, calibration: str, mechanism: str = "laplace"):
    name = await new_stream(api, "nb", **_body(c, calibration, mechanism))
    rt = await streams.runtime(ctx=api.ctx, name=name)
    r = await api.get(f"/v1/streams/{name}/privacy", role="analyst")
    assert r.status_code == 200, r.text
    return rt, r.json()


def test_the_counter_example_swaps_two_counted_observations() -> None:
    """Features user, a, b; max_tables 4; depth 3; c = 1: D = {o1, o2} of one user and
    D' = {o2} differ by L1 = 20 (o1 counted in D, o2 in D'), more than the 12 = c·T·depth of
    the rule before max(c, 2); under max(c, 2) the noise is calibrated to 24."""
    from service.core.dp.budget import noise_for
    from service.core.streamconfig import StreamCreate

    cfg = StreamCreate.model_validate({"name": "cx", **_body(1, "max_c_2")})
    rt = StreamRuntime(id=1, name="cx", config=cfg, hash_seed=bytes(32), tables=_refs(cfg))
    o1 = DOMAIN.index({"user": "u1", "a": "x", "b": "p", "label": "0"})
    o2 = DOMAIN.index({"user": "u1", "a": "y", "b": "q", "label": "1"})
    d = _tables(rt, (o1, o2)) - _tables(rt, (o2,))
    assert int(np.abs(d).sum()) == 20  # 2 observations × (3 tables × depth 3 + the prior)
    assert noise_for(cfg).l1_sensitivity == 24 >= 20
    old = StreamCreate.model_validate({"name": "cx", **_body(1, "c")})
    assert noise_for(old).l1_sensitivity == 12 < 20


def _refs(cfg):
    from service.core.features.columns import table_name
    from service.core.features.runtime import TableRef

    return tuple(
        TableRef(i, table_name([f.name]), (f.name,), 1) for i, f in enumerate(cfg.features, 1)
    )


@pytest.mark.slow  # a brute-force search over 4,368 data sets, 10 to 20 s each
@pytest.mark.parametrize(("c", "calibration"), [(1, "max_c_2"), (2, "max_c_2"), (1, "c")])
async def test_no_neighbour_exceeds_the_reported_per_observation_guarantee(
    api: Api, c: int, calibration: str
) -> None:
    """Laplace: the tables are (L1/b)-DP for a pair at L1 distance; the ledger's per-observation
    ε of the count tables must be at least the largest L1/b of any add/remove pair, and twice
    it at least that of any replacement (a removal and an addition). New streams (max(c, 2))
    stay within their noise's Δ1 and within the stream's ε; a stream calibrated to c = 1 (the
    rule before) is reported at 2ε."""
    rt, led = await _stream(api, c, calibration)
    worst = _search(rt)
    tables = led["observation"]["parts"][0]
    assert tables["name"] == "count_tables"
    b = tables["parameters"]["noise_scale"]
    assert b == pytest.approx(rt.noise.scale)
    l1, _ = worst["add_remove"]
    assert tables["epsilon"] >= l1 / b - 1e-12, (worst, tables["epsilon"])
    assert 2 * tables["epsilon"] >= worst["replace"][0] / b - 1e-12
    assert led["observation"]["neighbour"] == "add or remove one observation"
    if calibration == "max_c_2":
        assert l1 <= rt.noise.l1_sensitivity
        assert tables["epsilon"] <= 1.0 + 1e-12  # the stream's ε holds per observation
    else:  # c = 1 as calibrated before: a swap of two counted observations, 2ε
        assert l1 == 2 * 4 * 3 - 4 and l1 > rt.noise.l1_sensitivity  # 20 > 12
        assert tables["epsilon"] == pytest.approx(2.0)
    # per user, one window: c observations, (c/k)·ε ≤ ε
    user_tables = led["user"]["parts"][0]
    assert user_tables["parameters"]["epsilon_per_window"] <= 1.0 + 1e-12


@pytest.mark.slow  # a brute-force search over 4,368 data sets, 10 to 20 s each
@pytest.mark.parametrize("calibration", ["max_c_2", "c"])
async def test_gaussian_no_neighbour_exceeds_the_reported_rho(api: Api, calibration: str) -> None:
    """Gaussian: a pair at L2 distance Δ is (Δ²/2σ²)-zCDP; the ledger's per-observation ρ of the
    count tables must be at least the largest over add/remove pairs."""
    rt, led = await _stream(api, 1, calibration, mechanism="gaussian")
    worst = _search(rt)
    tables = led["observation"]["parts"][0]
    sigma = tables["parameters"]["noise_scale"]
    _, l2 = worst["add_remove"]
    assert tables["rho"] >= l2**2 / (2 * sigma**2) - 1e-12, (worst, tables["rho"])
    if calibration == "max_c_2":
        assert l2 <= rt.noise.l2_sensitivity + 1e-9
        assert tables["rho"] <= 0.5 + 1e-12
    assert math.isfinite(led["observation"]["epsilon"])

"""The synthetic click log (`service.cli.synthetic`): seeded, Criteo-shaped, with the documented
ground truth."""

from __future__ import annotations

import numpy as np

from service.cli.synthetic import ClickLogSpec, generate, numeric_edges, stream_body
from service.streams.schemas import StreamCreate


def test_seeded_and_shaped() -> None:
    a, b, c = generate(5000, seed=7), generate(5000, seed=7), generate(5000, seed=8)
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.label, b.label)
    assert not np.array_equal(a.codes, c.codes)
    assert a.codes.shape == (5000, 26) and a.numeric.shape == (5000, 13)
    cards = a.spec.cardinalities
    assert cards[0] == 4 and cards[-1] == 1_000_000 and np.all(np.diff(cards) > 0)
    assert np.all(a.codes < cards) and np.all(a.codes >= -1)
    assert set(np.unique(a.label).tolist()) == {0, 1}
    assert 0.1 < a.label.mean() < 0.4  # a click rate in Criteo's range


def test_zipf_heads_and_missing_values() -> None:
    log = generate(20_000, seed=1)
    col = log.codes[:, 20]  # ~83k categories
    present = col[col >= 0]
    _, counts = np.unique(present, return_counts=True)
    top = np.sort(counts)[::-1]
    # Finite Zipf with s = 1.1: the most frequent category is far above the median one.
    assert top[0] > 50 * np.median(counts)
    assert 0.005 < (col < 0).mean() < 0.05  # ~2% missing
    assert np.isnan(log.numeric).any() and (log.numeric[~np.isnan(log.numeric)] >= 0).all()


def test_ground_truth_is_the_documented_logistic_model() -> None:
    log = generate(3000, seed=2)
    t = log.truth
    codes = log.codes
    logit = np.full(len(log), t.intercept)
    # A missing category keeps its hidden category's effect: check the complete rows.
    present = np.all(codes >= 0, axis=1)
    for j, effect in enumerate(t.effects):
        logit[present] += effect[codes[present, j]]
    z = (np.log1p(log.numeric) - t.log_mean) / t.log_std
    logit += np.where(np.isnan(log.numeric), 0.0, z) @ t.beta
    p = 1 / (1 + np.exp(-logit))
    assert np.allclose(p[present], log.p[present])


def test_views_agree() -> None:
    log = generate(200, seed=3)
    rows = log.rows(10, 20)
    cols = log.columns(10, 20)
    assert len(rows) == 10
    for i, row in enumerate(rows):
        for name, values in cols.items():
            assert row.get(name) == values[i]  # missing: absent from the row, None in the column
    obs = log.observations(10, 12)
    assert obs[0]["id"] == "r10" and obs[0]["label"] in ("0", "1")
    frame = log.frame(10, 20)
    assert list(frame.columns) == log.spec.categorical_names and len(frame) == 10
    assert isinstance(rows[0]["C1"], str) and len(rows[0]["C1"]) == 8


def test_stream_body_is_a_valid_stream() -> None:
    cfg = StreamCreate.model_validate(stream_body("clicks"))
    assert len(cfg.features) == 39
    assert cfg.features[-1].buckets == numeric_edges() and cfg.features[-1].passthrough
    small = StreamCreate.model_validate(stream_body("cats", ClickLogSpec(), numeric=False))
    assert [f.name for f in small.features] == ClickLogSpec().categorical_names

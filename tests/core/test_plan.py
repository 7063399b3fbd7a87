"""The budget planner (``service.core.dp.plan``): its proposals are valid stream configurations,
move the right way with the stream's size and the target, split the budget as documented, and
— on the simulator at ×3 MovieLens, a size the rule was not fitted on (×1 and ×10) — the
proposed configuration meets its DP-cost target."""

from __future__ import annotations

import re
import shlex
import statistics
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from bench import movielens
from bench.accuracy import simulator
from bench.accuracy.plan import Privacy, Sketching
from bench.accuracy.plan import make_plan as cuts_plan
from bench.accuracy.regime import CUTS, TRAINING
from service.cli.entry import main as cli
from service.core.dp.budget import budget_split
from service.core.dp.plan import (
    HOT_PREFERRED,
    MIN_HOT_ROWS,
    SNR_CAP,
    Plan,
    PlanRequest,
    dp_cost,
    make_plan,
    split,
)
from service.core.streamconfig import MAX_WINDOW_CELLS, StreamCreate
from tests.conftest import shared_data

ML = {
    "user_id": 943,
    "movie_id": 1682,
    "genres": 216,
    "age": 7,
    "gender": 2,
    "occupation": 21,
    "zip3": 382,
}


def plan(n: int, **kw: Any) -> Plan:
    return make_plan(PlanRequest(observations_per_window=n, cardinalities=ML, **kw))


@pytest.mark.parametrize("n", [100, 1000, 10_000, 100_000, 10**7])
@pytest.mark.parametrize("target", [{"target_loss": 1.03}, {"target_dp_cost": 1.02}])
def test_a_proposal_is_a_valid_stream_whose_split_is_the_plans(n: int, target: dict) -> None:
    p = plan(n, **target)
    cfg = StreamCreate.model_validate(p.stream_body("planned"))
    assert cfg.privacy.epsilon == p.epsilon <= 1.0
    assert cfg.sketch.width >= max(ML.values()) > cfg.sketch.width / 2 and cfg.sketch.depth == 3
    by_table = {r["table"]: r for r in budget_split(cfg)}
    for t in p.tables:  # the service gives every table the ε_t the plan computed
        assert by_table[t.table]["epsilon"] == pytest.approx(t.epsilon, rel=1e-6)
    assert sum(t.epsilon for t in p.tables) == pytest.approx(p.epsilon, rel=1e-9)
    if p.feasible:
        assert p.predicted_dp_cost <= target.get("target_dp_cost", 9) + 1e-9
        assert p.predicted_loss <= target.get("target_loss", 9) + 1e-9


def test_more_observations_never_need_more_epsilon_or_a_longer_window() -> None:
    """With room for raw data (a year), so that every size is feasible."""
    year = 366 * 86400
    for target in ({"target_loss": 1.03}, {"target_dp_cost": 1.02}, {"target_dp_cost": 1.05}):
        sizes = (300, 1000, 3000, 10_000, 30_000, 100_000)
        proposals = [plan(n, max_hot_seconds=year, **target) for n in sizes]
        assert all(p.feasible for p in proposals), target
        for small, large in zip(proposals, proposals[1:], strict=False):
            assert large.window_multiplier <= small.window_multiplier, target
            if large.window_multiplier == small.window_multiplier:
                assert large.epsilon <= small.epsilon, target
        # and over the range something strictly improves
        first, last = proposals[0], proposals[-1]
        assert (last.window_multiplier, last.epsilon) < (first.window_multiplier, first.epsilon)


def test_a_tighter_target_costs_more_epsilon() -> None:
    eps = [plan(3000, target_dp_cost=t, max_epsilon=10).epsilon for t in (1.05, 1.03, 1.02)]
    assert eps[0] < eps[1] < eps[2]


def test_an_unreachable_target_says_so() -> None:
    p = plan(10, target_dp_cost=1.001, max_epsilon=0.1)
    assert not p.feasible and p.why[0].startswith("not feasible")
    StreamCreate.model_validate(p.stream_body("still-valid"))


def test_the_split_fills_tables_to_the_cap_and_shares_the_rest() -> None:
    a = {"big": 1000.0, "mid": 10.0, "small": 1.0, "(prior)": 1e5}
    eps = split(a, 2.0)
    assert sum(eps.values()) == pytest.approx(2.0)
    assert eps["big"] * a["big"] == pytest.approx(SNR_CAP)  # just enough
    assert eps["(prior)"] * a["(prior)"] == pytest.approx(SNR_CAP)
    assert eps["mid"] == pytest.approx(eps["small"])  # the rest equally
    assert dp_cost(1.0) > dp_cost(2.0) > dp_cost(SNR_CAP) > 1.0


def test_the_guides_command_prints_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    guide = (Path(__file__).parents[2] / "docs" / "USING.md").read_text()
    found = re.search(r"`selectivity privacy plan (--[^`]*)`", guide.replace("\n", " "))
    assert found, "docs/USING.md's planning command"
    argv = shlex.split(found.group(1))
    cli(["privacy", "plan", *argv])
    out = capsys.readouterr().out
    expected = make_plan(
        PlanRequest(
            observations_per_window=3000,
            cardinalities={"user_id": 943, "movie_id": 1682},
            target_loss=1.03,
        )
    )
    assert out.startswith(f"proposal: laplace epsilon={expected.epsilon:g} per window")
    assert f"sketch {expected.width} x 3" in out and "why:" in out and "movie_id: 1,682 keys" in out
    assert f"hot_windows={expected.hot_windows}," in out
    assert f"raw data held (the hot period): {expected.raw_rows_held:,} rows" in out
    assert "selection: off, max_tables=3 (no slot reserved)" in out
    with pytest.raises(SystemExit, match="cardinalities.user_id: Input should be greater"):
        cli(["privacy", "plan", "--observations-per-window", "10", "--cardinality", "user_id=0"])


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"observations_per_window": 0}, "observations_per_window"),
        ({"cardinalities": {}}, "cardinalities"),
        ({"cardinalities": {"user": 0}}, "cardinalities"),
        ({"target_loss": 1.0}, "target_loss"),
        ({"max_exposure": 0.9}, "max_exposure"),
        ({"depth": 17}, "depth"),
    ],
)
def test_bad_input_names_the_field(over: dict, field: str) -> None:
    body = {"observations_per_window": 1000, "cardinalities": {"user": 10}} | over
    with pytest.raises(ValidationError) as exc:
        PlanRequest.model_validate(body)
    assert field in str(exc.value)


@pytest.mark.slow  # the simulator's calibration (~15 s) and 7 small count-feature runs
def test_the_proposal_meets_its_target_on_the_simulator_at_an_unfitted_size() -> None:
    """×3 MovieLens ("more users", 300,000 events): the rule was fitted at ×1 and ×10. The
    planner gets the stream's figures (3,000 observations per 1 % window, the keys' counts, a
    count period of about 69 windows: the mean of the run's 49, 69 and 89) and a DP-cost target
    of 1.03; the simulator runs the proposed ε, split and sketch through ``service.core`` at the
    regime benchmark's cuts, 6 noise draws. At this size the rule under-predicts: over 14
    draws (the development runs) the DP cost was 1.043 (s.d. 0.013 per draw) against 1.029
    predicted, so the target is missed by about 1.3 points (BENCHMARKS.md "Planning a stream's
    budget"). What is checked is the rule's stated accuracy: measured ≤ predicted + 0.03
    (about 3 standard errors of a 6-draw mean above the development mean); and that the
    proposal is not vacuous: at ε/30 the same streams cost more than the target."""
    shared_data("movielens-100k", "ratings.parquet", "users.parquet", "items.parquet")
    cal = simulator.fit(movielens.load())
    df = simulator.simulate(cal, 3, 2018, grow="users")
    cards = {f: int(df[f].nunique()) for f in movielens.FEATURES if f != "age"} | {"age": 7}
    target = 1.03
    p = make_plan(
        PlanRequest(
            observations_per_window=len(df) // 100,
            cardinalities=cards,
            target_dp_cost=target,
            max_exposure=1 / 70,
            max_epsilon=4,
            hot_windows=1,
        )
    )
    assert p.feasible and p.window_multiplier == 1, p.why
    weights = (*p.table_weights.items(), ("prior", p.prior_weight))
    sketching = Sketching(width=p.width, depth=p.depth, weights=weights)
    arm = simulator.ColumnArm(df, sketching, TRAINING)
    cuts = cuts_plan(len(df), CUTS)

    def loss(privacy: Privacy, draw: int = 0) -> float:
        evals = arm.run(cuts, 0.01, privacy, draw=draw, kinds=("median",))
        return statistics.fmean(e.log_loss for e in evals)

    clean = loss(Privacy("none"))
    at_plan = statistics.fmean(loss(Privacy("laplace", p.epsilon), d) for d in range(6))
    assert at_plan / clean <= p.predicted_dp_cost + 0.03, (at_plan / clean, p.why)
    # ε/8 cost 1.029 once in CI (2 draws): too close to the target to say "vacuous" reliably
    starved = statistics.fmean(loss(Privacy("laplace", p.epsilon / 30), d) for d in range(2))
    assert starved / clean > target, (starved / clean, p.why)


def test_no_slot_is_reserved_unless_selection_is_asked_for() -> None:
    p = plan(10_000)
    body = p.stream_body("planned")
    assert p.selection_slots == 0 and body["max_tables"] == len(ML) + 1
    assert "epsilon_selection" not in body["privacy"]
    cfg = StreamCreate.model_validate(body)
    assert {r["table"] for r in budget_split(cfg)} == {*ML, "(prior)"}  # no "(selected groups)"
    assert any(w.startswith("slots for selected groups: none") for w in p.why)


@pytest.mark.parametrize("slots", [None, 2])
def test_slots_for_selection_are_planned_with_their_cost(slots: int | None) -> None:
    """With ``epsilon_selection``: S slots (4 by default) at weight 1 beside the n = 8 tables of
    mean weight 1; each slot's share 1/(n + S), every table's Laplace scale ×(n + S)/n at the
    same ε, and the service splits the stream body as planned, the slots included."""
    p = plan(10_000, epsilon_selection=0.1, selection_slots=slots)
    s, n = slots or 4, len(ML) + 1
    assert p.selection_slots == s and p.slot_share == pytest.approx(1 / (n + s))
    assert p.slot_noise_factor == pytest.approx((n + s) / n)
    body = p.stream_body("planned")
    assert body["max_tables"] == n + s and body["privacy"]["epsilon_selection"] == 0.1
    cfg = StreamCreate.model_validate(body)
    rows = {r["table"]: r for r in budget_split(cfg)}
    assert rows["(selected groups)"]["slots"] == s
    assert rows["(selected groups)"]["share"] == pytest.approx(p.slot_share, rel=1e-6)
    for t in p.tables:  # the tables get the ε_t planned, the slots the rest
        assert rows[t.table]["epsilon"] == pytest.approx(t.epsilon, rel=1e-6)
    assert sum(t.epsilon for t in p.tables) == pytest.approx(p.epsilon * n / (n + s), rel=1e-9)
    # the slots cost ε: the same window needs less without them
    assert p.epsilon_without_slots is not None and p.epsilon_without_slots < p.epsilon
    assert any(f"slots for selected groups: {s}, each" in w for w in p.why)


def test_slots_without_selection_are_refused_naming_the_field() -> None:
    body = {"observations_per_window": 1000, "cardinalities": {"user": 10}}
    for over in ({"selection_slots": 2}, {"selection_slots": 0, "epsilon_selection": 0.1}):
        with pytest.raises(ValidationError, match="selection_slots"):
            PlanRequest.model_validate(body | over)


def test_the_hot_period_is_chosen_from_the_rate() -> None:
    """H = min(budget, max(rows needed, 3)): 3 windows of a fast stream; as many as hold the
    model's minimum of hot rows on a slow one (hourly windows of 100: 10); never past
    max_hot_seconds; an explicit hot_windows is kept. The exposure cost is stated."""
    fast = plan(100_000)
    assert fast.window_multiplier == 1 and fast.hot_windows == HOT_PREFERRED
    assert fast.raw_rows_held == 3 * 100_000 and fast.raw_hours_held == pytest.approx(72)
    assert fast.exposure <= 0.01 + 1e-12
    assert any(w.startswith(f"exposure cost: {3 * 100_000:,} raw rows held") for w in fast.why)
    slow = make_plan(
        PlanRequest(
            observations_per_window=100,
            cardinalities={"a": 3, "b": 2},
            window_seconds=3600,
            target_dp_cost=1.5,
        )
    )
    assert slow.window_multiplier == 1 and slow.hot_windows == MIN_HOT_ROWS // 100
    tight = plan(100_000, max_hot_seconds=2 * 86400)
    assert tight.hot_windows == 2 and tight.raw_hours_held <= 48
    assert plan(100_000, hot_windows=1).hot_windows == 1  # the override
    for n in (1000, 3000, 10_000):
        p = plan(n, max_hot_seconds=5 * 86400)
        assert p.hot_windows * p.window_seconds <= 5 * 86400, p.why


def test_a_raw_data_budget_too_small_says_so() -> None:
    p = plan(300, target_loss=1.03)  # 7 days of raw rows do not reach the target
    assert not p.feasible and "max_hot_seconds" in p.why[0]
    assert p.hot_windows * p.window_seconds <= 7 * 86400
    assert plan(300, target_loss=1.03, max_hot_seconds=366 * 86400).feasible
    with pytest.raises(ValidationError, match="max_hot_seconds"):
        PlanRequest(
            observations_per_window=10, cardinalities={"a": 2}, max_hot_seconds=3600,
            window_seconds=86400,
        )  # fmt: skip


def test_partitions_are_proposed_for_the_peak_rate_and_capped_by_memory() -> None:
    """One part per PART_ROWS_PER_SECOND of peak ingest (at most 39 features: fewer are not
    assumed faster; more make a part slower), the mean rate by default, no more parts than a
    window's cells allow; the proposal is a stream the service accepts."""
    quiet = plan(10_000)  # 10,000 a day: one part, and the body says nothing of parts
    assert quiet.partitions == 1 and "partitions" not in quiet.stream_body("planned")
    hot = plan(10**6, peak_rows_per_second=95_000)
    assert hot.partitions == 5  # ceil(95,000 / 20,000)
    cfg = StreamCreate.model_validate(hot.stream_body("planned"))
    assert cfg.partitions == 5
    assert any(w.startswith("partitions: 5 (") for w in hot.why)
    wide = {f"f{i}": 10 for i in range(52)}  # 4/3 the features: 3/4 the rows a part
    p = make_plan(
        PlanRequest(observations_per_window=10**6, cardinalities=wide, peak_rows_per_second=95_000)
    )
    assert p.partitions == 7  # ceil(95,000 / 15,000)
    huge = make_plan(  # 50 parts wanted; the widest sketch leaves room for fewer
        PlanRequest(
            observations_per_window=10**9,
            cardinalities={"a": 10**9, "b": 10**9},
            peak_rows_per_second=10**6,
        )
    )
    fits = MAX_WINDOW_CELLS // (huge.width * huge.depth * 2 * 3)
    assert huge.partitions == fits < 50
    assert any(f"partitions capped at {fits} from 50" in w for w in huge.why)
    StreamCreate.model_validate(huge.stream_body("planned"))

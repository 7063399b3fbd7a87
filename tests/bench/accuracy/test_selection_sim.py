"""The selection-on-the-simulator benchmark (``bench.accuracy.selection_sim``): every arm has the
same noise per table whatever groups it counts, a group is counted as the joined values its
table would count, and the rounds follow the service bench's schedule."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench import movielens
from bench.accuracy import selection_sim
from bench.accuracy.plan import Privacy


def test_the_noise_per_table_does_not_depend_on_the_groups_counted() -> None:
    privacy = Privacy("laplace", 1.0)
    plain = selection_sim.GroupSketching()
    grouped = selection_sim.GroupSketching(
        features=(*movielens.FEATURES, "age__occupation"), groups=(("age", "occupation"),)
    )
    for sk in (plain, grouped):
        assert sk.stream_config(privacy).max_tables == len(movielens.FEATURES) + 5
    assert plain.noise(privacy).scale == grouped.noise(privacy).scale
    names = [f["name"] for f in grouped.stream_features()]
    assert names == [*movielens.FEATURES, "age__occupation"]


def test_a_group_is_its_members_keys_joined_with_age_bucketed() -> None:
    df = pd.DataFrame({f: ["x", "y"] for f in movielens.FEATURES if f != "age"} | {"age": [30, 60]})
    keys = selection_sim._key_frame(df)
    assert keys["age"].tolist() == ["2", "5"]  # buckets of AGE_BUCKETS = (18, 25, 35, 45, 56)
    codes = selection_sim._codes(keys)
    assert all(c.tolist() == [0, 1] for c in codes.values())


def test_rounds_pick_a_strong_pair() -> None:
    """Labels = gender XOR genres parity on 12 windows: the first round picks that pair at
    ε_sel = 1 with the service's defaults (its padded aic score is far above every other score
    and ⊥'s); with the ``of`` declarations no group of two user attributes is offered (gender
    XOR occupation is then never picked); without ⊥ all four rounds pick."""
    rng = np.random.default_rng(3)
    n = 120_000
    codes = {f: rng.integers(0, 4, n) for f in movielens.FEATURES}
    codes["gender"] = rng.integers(0, 2, n)
    labels = codes["gender"] ^ (codes["genres"] % 2)
    with_stop = selection_sim.rounds(codes, labels, selection_sim.Rule(0.0))
    assert with_stop[0] == ("gender", "genres")
    fill = selection_sim.Rule(None, 0.0, of=False)
    assert len(selection_sim.rounds(codes, labels, fill)) == 4
    within_user = codes["gender"] ^ (codes["occupation"] % 2)
    assert selection_sim.rounds(codes, within_user, fill)[0] == ("gender", "occupation")
    assert ("gender", "occupation") not in selection_sim.rounds(
        codes, within_user, selection_sim.Rule(0.0)
    )

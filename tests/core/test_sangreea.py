"""SaNGreeA k-anonymisation (service/core/anonymity/sangreea.py,
service/core/anonymity/hierarchy.py): every release
is k-anonymous, the fast version matches the exhaustive greedy, GIL/NGIL recompute, weights move
the loss, and AnonymizationJS's three bugs are absent."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.core.anonymity.hierarchy import (
    encode_values,
    flat_hierarchy,
    lca_by_walk,
    parse_hierarchy,
)
from service.core.anonymity.sangreea import (
    QuasiIdentifier,
    SangreeaResult,
    anonymize,
    anonymize_exhaustive,
    normalise_weights,
    partition_ngil,
    recompute_gil,
)

ALGORITHMS = (anonymize, anonymize_exhaustive)
ROOT = Path(__file__).resolve().parents[2]
ADULT_TREES = ROOT / "examples" / "adult" / "hierarchies"
ADULT_DATA = ROOT.parent / "shared" / "data" / "adult" / "adult.parquet"

TREE = {
    "value": "*",
    "children": [
        {"value": "AB", "children": [{"value": "A"}, {"value": "B"}]},
        {"value": "CDE", "children": [{"value": "C"}, {"value": "D"}, {"value": "E"}]},
        {"value": "F"},
    ],
}
LEAVES = ["A", "B", "C", "D", "E", "F"]


def random_table(seed: int, n: int) -> tuple[dict[str, Any], list[QuasiIdentifier]]:
    rng = np.random.default_rng(seed)
    cols = {
        "age": rng.integers(17, 90, n),
        "hours": np.round(rng.normal(40, 12, n)).clip(1, 99),
        "cat": rng.choice(LEAVES, n, p=[0.3, 0.2, 0.2, 0.1, 0.1, 0.1]),
        "flat": rng.choice(["x", "y", "z"], n),
        "keep": np.arange(n),
    }
    qis = [
        QuasiIdentifier("age", "range"),
        QuasiIdentifier("hours", "range"),
        QuasiIdentifier("cat", "hierarchy", parse_hierarchy(TREE)),
        QuasiIdentifier("flat", "hierarchy"),
    ]
    return cols, qis


def assert_k_anonymous(cols: dict[str, Any], qis: list[QuasiIdentifier], r: SangreeaResult) -> None:
    n = len(r.cluster)
    assert (r.cluster >= 0).all()
    sizes = np.bincount(r.cluster)
    assert sizes.min() >= r.k and sizes.max() <= 2 * r.k - 1
    assert (sizes == r.size).all() and int(r.size.sum()) == n
    # the release itself: every combination of released QI values occurs at least k times
    released = list(zip(*(r.release_values(q.name) for q in qis), strict=True))
    counts: dict[tuple[str, ...], int] = {}
    for row in released:
        counts[row] = counts.get(row, 0) + 1
    assert min(counts.values()) >= r.k
    # and each release covers the row's true value
    for j, name in enumerate(r.ranges):
        lo, hi = r.range_lo[r.cluster, j], r.range_hi[r.cluster, j]
        x = np.asarray(cols[name], dtype=float)
        assert ((lo <= x) & (x <= hi)).all()
    for j, name in enumerate(r.cats):
        h = r.hierarchies[j]
        ids = encode_values(h, cols[name], attribute=name)
        for i in range(n):
            node = int(r.node[r.cluster[i], j])
            assert lca_by_walk(h, [node, int(ids[i])]) == node


@st.composite
def tables(draw: st.DrawFn) -> tuple[dict[str, Any], list[QuasiIdentifier], int]:
    k = draw(st.integers(1, 7))
    n = draw(st.integers(k, 45))
    n_ranges = draw(st.integers(0, 2))
    n_cats = draw(st.integers(0 if n_ranges else 1, 2))
    cols: dict[str, Any] = {}
    qis: list[QuasiIdentifier] = []
    for j in range(n_ranges):  # few distinct values: many duplicates
        cols[f"r{j}"] = draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n))
        qis.append(QuasiIdentifier(f"r{j}", "range"))
    for j in range(n_cats):
        cols[f"c{j}"] = draw(st.lists(st.sampled_from(LEAVES), min_size=n, max_size=n))
        tree = parse_hierarchy(TREE) if draw(st.booleans()) else None
        qis.append(QuasiIdentifier(f"c{j}", "hierarchy", tree))
    return cols, qis, k


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables(), st.sampled_from(ALGORITHMS))
def test_every_release_is_k_anonymous(table: Any, algorithm: Any) -> None:
    cols, qis, k = table
    r = algorithm(cols, qis, k)
    assert_k_anonymous(cols, qis, r)
    gil, ngil = recompute_gil(cols, r)
    assert np.allclose(gil, r.gil) and ngil == pytest.approx(r.ngil, abs=1e-12)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(("n", "k"), [(10, 10), (11, 10), (19, 10), (20, 10), (23, 5), (1, 1)])
def test_sizes_at_the_edges(algorithm: Any, n: int, k: int) -> None:
    cols, qis = random_table(n, n)
    r = algorithm(cols, qis, k)
    assert_k_anonymous(cols, qis, r)
    assert r.n_clusters == n // k


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_fewer_rows_than_k_is_refused(algorithm: Any) -> None:
    cols, qis = random_table(0, 9)
    with pytest.raises(ValueError, match="at least k rows: 9 rows, k=10"):
        algorithm(cols, qis, 10)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_all_duplicates(algorithm: Any) -> None:
    cols = {"a": [3] * 23, "c": ["A"] * 23}
    qis = [QuasiIdentifier("a", "range"), QuasiIdentifier("c", "hierarchy")]
    r = algorithm(cols, qis, 5)
    assert_k_anonymous(cols, qis, r)
    assert r.ngil == 0.0 and r.cluster_values("a") == ["3"] * 4


@pytest.mark.slow  # the exhaustive greedy on random tables (seconds)
def test_fast_matches_the_exhaustive_greedy_on_random_tables() -> None:
    gaps = []
    for seed in range(25):
        n = 150 + 37 * seed
        cols, qis = random_table(seed, n)
        weights = {"age": 1 + seed % 4, "cat": 1 + seed % 3}
        for k in (3, 10):
            fast = anonymize(cols, qis, k, weights)
            slow = anonymize_exhaustive(cols, qis, k, weights)
            assert_k_anonymous(cols, qis, fast)
            gap = fast.ngil / slow.ngil - 1
            assert abs(gap) <= 0.05, (seed, k, gap)
            gaps.append(gap)
    # the typical gap is far inside 5 % (printed with -s for the report)
    print(
        f"fast vs exhaustive NGIL gap: median {statistics.median(gaps):+.5f}, "
        f"max |gap| {max(abs(g) for g in gaps):.5f} over {len(gaps)} runs"
    )
    assert statistics.median(abs(g) for g in gaps) <= 0.01


def test_fast_equals_exhaustive_without_duplicates() -> None:
    """Without duplicate tuples the two make the same choices (tie-breaks included)."""
    rng = np.random.default_rng(7)
    n = 400
    cols = {"a": rng.permutation(n).astype(float), "b": rng.normal(size=n)}
    qis = [QuasiIdentifier("a", "range"), QuasiIdentifier("b", "range")]
    fast, slow = anonymize(cols, qis, 6), anonymize_exhaustive(cols, qis, 6)
    assert (fast.cluster == slow.cluster).all() and fast.ngil == pytest.approx(slow.ngil)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_recomputed_gil_equals_reported(algorithm: Any) -> None:
    cols, qis = random_table(3, 500)
    r = algorithm(cols, qis, 7, {"age": 3.0, "flat": 0.5})
    gil, ngil = recompute_gil(cols, r)
    assert np.allclose(gil, r.gil, rtol=1e-12, atol=1e-12)
    assert ngil == pytest.approx(r.ngil, rel=1e-12)
    assert sum(r.weighted_loss.values()) == pytest.approx(r.ngil, rel=1e-12)
    assert all(0.0 <= v <= 1.0 for v in r.loss.values())


def test_gil_formula_on_a_hand_example() -> None:
    # ages 0..10 (span 10), tree height 2; k = 2: clusters {0, 2} and {10, 10}
    cols = {"age": [0, 10, 2, 10], "cat": ["A", "A", "B", "A"]}
    qis = [
        QuasiIdentifier("age", "range"),
        QuasiIdentifier("cat", "hierarchy", parse_hierarchy(TREE)),
    ]
    r = anonymize_exhaustive(cols, qis, 2, {"age": 3.0, "cat": 1.0})  # normalised: 1.5, 0.5
    assert r.weights == {"age": 1.5, "cat": 0.5}
    assert r.cluster.tolist() == [0, 1, 0, 1]
    assert r.cluster_values("age") == ["0-2", "10"] and r.cluster_values("cat") == ["AB", "A"]
    # GIL = |cl| · (1.5·2/10 + 0.5·height(AB)/height(*)) = 2 · (0.3 + 0.25)
    assert r.gil.tolist() == pytest.approx([1.1, 0.0])
    assert r.ngil == pytest.approx(1.1 / (4 * 2))
    assert r.loss == pytest.approx({"age": 0.1, "cat": 0.25})


def test_raising_a_weight_lowers_that_attributes_loss() -> None:
    cols, qis = random_table(11, 1200)
    for algorithm in ALGORITHMS:
        ages = [algorithm(cols, qis, 10, {"age": w}).loss["age"] for w in (0.25, 1, 4, 10)]
        assert ages == sorted(ages, reverse=True) and ages[-1] < ages[0] / 3
        base, cat = algorithm(cols, qis, 10), algorithm(cols, qis, 10, {"cat": 4.0})
        assert cat.loss["cat"] < base.loss["cat"]
        # the loss moves to another attribute
        assert cat.loss["flat"] > base.loss["flat"]


def test_equal_weights_are_the_unweighted_gil() -> None:
    assert normalise_weights(["a", "b"], None) == {"a": 1.0, "b": 1.0}
    assert normalise_weights(["a", "b"], {"a": 5, "b": 5}) == {"a": 1.0, "b": 1.0}
    assert normalise_weights(["a", "b", "c"], {"a": 4}) == {"a": 2.0, "b": 0.5, "c": 0.5}


@pytest.mark.parametrize(
    ("weights", "message"),
    [({"zzz": 1.0}, "'zzz' is not a quasi-identifier"), ({"a": 0}, r"weights\['a'\] must be")],
)
def test_bad_weights_are_refused(weights: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        anonymize({"a": [1, 2]}, [QuasiIdentifier("a", "range")], 1, weights)


# AnonymizationJS (cassinius/AnonymizationJS, src/SaNGreeA/SaNGreeA.ts): one test per bug


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_range_cost_multiplies_the_weight(algorithm: Any) -> None:
    """Theirs adds it (``range_weights[range] + extension_cost``): with weights 9:1 on a:b the
    seed (0, 0) would take (2, 0) (extension 0.2 < 0.5); multiplied it takes (0, 5)
    (1.8·0.2 = 0.36 > 0.2·0.5 = 0.1)."""
    cols = {"a": [0, 2, 0, 10], "b": [0, 0, 5, 10]}
    qis = [QuasiIdentifier("a", "range"), QuasiIdentifier("b", "range")]
    r = algorithm(cols, qis, 2, {"a": 9.0, "b": 1.0})
    assert r.cluster[0] == r.cluster[2] != r.cluster[1]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_lower_bound_goes_down(algorithm: Any) -> None:
    """Theirs never assigns ``range[0]`` in ``updateRange``: the cluster of 5 and 3 would be
    released as [5, 5], not covering 3."""
    cols = {"a": [5, 3, 10, 10]}
    r = algorithm(cols, [QuasiIdentifier("a", "range")], 2)
    assert r.cluster_values("a") == ["3-5", "10"]
    assert r.release_values("a") == ["3-5", "3-5", "10", "10"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_no_final_cluster_under_k(algorithm: Any) -> None:
    """Theirs keeps the last cluster with the rows left (here one row: 3 + 3 + 1)."""
    cols = {"a": [1, 2, 3, 10, 11, 12, 50]}
    r = algorithm(cols, [QuasiIdentifier("a", "range")], 3)
    assert r.size.tolist() == [3, 4]
    assert r.cluster.tolist() == [0, 0, 0, 1, 1, 1, 1]  # 50 raises {10, 11, 12} least


def test_progress_reaches_one() -> None:
    cols, qis = random_table(1, 2000)
    for algorithm in ALGORITHMS:
        seen: list[float] = []
        algorithm(cols, qis, 10, progress=seen.append)
        assert seen == sorted(seen) and seen[-1] == 1.0 and len(seen) > 10


# hierarchies


def test_lca_table_matches_walking_parents() -> None:
    h = parse_hierarchy(json.loads((ADULT_TREES / "native-country.json").read_text()))
    for a in range(len(h.names)):
        for b in range(len(h.names)):
            assert h.lca[a, b] == lca_by_walk(h, [a, b])
    assert h.height == 3 and h.subtree_height[0] == 3


def test_flat_hierarchy() -> None:
    h = flat_hierarchy(["b", "a", "b"])
    assert h.names == ("*", "a", "b") and h.height == 1
    assert h.to_json() == {"value": "*", "children": [{"value": "a"}, {"value": "b"}]}
    assert h.cost().tolist() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ({"children": []}, "string 'value'"),
        ({"value": "*", "children": [{"value": "*"}]}, "occurs twice"),
        ({"value": "*", "children": "x"}, "'children' must be a list"),
    ],
)
def test_malformed_trees_are_refused(tree: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_hierarchy(tree, attribute="workclass")


def test_unknown_values_are_refused_without_echoing_them() -> None:
    qis = [QuasiIdentifier("c", "hierarchy", parse_hierarchy(TREE))]
    with pytest.raises(ValueError, match="c: 1 value") as info:
        anonymize({"c": ["A", "secret-value"]}, qis, 1)
    assert "secret" not in str(info.value)


def test_range_values_must_be_finite_numbers() -> None:
    with pytest.raises(ValueError, match="age: a range quasi-identifier must be finite"):
        anonymize({"age": [1.0, float("nan")]}, [QuasiIdentifier("age", "range")], 1)
    with pytest.raises(ValueError, match="age: a range quasi-identifier must be numeric"):
        anonymize({"age": ["x", "y"]}, [QuasiIdentifier("age", "range")], 1)


@pytest.mark.skipif(
    not ADULT_DATA.is_file(), reason="shared/data/adult is not beside the repository"
)
def test_adult_values_are_leaves_of_the_example_hierarchies() -> None:
    df = pd.read_parquet(ADULT_DATA).rename(columns={"gender": "sex"})
    for path in sorted(ADULT_TREES.glob("*.json")):
        h = parse_hierarchy(json.loads(path.read_text()), attribute=path.stem)
        values = df[path.stem][df[path.stem] != "?"].unique()
        ids = encode_values(h, values, attribute=path.stem)
        assert (h.subtree_height[ids] == 0).all(), path.stem


def test_partition_ngil_scores_a_result_as_reported() -> None:
    cols, qis = random_table(5, 700)
    r = anonymize(cols, qis, 8, {"hours": 2.0})
    gil, ngil = partition_ngil(cols, qis, r.cluster, {"hours": 2.0})
    assert np.allclose(gil, r.gil) and ngil == pytest.approx(r.ngil, rel=1e-12)
    # one cluster of everything: every attribute fully generalised (cost 1 each, weights mean 1)
    assert partition_ngil(cols, qis, np.zeros(700, dtype=int))[1] == pytest.approx(1.0)

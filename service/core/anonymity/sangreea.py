"""k-anonymisation by greedy clustering (SaNGreeA) with a weight per quasi-identifier.

Sources: Malle, Kieseberg and Holzinger, "Interactive Anonymization for Privacy aware Machine
Learning" (ECML/PKDD 2017 workshop; section 4.3 "Anonymization Algorithm"), after Campan and
Truta's SaNGreeA ("Data and structural k-anonymity in social networks", PinKDD 2008); the
weights are the paper's human "bias" / iML weight vectors (section 4.1).

**Quasi-identifiers.** ``s`` range attributes (numeric, generalised to the interval
``[lo, hi]`` of the cluster's values) and ``t`` hierarchy attributes (categorical, generalised
to the lowest common ancestor of the cluster's values in a tree:
``service.core.anonymity.hierarchy``).

**GIL** of a cluster ``cl`` (paper, section 4.3, with weights ``w`` normalised to mean 1 over
the ``s + t`` attributes, so equal weights are the paper's unweighted GIL)::

    GIL(cl) = |cl| · ( Σ_{j ≤ s} w_j · (hi_j − lo_j) / (max_j − min_j)
                     + Σ_{j ≤ t} w_j · height(Λ(node_j)) / height(H_j) )
    NGIL    = Σ_cl GIL(cl) / (n · (s + t))

``max_j, min_j`` over the whole table (a constant column costs 0), ``height(leaf) = 0``. The
bracket is the per-row cost ``c(cl)``, so ``GIL(cl) = |cl| · c(cl)``.

**Greedy step.** Adding row ``r`` to ``cl`` raises the GIL by ``(|cl|+1)·c(cl ∪ r) − |cl|·c(cl)``;
``|cl|·c(cl)`` is the same for every candidate, so the best candidate minimises ``c(cl ∪ r)``.
While at least ``k`` rows are unassigned a cluster is seeded and filled to exactly ``k`` rows;
then each of the fewer than ``k`` rows left joins, one after another in row order, the finished
cluster whose GIL it raises least (here the full raise counts, since clusters differ in size).
Every cluster therefore has ``k .. 2k−1`` rows, and ``n < k`` is refused (``ValueError``).

Unlike the authors' AnonymizationJS (``cassinius/AnonymizationJS``, ``SaNGreeA.ts``) the range
cost multiplies by the weight (theirs adds it: ``range_weights[range] + extension_cost``), a
cluster's lower bound does go down (their ``updateRange`` never assigns ``range[0]``), and no
final cluster is released with fewer than ``k`` rows (theirs keeps it).

Two implementations of that objective:

* ``anonymize_exhaustive``: the plain Θ(n²) greedy scan, the test oracle. Seed = the first
  unassigned row in input order; each step scores every unassigned row; ties go to the lowest
  row index.
* ``anonymize``: fast, the same greedy choices with less work:

  1. identical QI tuples are merged into one tuple with a multiplicity; a chosen tuple gives
     as many copies (its rows in input order) as the cluster still needs. This is the one
     change of behaviour: once ``r`` is in, a copy of ``r`` raises nothing (``c(cl ∪ r) =
     c(cl)``, the least any candidate can cost), but the exhaustive scan would take the
     lowest-index row among all zero-raise candidates, which may be another tuple inside the
     cluster's generalisation. The cluster's bounds and nodes are the same either way (every
     term of ``c`` only grows), only which rows fill it can differ, so later seeds can differ;
  2. the seed is the tuple holding the first unassigned row in input order (as exhaustive),
     and ties between equal-cost candidates go to the tuple whose next unassigned row comes
     first (as exhaustive);
  3. tuples are grouped by their combination of hierarchy values (Adult: 36,562 distinct
     tuples but 4,942 combinations). The hierarchy part of ``c(cl ∪ r)`` depends only on the
     combination: it is one look-up per attribute in a block-diagonal lowest-common-ancestor
     table over all trees and one in the matching cost table, vectorised over combinations
     and recomputed only when the cluster's nodes change;
  4. pruning by a lower bound, exact: the range part of ``c(cl ∪ r)`` is at least the
     cluster's own range part, so a combination whose hierarchy cost plus that bound exceeds
     the best cost found among the members of the cheapest combination cannot hold the best
     candidate; only the members of the remaining combinations are scored (ranges as
     ``minimum/maximum`` of the cluster's bounds, updated incrementally).

  The work per step is O(combinations·t) plus the scored members instead of O(n·(s+t)); it is
  still quadratic in the worst case (all tuples in one combination) but not on Adult: all
  45,222 complete rows at k = 10 take seconds (``bench/anonymization/speed.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from service.core.anonymity.hierarchy import Hierarchy, encode_values, flat_hierarchy, lca_by_walk

Progress = Callable[[float], None]


@dataclass(frozen=True)
class QuasiIdentifier:
    name: str
    kind: Literal["range", "hierarchy"]
    hierarchy: Hierarchy | None = None
    """For ``kind="hierarchy"``; ``None`` = the flat tree of the column's values → ``*``."""


@dataclass
class _Table:
    """The QIs encoded: ``x`` (n × s) range values, ``nodes`` (n × t) global node ids in the
    block-diagonal tables, ``lca``/``cost`` over all trees' nodes (cost already weighted)."""

    ranges: list[str]
    cats: list[str]
    hierarchies: list[Hierarchy]
    weights: dict[str, float]
    x: npt.NDArray[np.float64]
    lo: npt.NDArray[np.float64]
    span: npt.NDArray[np.float64]
    range_w: npt.NDArray[np.float64]  # w_j / (max_j - min_j), 0 for a constant column
    nodes: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.int64]
    lca: npt.NDArray[np.int64]
    cost: npt.NDArray[np.float64]  # w_j · height(Λ(node)) / height(H_j) by global node id

    @property
    def n(self) -> int:
        return int(self.x.shape[0] if self.ranges else self.nodes.shape[0])


@dataclass(frozen=True)
class SangreeaResult:
    """A k-anonymous clustering. ``cluster[i]`` is row i's cluster; per cluster ``c``:
    ``range_lo/range_hi[c, j]`` (range QIs in ``ranges`` order), ``node[c, j]`` (the generalised
    node id in hierarchy QI j's own tree), ``size[c]``, ``gil[c]``.

    ``loss[a]``: attribute a's unweighted loss, the mean over rows of its normalised
    generalisation ((hi−lo)/(max−min) or height(Λ(node))/height(H)), in [0, 1].
    ``weighted_loss[a] = w_a · loss[a] / (s + t)``: attribute a's share of NGIL (they sum to it).
    """

    k: int
    ranges: tuple[str, ...]
    cats: tuple[str, ...]
    hierarchies: tuple[Hierarchy, ...]
    weights: dict[str, float]
    cluster: npt.NDArray[np.int64]
    size: npt.NDArray[np.int64]
    range_lo: npt.NDArray[np.float64]
    range_hi: npt.NDArray[np.float64]
    node: npt.NDArray[np.int64]
    gil: npt.NDArray[np.float64]
    ngil: float
    loss: dict[str, float]
    weighted_loss: dict[str, float]
    table_min: npt.NDArray[np.float64]
    table_max: npt.NDArray[np.float64]

    @property
    def n_clusters(self) -> int:
        return int(self.size.shape[0])

    def cluster_values(self, name: str) -> list[str]:
        """The generalised value of QI ``name`` per cluster: ``"lo-hi"`` (the value when
        lo = hi) for a range, the node's name for a hierarchy."""
        if name in self.ranges:
            j = self.ranges.index(name)
            return [
                format_range(lo, hi)
                for lo, hi in zip(self.range_lo[:, j], self.range_hi[:, j], strict=True)
            ]
        j = self.cats.index(name)
        names = self.hierarchies[j].names
        return [names[int(v)] for v in self.node[:, j]]

    def release_values(self, name: str) -> list[str]:
        """The generalised value of QI ``name`` per input row."""
        per_cluster = self.cluster_values(name)
        return [per_cluster[int(c)] for c in self.cluster]


def format_range(lo: float, hi: float) -> str:
    def fmt(v: float) -> str:
        return str(int(v)) if float(v).is_integer() else repr(float(v))

    return fmt(lo) if lo == hi else f"{fmt(lo)}-{fmt(hi)}"


def normalise_weights(
    names: Sequence[str], weights: Mapping[str, float] | None
) -> dict[str, float]:
    """Weights scaled to mean 1 over the QIs (omitted QIs weigh 1 before scaling); ``ValueError``
    for a weight of an unknown attribute or one that is not finite and > 0."""
    raw = {name: 1.0 for name in names}
    for name, value in (weights or {}).items():
        if name not in raw:
            raise ValueError(f"weights: {name!r} is not a quasi-identifier")
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"weights[{name!r}] must be a finite number > 0")
        raw[name] = float(value)
    mean = sum(raw.values()) / len(raw)
    return {name: value / mean for name, value in raw.items()}


def _encode(
    columns: Mapping[str, Any],
    qis: Sequence[QuasiIdentifier],
    k: int,
    weights: Mapping[str, float] | None,
) -> _Table:
    if not qis:
        raise ValueError("quasi_identifiers: at least one is needed")
    if len({q.name for q in qis}) != len(qis):
        raise ValueError("quasi_identifiers: a name occurs twice")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k=}")
    lengths = set()
    for q in qis:
        if q.name not in columns:
            raise ValueError(f"quasi_identifiers: no column {q.name!r}")
        lengths.add(len(columns[q.name]))
    if len(lengths) != 1:
        raise ValueError("columns: the quasi-identifier columns differ in length")
    n = lengths.pop()
    if n < k:
        raise ValueError(f"k-anonymity needs at least k rows: {n} rows, k={k}")
    w = normalise_weights([q.name for q in qis], weights)
    ranges = [q.name for q in qis if q.kind == "range"]
    cats = [q.name for q in qis if q.kind != "range"]
    x = np.zeros((n, len(ranges)))
    for j, name in enumerate(ranges):
        try:
            col = np.asarray(columns[name], dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: a range quasi-identifier must be numeric") from None
        if not np.isfinite(col).all():
            raise ValueError(f"{name}: a range quasi-identifier must be finite (no missing values)")
        x[:, j] = col
    lo = x.min(axis=0) if n else np.zeros(len(ranges))
    span = (x.max(axis=0) - lo) if n else np.zeros(len(ranges))
    range_w = np.array([w[r] for r in ranges]) / np.where(span > 0, span, np.inf)
    hierarchies: list[Hierarchy] = []
    nodes = np.zeros((n, len(cats)), dtype=np.int64)
    offsets = np.zeros(len(cats), dtype=np.int64)
    total = 0
    for j, q in enumerate(q for q in qis if q.kind != "range"):
        h = q.hierarchy or flat_hierarchy(str(v) for v in columns[q.name])
        hierarchies.append(h)
        offsets[j] = total
        nodes[:, j] = encode_values(h, columns[q.name], attribute=q.name) + total
        total += len(h.names)
    lca = np.zeros((total, total), dtype=np.int64)
    cost = np.zeros(total)
    for j, h in enumerate(hierarchies):
        o, m = int(offsets[j]), len(h.names)
        lca[o : o + m, o : o + m] = h.lca + o
        cost[o : o + m] = w[cats[j]] * h.cost()
    return _Table(ranges, cats, hierarchies, w, x, lo, span, range_w, nodes, offsets, lca, cost)


_EPS = 1e-9


def _range_cost(
    t: _Table, lo: npt.NDArray[np.float64], hi: npt.NDArray[np.float64], x: npt.NDArray[np.float64]
) -> Any:
    """The range part of c(cl ∪ r) for candidate rows x (m × s)."""
    return ((np.maximum(hi, x) - np.minimum(lo, x)) * t.range_w).sum(axis=1)


def _row_cost(
    t: _Table,
    lo: npt.NDArray[np.float64],
    hi: npt.NDArray[np.float64],
    nodes: npt.NDArray[np.int64],
) -> Any:
    """c(cl) for bounds/nodes of shape (..., s) / (..., t)."""
    return ((hi - lo) * t.range_w).sum(axis=-1) + t.cost[nodes].sum(axis=-1)


class _Clusters:
    """Finished clusters as growing lists; then the leftover rows and the result."""

    def __init__(self, t: _Table) -> None:
        self.t = t
        self.lo: list[npt.NDArray[np.float64]] = []
        self.hi: list[npt.NDArray[np.float64]] = []
        self.nodes: list[npt.NDArray[np.int64]] = []
        self.size: list[int] = []

    def add(
        self,
        lo: npt.NDArray[np.float64],
        hi: npt.NDArray[np.float64],
        nodes: npt.NDArray[np.int64],
        size: int,
    ) -> int:
        self.lo.append(lo.copy())
        self.hi.append(hi.copy())
        self.nodes.append(nodes.copy())
        self.size.append(size)
        return len(self.size) - 1

    def place_leftovers(self, rows: npt.NDArray[np.int64], cluster: npt.NDArray[np.int64]) -> None:
        """Each leftover row (in the given order) joins the cluster whose GIL it raises least:
        (m+1)·c(cl ∪ r) − m·c(cl); ties to the lowest cluster id."""
        t = self.t
        lo, hi = (
            np.array(self.lo).reshape(len(self.size), -1),
            np.array(self.hi).reshape(len(self.size), -1),
        )
        nodes = np.array(self.nodes, dtype=np.int64).reshape(len(self.size), -1)
        size = np.array(self.size, dtype=np.float64)
        for r in rows.tolist():
            new_lo, new_hi = np.minimum(lo, t.x[r]), np.maximum(hi, t.x[r])
            new_nodes = t.lca[nodes, t.nodes[r]]
            raise_ = (size + 1) * _row_cost(t, new_lo, new_hi, new_nodes) - size * _row_cost(
                t, lo, hi, nodes
            )
            best = int(np.argmin(raise_))
            lo[best], hi[best], nodes[best] = new_lo[best], new_hi[best], new_nodes[best]
            size[best] += 1
            cluster[r] = best
        self.lo, self.hi, self.nodes = list(lo), list(hi), list(nodes)
        self.size = [int(s) for s in size]

    def result(self, k: int, cluster: npt.NDArray[np.int64]) -> SangreeaResult:
        t = self.t
        c = len(self.size)
        lo = np.array(self.lo).reshape(c, len(t.ranges))
        hi = np.array(self.hi).reshape(c, len(t.ranges))
        gnodes = np.array(self.nodes, dtype=np.int64).reshape(c, len(t.cats))
        size = np.array(self.size, dtype=np.int64)
        gil = size * _row_cost(t, lo, hi, gnodes)
        qis = len(t.ranges) + len(t.cats)
        n = int(size.sum())
        ngil = float(gil.sum() / (n * qis))
        loss: dict[str, float] = {}
        for j, name in enumerate(t.ranges):
            frac = (hi[:, j] - lo[:, j]) / t.span[j] if t.span[j] > 0 else np.zeros(c)
            loss[name] = float((size * frac).sum() / n)
        for j, name in enumerate(t.cats):
            h = t.hierarchies[j]
            frac = h.cost()[gnodes[:, j] - t.offsets[j]]
            loss[name] = float((size * frac).sum() / n)
        weighted = {name: t.weights[name] * v / qis for name, v in loss.items()}
        return SangreeaResult(
            k=k,
            ranges=tuple(t.ranges),
            cats=tuple(t.cats),
            hierarchies=tuple(t.hierarchies),
            weights=dict(t.weights),
            cluster=cluster,
            size=size,
            range_lo=lo,
            range_hi=hi,
            node=gnodes - t.offsets,
            gil=gil,
            ngil=ngil,
            loss=loss,
            weighted_loss=weighted,
            table_min=t.lo.copy(),
            table_max=t.lo + t.span,
        )


class _Ticker:
    def __init__(self, progress: Progress | None, n: int) -> None:
        self.progress, self.n, self.last = progress, n, -1.0

    def __call__(self, done: int) -> None:
        if self.progress is not None and (done == self.n or done / self.n - self.last >= 0.01):
            self.last = done / self.n
            self.progress(self.last)


def anonymize_exhaustive(
    columns: Mapping[str, Any],
    qis: Sequence[QuasiIdentifier],
    k: int,
    weights: Mapping[str, float] | None = None,
    *,
    progress: Progress | None = None,
) -> SangreeaResult:
    """The plain Θ(n²) greedy scan (module docstring): the seed is the first unassigned row in
    input order, every step scores every unassigned row, ties to the lowest row index."""
    t = _encode(columns, qis, k, weights)
    n = t.n
    cluster = np.full(n, -1, dtype=np.int64)
    clusters = _Clusters(t)
    tick = _Ticker(progress, n)
    open_ = np.ones(n, dtype=bool)
    remaining = n
    seed = 0
    while remaining >= k:
        while not open_[seed]:
            seed += 1
        lo, hi, nodes = t.x[seed].copy(), t.x[seed].copy(), t.nodes[seed].copy()
        members = [seed]
        open_[seed] = False
        while len(members) < k:
            cand = np.flatnonzero(open_)
            costs = _row_cost(
                t, np.minimum(lo, t.x[cand]), np.maximum(hi, t.x[cand]), t.lca[nodes, t.nodes[cand]]
            )
            best = int(cand[int(np.argmin(costs))])
            lo, hi = np.minimum(lo, t.x[best]), np.maximum(hi, t.x[best])
            nodes = t.lca[nodes, t.nodes[best]]
            members.append(best)
            open_[best] = False
        cluster[members] = clusters.add(lo, hi, nodes, k)
        remaining -= k
        tick(n - remaining)
    clusters.place_leftovers(np.flatnonzero(open_), cluster)
    tick(n)
    return clusters.result(k, cluster)


def anonymize(
    columns: Mapping[str, Any],
    qis: Sequence[QuasiIdentifier],
    k: int,
    weights: Mapping[str, float] | None = None,
    *,
    progress: Progress | None = None,
) -> SangreeaResult:
    """The fast SaNGreeA (module docstring, items 1–4): the exhaustive greedy's choices on
    merged tuples, with the candidates pruned by a lower bound instead of scored one by one."""
    t = _encode(columns, qis, k, weights)
    n = t.n
    # 1. merge identical QI tuples, ordered by (categorical combination, first row)
    keys = np.concatenate([t.nodes.astype(np.float64), t.x], axis=1)
    _, inverse, mult = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    by_tuple = np.argsort(inverse, kind="stable")  # rows grouped by tuple, input order within
    starts = np.concatenate([[0], np.cumsum(mult)]).astype(np.int64)
    first = by_tuple[starts[:-1]]
    tx, tn = t.x[first], t.nodes[first]
    combos, combo_of = np.unique(tn, axis=0, return_inverse=True)
    combo_of = combo_of.reshape(-1)
    left = mult.astype(np.int64)
    used = np.zeros(len(left), dtype=np.int64)
    next_row = first.copy()  # the next unassigned row of each tuple (n when none)
    combo_left = np.bincount(combo_of, weights=left, minlength=len(combos)).astype(np.int64)
    members = np.argsort(combo_of, kind="stable")
    cstart = np.concatenate([[0], np.cumsum(np.bincount(combo_of, minlength=len(combos)))]).astype(
        np.int64
    )
    cluster = np.full(n, -1, dtype=np.int64)
    clusters = _Clusters(t)
    tick = _Ticker(progress, n)
    remaining = n

    def take(tup: int, copies: int, cid: int) -> None:
        s0 = int(starts[tup] + used[tup])
        cluster[by_tuple[s0 : s0 + copies]] = cid
        used[tup] += copies
        left[tup] -= copies
        combo_left[combo_of[tup]] -= copies
        next_row[tup] = by_tuple[s0 + copies] if left[tup] else n

    while remaining >= k:
        cid = len(clusters.size)
        seed = int(np.argmin(next_row))  # 2. the first unassigned row in input order
        lo, hi, g = tx[seed].copy(), tx[seed].copy(), tn[seed].copy()
        need = k - min(int(left[seed]), k)
        take(seed, k - need, cid)
        catc_for: npt.NDArray[np.int64] | None = None
        catc = np.zeros(0)
        while need:
            if catc_for is None or not np.array_equal(catc_for, g):  # 3. cached per node vector
                catc = t.cost[t.lca[g, combos]].sum(axis=1)
                catc_for = g.copy()
            open_catc = np.where(combo_left > 0, catc, np.inf)
            base = float(((hi - lo) * t.range_w).sum())
            gmin = int(np.argmin(open_catc))
            cand = members[cstart[gmin] : cstart[gmin + 1]]
            cand = cand[left[cand] > 0]
            ub = open_catc[gmin] + float(_range_cost(t, lo, hi, tx[cand]).min())
            sel = open_catc + base <= ub + _EPS  # 4. lower bound c(cl) + cat cost ≤ best so far
            if int(sel.sum()) > 1:
                cand = np.flatnonzero(sel[combo_of] & (left > 0))
            costs = catc[combo_of[cand]] + _range_cost(t, lo, hi, tx[cand])
            tied = cand[costs <= costs.min() + _EPS]
            best = int(tied[np.argmin(next_row[tied])])
            copies = min(int(left[best]), need)
            take(best, copies, cid)
            need -= copies
            lo, hi = np.minimum(lo, tx[best]), np.maximum(hi, tx[best])
            g = t.lca[g, tn[best]]
        clusters.add(lo, hi, g, k)
        remaining -= k
        tick(n - remaining)
    clusters.place_leftovers(np.flatnonzero(cluster < 0), cluster)
    tick(n)
    return clusters.result(k, cluster)


def recompute_gil(
    columns: Mapping[str, Any],
    result: SangreeaResult,
) -> tuple[npt.NDArray[np.float64], float]:
    """GIL per cluster and NGIL recomputed from the rows and the cluster labels alone (plain
    Python: min/max per cluster, lowest common ancestor by walking parent pointers), for tests."""
    qis = len(result.ranges) + len(result.cats)
    n = len(result.cluster)
    members: dict[int, list[int]] = {}
    for i, c in enumerate(result.cluster.tolist()):
        members.setdefault(c, []).append(i)
    cols = {name: [float(v) for v in columns[name]] for name in result.ranges}
    gil = np.zeros(len(members))
    for c, rows in members.items():
        total = 0.0
        for name in result.ranges:
            col = cols[name]
            vals = [col[i] for i in rows]
            lo, hi = min(col), max(col)
            if hi > lo:
                total += result.weights[name] * (max(vals) - min(vals)) / (hi - lo)
        for j, name in enumerate(result.cats):
            h = result.hierarchies[j]
            index = h.index()
            node = lca_by_walk(h, (index[str(columns[name][i])] for i in rows))
            if h.height:
                total += result.weights[name] * int(h.subtree_height[node]) / h.height
        gil[c] = len(rows) * total
    return gil, float(gil.sum() / (n * qis))


def partition_ngil(
    columns: Mapping[str, Any],
    qis: Sequence[QuasiIdentifier],
    labels: Any,
    weights: Mapping[str, float] | None = None,
) -> tuple[npt.NDArray[np.float64], float]:
    """GIL per cluster and NGIL of any partition of the rows (``labels[i]`` = row i's cluster,
    0..c−1), by the module's formula: to score another algorithm's clusters (AnonymizationJS,
    Mondrian) on the same objective. Clusters under k are scored as they are."""
    t = _encode(columns, qis, 1, weights)
    lab = np.asarray(labels, dtype=np.int64)
    if lab.shape != (t.n,) or (lab < 0).any():
        raise ValueError("labels: one cluster id >= 0 per row")
    c = int(lab.max()) + 1
    s = len(t.ranges)
    lo = np.full((c, s), np.inf)
    hi = np.full((c, s), -np.inf)
    np.minimum.at(lo, lab, t.x)
    np.maximum.at(hi, lab, t.x)
    size = np.bincount(lab, minlength=c)
    if (size == 0).any():
        raise ValueError("labels: cluster ids must be 0..c-1 with no gaps")
    # the lowest common ancestor per cluster, one position within the clusters at a time
    order = np.argsort(lab, kind="stable")
    pos = np.arange(t.n) - np.concatenate([[0], np.cumsum(size)])[lab[order]]
    g = np.zeros((c, len(t.cats)), dtype=np.int64)
    g[lab[order[pos == 0]]] = t.nodes[order[pos == 0]]
    for p in range(1, int(size.max())):
        rows = order[pos == p]
        g[lab[rows]] = t.lca[g[lab[rows]], t.nodes[rows]]
    gil = size * _row_cost(t, lo, hi, g)
    return gil, float(gil.sum() / (t.n * (s + len(t.cats))))

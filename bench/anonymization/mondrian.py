"""Strict multidimensional Mondrian k-anonymisation (LeFevre, DeWitt and Ramakrishnan,
"Mondrian Multidimensional K-Anonymity", ICDE 2006), the baseline of the utility benchmark
(``bench/anonymization/utility.py``), on the same quasi-identifiers and generalisation trees as
SaNGreeA (``service.core.anonymity.sangreea.QuasiIdentifier``).

No maintained PyPI package fits: the Mondrian packages there (``umbra-k``, ``polarfrost``) are
single-author first releases that take numeric attributes or flat categories, not our
generalisation trees, so this is the paper's algorithm, short.

**Algorithm** (LeFevre et al., section 4, "strict" partitioning: the regions of the partition
do not overlap). Start with one partition holding every row; split a partition while an
*allowable* cut exists, else release it as one equivalence class:

* the dimensions are tried in order of decreasing normalised width in the partition:
  ``(max − min) / (max_j − min_j)`` over the whole table for a range attribute,
  ``height(Λ(lca)) / height(H_j)`` for a hierarchy attribute (``lca`` = the lowest common
  ancestor of the partition's values), the per-attribute terms of the GIL of
  ``service.core.anonymity.sangreea``; a dimension of width 0 cannot be cut;
* a range attribute is cut at the median ``m`` of the partition's values into ``x ≤ m`` and
  ``x > m`` (or, when that leaves a side under k because many values equal ``m``, ``x < m`` and
  ``x ≥ m``); a hierarchy attribute is cut into the children of ``lca``: each row goes to the
  child whose sub-tree holds its value (LeFevre et al.'s categorical split along the hierarchy;
  not allowable when a value is ``lca`` itself, an inner node);
* a cut is allowable when every part has at least ``k`` rows.

Each final partition is one cluster: every cluster has at least ``k`` rows (a part under k is
never made), and its release generalises each range to the cluster's ``[min, max]`` and each
hierarchy attribute to the lowest common ancestor of its values, as SaNGreeA's does, so both are
scored by the same GIL (``service.core.anonymity.sangreea.partition_ngil``). Unlike SaNGreeA it
takes no
weights. O(n log n) cuts per level, O(n log n · d) in all for balanced cuts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from service.core.anonymity.hierarchy import Hierarchy, encode_values, flat_hierarchy
from service.core.anonymity.sangreea import QuasiIdentifier


def _ancestors(h: Hierarchy) -> npt.NDArray[np.int64]:
    """``anc[node, d]``: the ancestor of ``node`` at depth ``d`` (−1 below the node's depth)."""
    anc = np.full((len(h.names), int(h.depth.max()) + 1), -1, dtype=np.int64)
    for node in range(len(h.names)):
        cur = node
        for d in range(int(h.depth[node]), -1, -1):
            anc[node, d] = cur
            cur = int(h.parent[cur])
    return anc


def _lca(h: Hierarchy, nodes: npt.NDArray[np.int64]) -> int:
    out = int(nodes[0])
    for v in np.unique(nodes).tolist():
        out = int(h.lca[out, v])
    return out


def mondrian(
    columns: Mapping[str, Any], qis: Sequence[QuasiIdentifier], k: int
) -> npt.NDArray[np.int64]:
    """The cluster label (0..c−1) of every row of a strict Mondrian partition (module
    docstring); ``ValueError`` for fewer than ``k`` rows."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k=}")
    ranges = [q.name for q in qis if q.kind == "range"]
    cats = [q for q in qis if q.kind != "range"]
    n = len(columns[qis[0].name])
    if n < k:
        raise ValueError(f"k-anonymity needs at least k rows: {n} rows, k={k}")
    x = np.column_stack([np.asarray(columns[r], dtype=np.float64) for r in ranges] or [np.zeros(n)])
    span = x.max(axis=0) - x.min(axis=0)
    trees = [q.hierarchy or flat_hierarchy(str(v) for v in columns[q.name]) for q in cats]
    nodes = [
        encode_values(h, columns[q.name], attribute=q.name)
        for q, h in zip(cats, trees, strict=True)
    ]
    ancestors = [_ancestors(h) for h in trees]
    labels = np.full(n, -1, dtype=np.int64)
    stack = [np.arange(n)]
    clusters = 0
    while stack:
        rows = stack.pop()
        widths: list[tuple[float, int]] = []  # (width, dimension): ranges first, then trees
        for j in range(len(ranges)):
            if span[j] > 0:
                widths.append((float(np.ptp(x[rows, j])) / float(span[j]), j))
        lcas = []
        for j, h in enumerate(trees):
            lca = _lca(h, nodes[j][rows])
            lcas.append(lca)
            if h.height:
                widths.append((float(h.subtree_height[lca]) / h.height, len(ranges) + j))
        parts: list[npt.NDArray[np.int64]] = []
        for width, dim in sorted(widths, key=lambda wd: (-wd[0], wd[1])):
            if width <= 0:
                break
            if dim < len(ranges):
                col = x[rows, dim]
                m = float(np.median(col))
                for left in (col <= m, col < m):
                    if k <= int(left.sum()) <= len(rows) - k:
                        parts = [rows[left], rows[~left]]
                        break
            else:
                j = dim - len(ranges)
                depth = int(trees[j].depth[lcas[j]]) + 1
                child = ancestors[j][nodes[j][rows], depth]
                values, counts = np.unique(child, return_counts=True)
                # a row whose value is the lca itself (an inner node) fits no child: no cut
                if values[0] >= 0 and len(values) > 1 and int(counts.min()) >= k:
                    parts = [rows[child == v] for v in values]
            if parts:
                break
        if parts:
            stack.extend(reversed(parts))
        else:
            labels[rows] = clusters
            clusters += 1
    return labels

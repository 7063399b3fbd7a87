"""Generalisation trees (value generalisation hierarchies) for k-anonymisation by SaNGreeA
(``service.core.anonymity.sangreea``).

A tree is given as JSON ``{"value": "*", "children": [{"value": "Gov", "children": [...]}, ...]}``;
a node without ``children`` (or with an empty list) is a leaf. Every ``value`` must be unique in
its tree. A data value may name any node (a leaf, or an already generalised inner node).

For the GIL of Malle, Kieseberg and Holzinger ("Interactive Anonymization for Privacy aware
Machine Learning", section 4.3, after Campan and Truta's SaNGreeA) a hierarchy attribute of a
cluster is generalised to the lowest common ancestor of its values, and costs
``height(Λ(node)) / height(tree)``: the height of the sub-tree rooted at that node (a leaf has
height 0) over the height of the whole tree. Both the lowest common ancestor of two nodes and
that cost are precomputed as ``(nodes × nodes)`` tables, so generalising a cluster by one more
value is a table look-up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

MAX_NODES = 4096
"""The most nodes a tree may have (the look-up tables are nodes² entries)."""
MAX_DEPTH = 64


@dataclass(frozen=True)
class Hierarchy:
    """A generalisation tree. Node 0 is the root; ``parent[0] == -1``."""

    names: tuple[str, ...]
    parent: npt.NDArray[np.int64]
    depth: npt.NDArray[np.int64]
    subtree_height: npt.NDArray[np.int64]
    """height(Λ(node)): the longest path from the node down to a leaf (0 for a leaf)."""
    lca: npt.NDArray[np.int64]
    """lca[a, b]: the lowest common ancestor of nodes a and b."""

    @property
    def height(self) -> int:
        """height(H): the height of the whole tree (of its root)."""
        return int(self.subtree_height[0])

    def index(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.names)}

    def cost(self) -> npt.NDArray[np.float64]:
        """cost[node] = height(Λ(node)) / height(H) in [0, 1] (0 for a tree of one node)."""
        if self.height == 0:
            return np.zeros(len(self.names))
        return self.subtree_height / float(self.height)

    def to_json(self) -> dict[str, Any]:
        children: list[list[int]] = [[] for _ in self.names]
        for node, par in enumerate(self.parent.tolist()):
            if par >= 0:
                children[par].append(node)

        def build(node: int) -> dict[str, Any]:
            out: dict[str, Any] = {"value": self.names[node]}
            if children[node]:
                out["children"] = [build(c) for c in children[node]]
            return out

        return build(0)


def _finish(names: list[str], parent: list[int]) -> Hierarchy:
    size = len(names)
    par = np.asarray(parent, dtype=np.int64)
    depth = np.zeros(size, dtype=np.int64)
    for node in range(1, size):  # parents precede children (pre-order)
        depth[node] = depth[par[node]] + 1
    height = np.zeros(size, dtype=np.int64)
    for node in range(size - 1, 0, -1):  # children follow parents: reverse order is bottom-up
        height[par[node]] = max(height[par[node]], height[node] + 1)
    # ancestors[node, d] = the ancestor of node at depth d (node itself at its own depth)
    max_depth = int(depth.max())
    anc = np.zeros((size, max_depth + 1), dtype=np.int64)
    for node in range(size):
        cur = node
        for d in range(int(depth[node]), -1, -1):
            anc[node, d] = cur
            cur = int(par[cur])
        anc[node, int(depth[node]) + 1 :] = -1 - node  # never equal to another node's ancestor
    # lca[a, b] = the deepest common entry of the two ancestor paths
    lca = np.zeros((size, size), dtype=np.int64)
    for a in range(size):
        same = anc[a][None, :] == anc  # (size, depth+1); a prefix of True per row
        deepest = np.minimum(same.sum(axis=1) - 1, np.minimum(depth[a], depth))
        lca[a] = anc[a][deepest]
    return Hierarchy(tuple(names), par, depth, height, lca)


def parse_hierarchy(tree: Mapping[str, Any], *, attribute: str = "hierarchy") -> Hierarchy:
    """A tree from its JSON form; ``ValueError`` naming the attribute on a malformed tree
    (a node without a string ``value``, a repeated value, more than ``MAX_NODES`` nodes or
    deeper than ``MAX_DEPTH``)."""
    names: list[str] = []
    parent: list[int] = []
    seen: set[str] = set()
    stack: list[tuple[Any, int, int]] = [(tree, -1, 0)]
    while stack:
        node, par, depth = stack.pop()
        if not isinstance(node, Mapping) or not isinstance(node.get("value"), str):
            raise ValueError(f"{attribute}: every node must be an object with a string 'value'")
        if depth > MAX_DEPTH:
            raise ValueError(f"{attribute}: the tree is deeper than {MAX_DEPTH} levels")
        value = node["value"]
        if value in seen:
            raise ValueError(f"{attribute}: a node value occurs twice in the tree")
        seen.add(value)
        if len(names) >= MAX_NODES:
            raise ValueError(f"{attribute}: the tree has more than {MAX_NODES} nodes")
        me = len(names)
        names.append(value)
        parent.append(par)
        children = node.get("children") or []
        if not isinstance(children, list):
            raise ValueError(f"{attribute}: 'children' must be a list")
        for child in reversed(children):  # pre-order: first child next
            stack.append((child, me, depth + 1))
    return _finish(names, parent)


def flat_hierarchy(values: Iterable[str], *, root: str = "*") -> Hierarchy:
    """The flat tree ``value -> root`` (the default for a categorical attribute without one)."""
    leaves = sorted({str(v) for v in values} - {root})
    return _finish([root, *leaves], [-1] + [0] * len(leaves))


def encode_values(
    hierarchy: Hierarchy, values: Iterable[Any], *, attribute: str
) -> npt.NDArray[np.int64]:
    """Node ids of the values (compared as strings); ``ValueError`` naming the attribute and
    how many values are not in its tree (not the values: no raw data in errors)."""
    index = hierarchy.index()
    ids = [index.get(str(v), -1) for v in values]
    out = np.asarray(ids, dtype=np.int64)
    missing = int((out < 0).sum())
    if missing:
        raise ValueError(
            f"{attribute}: {missing} value(s) are not nodes of its generalisation hierarchy"
        )
    return out


def lca_by_walk(hierarchy: Hierarchy, nodes: Iterable[int]) -> int:
    """The lowest common ancestor of several nodes by walking parent pointers (no tables): the
    independent recomputation used by tests."""
    result: int | None = None
    for node in nodes:
        if result is None:
            result = int(node)
            continue
        path = set()
        cur = result
        while cur >= 0:
            path.add(cur)
            cur = int(hierarchy.parent[cur])
        cur = int(node)
        while cur not in path:
            cur = int(hierarchy.parent[cur])
        result = cur
    if result is None:
        raise ValueError("no nodes given")
    return result

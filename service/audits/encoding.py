"""A stream's records as the numeric vectors the re-identification audit attacks, and the class
mean an attacker reads off the stream's noisy count tables (pure: numpy and ``service.core``).

Encoding. Per count table of the stream (one per feature, one per selected group: the grouping
the tables count), the table's key of a record (``service.core.features.columns``: its features'
canonical values, numeric ones by bucket) becomes a one-hot block: one column per distinct key
of the records, 1 where the record has that key. Every record has exactly one key per table, so
a record is a 0/1 vector with one 1 per table.

The release. Table ``t`` of the count period holds, for label ``y`` and key ``k``, the noisy
count ``ĉ_t(k, y) = #{records of the count period with label y and key k} + noise`` (read
through the count-median sketch, ``estimate_stacked``). For the positive label ``p`` the vector
``(ĉ_t(k, p))_{t,k}`` is therefore a noisy sum of the one-hot records of class ``p``: the
paper's noisy class sum (Su et al., KDD 2020, §3), and ``x̄_p = ĉ(·, p) / n̂_p`` its class mean.
We divide by ``n̂_p``, the prior table's noisy count of label ``p`` over the count period: the
count an attacker reading the tables has (the true count is released nowhere: SQL keeps no
count). Its noise is one draw of the prior table's scale, negligible against ``n_p``, whereas
every one of the ``d`` coordinates carries its own draw; taking ``n_p`` as known instead (as
the paper does for its ``class_mean``) would change the mean by a factor ``n_p / n̂_p`` common to
all coordinates. The count period and the hot period hold different windows: the attacker
reads the mean of the count period's records and attacks the hot period's, which is the
service's real exposure when records of the same population keep arriving.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from service.core.features.columns import combine_codes, encode_column
from service.core.features.runtime import StreamRuntime
from service.core.tables.sketch import KeyHasher, estimate_stacked


@dataclass(frozen=True)
class OneHot:
    """``x`` (n × d, float32, 0/1); column ``c`` is key ``keys[c]`` of table
    ``rt.tables[table[c]]``; ``dropped``: (table, key) columns left out over the cap."""

    x: np.ndarray
    table: np.ndarray
    keys: list[bytes]
    dropped: int


def one_hot(
    rt: StreamRuntime, columns: Mapping[str, Sequence[object]], n: int, *, max_columns: int
) -> OneHot:
    """The records (feature name → ``n`` values; an absent name is null) one-hot per table of
    ``rt``. Over ``max_columns`` (table, key) pairs in all, the most frequent are kept (ties in
    table order, then first appearance)."""
    specs = {f.name: f for f in rt.features}
    missing: list[object] = [None] * n
    codes: list[np.ndarray] = []
    table_keys: list[list[bytes]] = []
    cand: list[tuple[int, int, int]] = []
    for j, t in enumerate(rt.tables):
        parts = [encode_column(columns.get(f) or missing, specs[f]) for f in t.features]
        enc = combine_codes(parts)
        freq = np.bincount(enc.codes, minlength=len(enc.keys))
        codes.append(enc.codes)
        table_keys.append(enc.keys)
        cand.extend((-int(freq[c]), j, c) for c in range(len(enc.keys)))
    kept = sorted(cand)[:max_columns]
    kept.sort(key=lambda c: (c[1], c[2]))  # columns grouped by table, keys in first-seen order
    x = np.zeros((n, len(kept)), dtype=np.float32)
    col_of = [np.full(len(k), -1, dtype=np.int64) for k in table_keys]
    for c, (_, j, code) in enumerate(kept):
        col_of[j][code] = c
    rows = np.arange(n)
    for j in range(len(rt.tables)):
        col = col_of[j][codes[j]] if n else np.zeros(0, np.int64)
        hit = col >= 0
        x[rows[hit], col[hit]] = 1.0
    return OneHot(
        x=x,
        table=np.array([j for _, j, _ in kept], dtype=np.int64),
        keys=[table_keys[j][code] for _, j, code in kept],
        dropped=len(cand) - len(kept),
    )


def count_table_mean(
    rt: StreamRuntime,
    encoded: OneHot,
    *,
    cells: np.ndarray,
    offsets: np.ndarray,
    prior: np.ndarray,
    positive: str,
) -> tuple[np.ndarray, float]:
    """The positive class's mean read off the count tables, column by column of ``encoded``:
    ``ĉ_t(k, p) / max(n̂_p, 1)`` (module docstring), and ``n̂_p``. ``cells``/``offsets``: the
    count period's tables stacked as ``service.core.features.featurizer.Featurizer`` holds them
    (table
    ``rt.tables[j]`` starts at ``offsets[j]``); ``prior``: the prior table's noisy counts."""
    p = rt.label_index[positive]
    groups = [
        (t.name, [encoded.keys[c] for c in np.flatnonzero(encoded.table == j).tolist()])
        for j, t in enumerate(rt.tables)
    ]
    buckets, signs = KeyHasher(seed=rt.hash_seed, spec=rt.spec).hash_many(groups)
    if len(encoded.keys) == 0:
        return np.zeros(0), float(prior[p])
    est = estimate_stacked(cells, np.asarray(offsets)[encoded.table], buckets, signs, rt.spec)
    n_hat = float(prior[p])
    return np.asarray(est[:, p], dtype=np.float64) / max(n_hat, 1.0), n_hat

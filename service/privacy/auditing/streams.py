"""Small streams for the audit: every data set over a tiny observation domain, run through the
counting path (hot rows as ingest writes them, ``parse_rows``, the per-user bound
``within_bound``, ``count_increments``) and through a selection round's scoring
(``score_candidates`` on the padded data, as ``select_round`` scores), and the neighbouring pairs
of those data sets."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import orjson

from service.core.dp.selection import (
    Candidate,
    padded_weight,
    score_candidates,
    score_sensitivity,
)
from service.core.features.columns import Encoded, table_name
from service.core.features.counting import Parsed, count_increments, parse_rows, within_bound
from service.core.features.runtime import StreamRuntime, TableRef
from service.core.streamconfig import StreamCreate

HASH_SEED = bytes(range(32))  # public to the auditor: the search is over data, not the seed
RELATIONS = ("add_remove", "replace", "user")


@dataclass
class SmallStream:
    """A stream configuration with its runtime (one table per feature) and a domain of
    observations (feature values and a label), each as ingest writes a hot row."""

    cfg: StreamCreate
    domain: list[dict[str, str]]
    rt: StreamRuntime = field(init=False)
    parsed: Parsed = field(init=False)
    _tables: dict[tuple[int, ...], np.ndarray] = field(init=False, default_factory=dict)
    _scores: dict[tuple[int, ...], list[Candidate]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        tables = tuple(
            TableRef(i, table_name([f.name]), (f.name,), 1)
            for i, f in enumerate(self.cfg.features, 1)
        )
        self.rt = StreamRuntime(
            id=1, name=self.cfg.name, config=self.cfg, hash_seed=HASH_SEED, tables=tables
        )
        rows = b",".join(
            orjson.dumps(
                {
                    "id": None,
                    "f": {k: v for k, v in o.items() if k != "label"},
                    "y": o["label"],
                    "t": None,
                }
            )
            for o in self.domain
        )
        self.parsed = parse_rows(self.rt, rows, after=b"", last=b"1-1")[0]

    @property
    def user_key(self) -> str | None:
        return self.cfg.privacy.user_key

    def user_of(self, obs: int) -> str | None:
        return None if self.user_key is None else self.domain[obs][self.user_key]

    def scales(self) -> np.ndarray:
        """Every coordinate's noise scale (Laplace b, Gaussian σ) as a window's preparation
        computes them (``service.windows.service.prepare``): the tables', then the prior's."""
        rt = self.rt
        cells, labels = rt.spec.cells, rt.spec.n_labels
        parts = [np.full(cells, rt.noise.scale_for(rt.weight_of(t))) for t in rt.tables]
        parts.append(np.full(labels, rt.noise.scale_for(rt.prior_weight)))
        return np.concatenate(parts)

    def tables(self, data: Sequence[int]) -> np.ndarray:
        """The increments the counting path makes for ``data`` (indices into the domain, in
        arrival order) as one dense vector: every table's cells, then the prior's."""
        rt, parsed = self.rt, self.parsed
        spec = rt.spec
        out = np.zeros(len(rt.tables) * spec.cells + spec.n_labels, np.int64)
        rows = np.array(data, np.int64)
        if parsed.users is not None:
            seen = np.zeros(len(parsed.user_ids), np.int64)
            mask, _ = within_bound(
                parsed.users[rows], seen, rt.config.privacy.max_contributions_per_window
            )
            rows = rows[mask]
        encoded = {f: Encoded(e.codes[rows], e.keys) for f, e in parsed.encoded.items()}
        inc = count_increments(rt, rt.tables, encoded, parsed.labels[rows])
        for i in range(inc.n_tables):
            lo, hi = int(inc.bounds[i]), int(inc.bounds[i + 1])
            np.add.at(out, i * spec.cells + inc.cells[lo:hi], inc.deltas[lo:hi])
        return out

    # -- selection --------------------------------------------------------------------------

    def selection_columns(self, data: Sequence[int]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The columns and label indices a selection round reads for ``data`` (the service's
        ``_hot_columns``: each feature's values coded by ``np.unique``)."""
        cols: dict[str, np.ndarray] = {}
        for f in self.cfg.features:
            values = [self.domain[i][f.name] for i in data]
            cols[f.name] = (
                np.unique(np.array(values, dtype=object), return_inverse=True)[1]
                .reshape(-1)
                .astype(np.int64)
                if values
                else np.zeros(0, np.int64)
            )
        labels = np.array([self.cfg.labels.index(self.domain[i]["label"]) for i in data], np.int64)
        return cols, labels

    def selection_scores(self, data: Sequence[int]) -> list[Candidate]:
        """The candidates with the padded scores ``select_round`` hands to ``select``:
        ``score_candidates`` times ``padded_weight`` (``min_records`` placeholders); memoised."""
        key = tuple(data)
        if key not in self._scores:
            self._scores[key] = self._score(key)
        return self._scores[key]

    def _score(self, data: tuple[int, ...]) -> list[Candidate]:
        p = self.cfg.privacy
        cols, labels = self.selection_columns(data)
        cands = score_candidates(
            columns=cols,
            labels=labels,
            n_labels=len(self.cfg.labels),
            tables=[t.features for t in self.rt.tables],
            score=p.selection_score,
        )
        w = padded_weight(n=len(data), min_records=p.min_records)
        return [replace(c, gain=w * c.gain) for c in cands]

    def selection_sensitivity(self) -> float:
        p = self.cfg.privacy
        return score_sensitivity(
            score=p.selection_score, n=p.min_records, n_labels=len(self.cfg.labels)
        )

    def selection_log_probs(self, scores: np.ndarray) -> np.ndarray:
        """log P[outcome] of one round picking one group (``groups_per_round = 1``): the
        candidates, then ⊥ (-inf without a threshold): ``select``'s exponential mechanism
        (module docstring of ``service.core.dp.selection``). Used as a test statistic only: a wrong
        formula costs the audit power, never validity."""
        p = self.cfg.privacy
        beta = 2.0 * self.selection_sensitivity() / p.epsilon_selection
        m = scores.shape[-1]
        tau = p.selection_threshold
        stop = -math.inf if tau is None else tau + beta * (p.selection_margin + math.log(m))
        z = np.concatenate([scores, np.full(scores.shape[:-1] + (1,), stop)], axis=-1) / beta
        z = z - z.max(axis=-1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def small_stream(
    body: Mapping[str, Any], values: Mapping[str, Sequence[str]], labels: Sequence[str]
) -> SmallStream:
    """A :class:`SmallStream` of configuration ``body`` (``features`` from ``values``' keys)
    over every observation of ``values`` × ``labels``."""
    names = list(values)
    cfg = StreamCreate.model_validate(
        {"name": "audit", "features": [{"name": n} for n in names], "labels": list(labels), **body}
    )
    domain = [
        {**dict(zip(names, combo, strict=True)), "label": y}
        for combo in itertools.product(*(values[n] for n in names))
        for y in labels
    ]
    return SmallStream(cfg, domain)


def datasets(n_domain: int, max_len: int, *, ordered: bool) -> list[tuple[int, ...]]:
    """Every data set of at most ``max_len`` observations: sequences (arrival order matters:
    the per-user bound counts a user's first ones) or multisets (sorted tuples)."""
    out: list[tuple[int, ...]] = []
    for n in range(max_len + 1):
        if ordered:
            out.extend(itertools.product(range(n_domain), repeat=n))
        else:
            out.extend(itertools.combinations_with_replacement(range(n_domain), n))
    return out


def neighbours(
    stream: SmallStream, sets: Sequence[tuple[int, ...]], relation: str
) -> Iterable[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every pair (larger or equal data set, its neighbour) among ``sets`` under ``relation``:
    ``add_remove`` (one observation removed, anywhere in the arrival order), ``replace`` (one
    observation replaced by another in its place), ``user`` (every observation of one user
    removed)."""
    if relation not in RELATIONS:
        raise ValueError(f"relation must be one of {RELATIONS}, got {relation=}")
    known = set(sets)
    ordered = any(s != tuple(sorted(s)) for s in sets)

    def norm(s: tuple[int, ...]) -> tuple[int, ...]:
        return s if ordered else tuple(sorted(s))

    for data in sets:
        if relation == "user":
            for u in {stream.user_of(o) for o in data} - {None}:
                yield data, tuple(o for o in data if stream.user_of(o) != u)
            continue
        for pos in range(len(data)):
            if relation == "add_remove":
                yield data, norm(data[:pos] + data[pos + 1 :])
            else:
                for o in range(len(stream.domain)):
                    other = norm(data[:pos] + (o,) + data[pos + 1 :])
                    if other in known and other != data:
                        yield data, other

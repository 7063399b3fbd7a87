"""The count tables of any stream (``DriftStream``) as the service builds them, in process.

With the service's own code, as ``bench.accuracy.core_arm`` does for MovieLens: the stream
configuration validated by ``StreamCreate`` (one table per feature, ``max_tables`` = features
+ 1, no slot for selection; laplace ε per window; sketch 16384 × 3; another operating point
(``Point``: sketch, the features that get a table, ``table_weights``, ``prior_weight``) changes
only that body), the runtime
(``StreamRuntime``: feature specs, sketch spec, every table's noise from
``service.core.dp.budget``), the features encoded (``encode_column``), the increments counted
(``count_increments``), one noise draw per window and table (``sample_noise`` at the table's
``noise.scale_for``; the prior table at its own weight), the columns derived as ``featurize``
derives them (count-median ``estimate``, the back-off threshold from ``noise.variance_for``,
``derived_columns``, with the empirical-Bayes σ² and τ² of the featurizer's ``_shrinkage``
when ``featurize.shrinkage`` asks for them, ``assemble``).

Sketches are linear: the count period's aggregate when windows 0 .. k-1 are counted is the
increments of their rows plus the sum of their per-window noise. Every window's prior table
(its label counts plus the prior table's noise) is kept apart: it is what the service releases
of the label rate's history, per window."""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

from bench.accuracy.drift_streams import DriftStream
from service.core.dp.noise import sample_noise
from service.core.features.columns import (
    Encoded,
    assemble,
    backoff_threshold,
    derived_columns,
    encode_column,
    prior_probabilities,
    table_name,
)
from service.core.features.counting import count_increments
from service.core.features.runtime import StreamRuntime, TableRef
from service.core.streamconfig import StreamCreate
from service.core.tables.sketch import KeyHasher, estimate

SEED = b"bench-accuracy-drift"  # the sketches' hash seed (a stream's is random)
EPSILON = 1.0
WIDTH, DEPTH = 16384, 3
SHRINKAGES = ("pseudo_count", "empirical_bayes")


def shrinkage_module() -> Any | None:
    """``service.core.features.shrinkage`` when the service has it (else None)."""
    try:
        return importlib.import_module("service.core.features.shrinkage")
    except ImportError:
        return None


@dataclass(frozen=True)
class Point:
    """An operating point: the sketch, which features get a count table (None: every feature),
    the budget weights (``privacy.table_weights``; the prior table's ``prior_weight``, None: the
    service's default) and ε per window. ``max_tables`` = tables + 1 (no slot for selection)."""

    label: str = "today's: 7 tables, 16384 × 3"
    width: int = WIDTH
    depth: int = DEPTH
    features: tuple[str, ...] | None = None
    weights: tuple[tuple[str, float], ...] = ()
    prior_weight: float | None = None
    epsilon: float = EPSILON


DEFAULT_POINT = Point()


@dataclass
class Draw:
    """One noise draw of a split: the summed table noise when the first k windows are counted
    (``tables[k]``, for the k asked for), and every window's prior-table noise (n_windows, L)."""

    tables: dict[int, list[np.ndarray]]
    prior: np.ndarray


class DriftArm:
    def __init__(
        self, stream: DriftStream, *, epsilon: float | None = None, point: Point = DEFAULT_POINT
    ) -> None:
        self.stream = stream
        self.point = point if epsilon is None else dataclasses.replace(point, epsilon=epsilon)
        self.epsilon = self.point.epsilon
        chosen = point.features
        self.features = tuple(f for f in stream.features if chosen is None or f["name"] in chosen)
        if chosen is not None and len(self.features) != len(chosen):
            unknown = sorted(set(chosen) - {f["name"] for f in stream.features})
            raise ValueError(f"features: {unknown} are not features of {stream.name}")
        self.tables = tuple(
            TableRef(i + 1, table_name([f["name"]]), (f["name"],), 1)
            for i, f in enumerate(self.features)
        )
        rt = self.runtime(1)
        self.encoded = {
            f.name: encode_column(stream.values[f.name].tolist(), f) for f in rt.features
        }
        self.labels = stream.y.astype(np.int64)
        keys = [(t.name, self.encoded[t.features[0]].keys) for t in self.tables]
        buckets, signs = KeyHasher(seed=SEED, spec=rt.spec).hash_many(keys)
        ends = np.cumsum([0, *(len(k) for _, k in keys)])
        self.hashes = [(buckets[a:b], signs[a:b]) for a, b in zip(ends[:-1], ends[1:], strict=True)]
        n_windows = len(stream.bounds) - 1
        self.window_counts = np.array(
            [np.bincount(self.labels[stream.window(i)], minlength=2) for i in range(n_windows)]
        )

    def body(self, hot: int, shrinkage: str = "pseudo_count") -> dict[str, Any]:
        featurize = {} if shrinkage == "pseudo_count" else {"shrinkage": shrinkage}
        pt = self.point
        privacy: dict[str, Any] = {"mechanism": "laplace", "epsilon": self.epsilon}
        if pt.weights:
            privacy["table_weights"] = dict(pt.weights)
        if pt.prior_weight is not None:
            privacy["prior_weight"] = pt.prior_weight
        # a feature whose parent ("of") has no table is declared without the link
        names = {f["name"] for f in self.features}
        features = [
            f if f.get("of") in names else {k: v for k, v in f.items() if k != "of"}
            for f in self.features
        ]
        return {
            "name": self.stream.name,
            "features": features,
            "labels": ["0", "1"],
            "hot_windows": hot,
            "retention_windows": 10_000,
            "privacy": privacy,
            "sketch": {"width": pt.width, "depth": pt.depth},
            "max_tables": len(self.features) + 1,
            **({"featurize": featurize} if featurize else {}),
        }

    @functools.cache  # noqa: B019 (one arm per stream and process)
    def runtime(self, hot: int, shrinkage: str = "pseudo_count") -> StreamRuntime:
        """The stream as the service would run it with ``hot`` hot windows."""
        cfg = StreamCreate.model_validate(self.body(hot, shrinkage))
        return StreamRuntime(1, self.stream.name, cfg, SEED, self.tables)

    def exact(self, k: int) -> list[np.ndarray]:
        """Every table's cells, without noise, once windows 0 .. k-1 are counted."""
        rt, upto = self.runtime(1), self.stream.bounds[k]
        encoded = {f: Encoded(e.codes[:upto], e.keys) for f, e in self.encoded.items()}
        inc = count_increments(rt, rt.tables, encoded, self.labels[:upto])
        out = []
        for i in range(len(rt.tables)):
            cells = np.zeros(rt.spec.cells, np.int64)
            a, b = inc.bounds[i], inc.bounds[i + 1]
            np.add.at(cells, inc.cells[a:b], inc.deltas[a:b])
            out.append(cells)
        return out

    def draw(self, counted: Sequence[int], n_windows: int) -> Draw:
        """Fresh noise (the service's CSPRNG sampler): every table's for windows 0 .. max
        (counted) - 1, summed at each k of ``counted``, and the prior table's of windows 0 ..
        n_windows - 1."""
        rt = self.runtime(1)
        cells = rt.spec.cells
        summed = [np.zeros(cells, np.int64) for _ in rt.tables]
        out: dict[int, list[np.ndarray]] = {}
        for k in range(1, max(counted) + 1):
            for i, t in enumerate(rt.tables):
                summed[i] += self._noise(rt, rt.weight_of(t), cells)
            if k in counted:
                out[k] = [s.copy() for s in summed]
        prior = np.stack([self._noise(rt, rt.prior_weight, 2) for _ in range(n_windows)])
        return Draw(out, prior)

    def noisy_prior(self, draw: Draw, windows: Sequence[int]) -> np.ndarray:
        """The prior table of each of ``windows`` as released: label counts + noise."""
        idx = list(windows)
        return self.window_counts[idx] + draw.prior[idx]

    def columns(
        self,
        rt: StreamRuntime,
        cells: list[np.ndarray],
        prior_counts: np.ndarray,
        k: int,
        rows: Sequence[slice],
    ) -> list[np.ndarray]:
        """The service's count columns of each of ``rows`` (same tables for all), with ``k``
        counted windows; ``rt.config.featurize.shrinkage`` chooses the p/log-odds columns."""
        prior = prior_probabilities(prior_counts)
        settings = rt.config.featurize
        shrink = shrinkage_module() if settings.shrinkage == "empirical_bayes" else None
        blocks: list[list[Any]] = [[] for _ in rows]
        eb_params = None
        if shrink is not None:  # σ² and τ² per table, by the featurizer's own code
            from service.core.features import featurizer

            stacked = np.concatenate(cells)
            offsets = np.arange(len(cells), dtype=np.int64) * rt.spec.cells
            agg = SimpleNamespace(n_windows=k)
            eb_params = featurizer._shrinkage(rt, agg, stacked, offsets, prior, None)  # type: ignore[arg-type]
        for j, (t, table_cells, (buckets, signs)) in enumerate(
            zip(rt.tables, cells, self.hashes, strict=True)
        ):
            variance = rt.noise.variance_for(rt.weight_of(t))
            thr = backoff_threshold(
                noise_variance=variance,
                n_windows=k,
                n_labels=rt.spec.n_labels,
                sigmas=settings.backoff_sigmas,
            )
            by_key = estimate(table_cells, buckets, signs, rt.spec)
            codes = self.encoded[t.features[0]].codes
            eb: dict[str, Any] = {}
            sigma2s, tau2s = eb_params if eb_params is not None else (None, None)
            if tau2s is not None:
                eb = {"sigma2": None if sigma2s is None else sigma2s[j], "tau2": tau2s[j]}
            for out, sl in zip(blocks, rows, strict=True):
                est = by_key[codes[sl]]
                out.append(
                    derived_columns(est, prior=prior, alpha=settings.alpha, threshold=thr, **eb)
                )
        return [assemble(b, [], sl.stop - sl.start) for b, sl in zip(blocks, rows, strict=True)]

    def passthrough(self, train: slice, test: slice) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Every feature's raw value (the service's ``<f>:value``; ``<f>_value`` here, LightGBM
        refuses a colon in a name) of the train rows and the test rows as a model sees them:
        categorical ones as categories of the train rows' values (a value the train set never
        had is missing), numeric ones as numbers."""
        cats = set(self.stream.categorical)
        tr: dict[str, Any] = {}
        te: dict[str, Any] = {}
        for name, v in self.stream.values.items():
            if name in cats:
                known = pd.unique(v[train])
                tr[f"{name}_value"] = pd.Categorical(v[train], categories=known)
                seen = pd.Series(v[test]).where(lambda x: x.isin(known))  # noqa: B023
                te[f"{name}_value"] = pd.Categorical(seen, categories=known)
            else:
                tr[f"{name}_value"] = v[train].astype(np.float64)
                te[f"{name}_value"] = v[test].astype(np.float64)
        return pd.DataFrame(tr), pd.DataFrame(te)

    @staticmethod
    def _noise(rt: StreamRuntime, weight: float, size: int) -> np.ndarray:
        scale = rt.noise.scale_for(weight)
        return sample_noise(mechanism=rt.noise.mechanism, scale=scale, size=size)  # type: ignore[arg-type]

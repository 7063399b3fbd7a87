"""1. Featurize batch, in process: the service's ``Featurizer`` against scikit-learn's
``TargetEncoder`` and category_encoders' ``CountEncoder`` on the same rows."""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.cli.synthetic import ClickLog, generate, stream_body
from service.core.dp.noise import sample_noise
from service.core.features.columns import MISSING, Encoded, encode_numbers, table_name
from service.core.features.counting import count_increments
from service.core.features.featurizer import Featurizer
from service.core.features.runtime import StreamRuntime, TableRef
from service.core.streamconfig import StreamCreate
from service.core.tables.aggregate import Aggregate

Say = Callable[[str], None]


def build_runtime(body: dict[str, Any], seed: bytes) -> StreamRuntime:
    """The runtime of a stream registered with ``body``, one table per feature."""
    cfg = StreamCreate.model_validate(body)
    tables = tuple(
        TableRef(i + 1, table_name([f.name]), (f.name,), 1) for i, f in enumerate(cfg.features)
    )
    return StreamRuntime(id=1, name=cfg.name, config=cfg, hash_seed=seed, tables=tables)


def encoded(rt: StreamRuntime, log: ClickLog) -> dict[str, Encoded]:
    """Every feature of the log as the service encodes it (``encode_column``'s codes and
    keys), straight from the log's category codes (each occurring value once)."""
    names = log.spec.categorical_names
    out: dict[str, Encoded] = {}
    for f in rt.features:
        if f.name in names:
            j = names.index(f.name)
            raw = log.codes[:, j].astype(np.int64)
            raw[raw < 0] = log.spec.cardinalities[j]  # the vocabulary's trailing None
            used, codes = np.unique(raw, return_inverse=True)
            keys = [MISSING if v is None else v.encode() for v in log.vocabulary[j][used]]
            out[f.name] = Encoded(codes.astype(np.int64), keys)
        else:
            col = log.numeric[:, log.spec.numeric_names.index(f.name)]
            out[f.name] = encode_numbers(np.nan_to_num(col, nan=0.0), np.isnan(col), f)
    return out


def build_aggregate(rt: StreamRuntime, log: ClickLog) -> Aggregate:
    """The aggregate of epoch 2: one window's noisy tables counting ``log``, as the service
    makes them (noise from ``service.core.dp.noise``, increments from
    ``service.core.features.counting``)."""
    spec, noise = rt.spec, rt.noise

    def draw(weight: float, size: int) -> np.ndarray:
        if noise.mechanism == "none":
            return np.zeros(size, np.int64)
        scale = noise.scale_for(weight)
        return sample_noise(mechanism=noise.mechanism, scale=scale, size=size)  # type: ignore[arg-type]

    labels = log.label.astype(np.int64)
    inc = count_increments(rt, rt.tables, encoded(rt, log), labels)
    parts = [draw(rt.weight_of(t), spec.cells) for t in rt.tables]
    parts.append(draw(rt.prior_weight, spec.n_labels))
    for i, cells in enumerate(parts):
        lo, hi = inc.bounds[i], inc.bounds[i + 1]
        cells[inc.cells[lo:hi]] += inc.deltas[lo:hi]
    layout = [(t.id, spec.cells) for t in rt.tables]
    return Aggregate(2, 1, 1, [1], layout, np.concatenate(parts).astype(np.int64))


@dataclass
class BatchResult:
    rows: int
    ours_columns: float | None  # seconds, columnar input (same columns as the baselines)
    ours_rows: float | None  # seconds, list-of-dicts input (the HTTP body's shape)
    ours_full: float | None  # seconds, all 39 features (numeric bucketised + passthrough)
    target_encoder: float | None
    count_encoder: float | None
    n_columns: int
    n_columns_full: int
    runs: dict[str, list[float]] = field(default_factory=dict)  # seconds, per repeat


def _baselines(counted: ClickLog, served: ClickLog, say: Say) -> dict[str, Callable[[], object]]:
    import warnings

    import category_encoders as ce
    from sklearn.preprocessing import TargetEncoder

    x_fit, x = counted.frame(), served.frame()
    say("featurize batch: fitting TargetEncoder (not timed)")
    te = TargetEncoder(target_type="binary", random_state=0).fit(x_fit, counted.label)
    say("featurize batch: fitting CountEncoder (not timed)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cenc = ce.CountEncoder(cols=list(x.columns)).fit(x_fit)

    def count_encode() -> object:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cenc.transform(x)

    return {"target_encoder": lambda: te.transform(x), "count_encoder": count_encode}


def bench_featurize(n: int, repeats: int, say: Say, *, baselines: bool = True) -> BatchResult:
    say(f"featurize batch: generating 2 × {n:,} rows of the synthetic click log")
    counted = generate(n, seed=1)  # the count period (and the encoders' fit data)
    served = generate(n, seed=2)  # the rows to featurize
    seed = secrets.token_bytes(32)
    rt_cat = build_runtime(stream_body("speedcat", numeric=False), seed)
    rt_full = build_runtime(stream_body("speedfull"), seed)
    say("featurize batch: counting the count period into noisy sketches")
    fz_cat = Featurizer.build(rt_cat, build_aggregate(rt_cat, counted))
    fz_full = Featurizer.build(rt_full, build_aggregate(rt_full, counted))
    cols_cat: dict[str, Any] = served.columns(numeric=False)  # object arrays, as columns
    cols_full: dict[str, Any] = served.columns()
    rows_cat = served.rows(numeric=False)

    def fresh(fz: Featurizer) -> Featurizer:  # a cold Featurizer each run: no state carried
        return Featurizer.build(fz.rt, fz.agg)

    jobs: dict[str, Callable[[], object]] = {
        "ours_columns": lambda: fresh(fz_cat).transform_columns(cols_cat, n),
        "ours_full": lambda: fresh(fz_full).transform_columns(cols_full, n),
        "ours_rows": lambda: fresh(fz_cat).transform(rows_cat),
    }
    if baselines:
        jobs.update(_baselines(counted, served, say))
    first = next(iter(jobs))
    say(f"featurize batch: warm-up ({first})")
    jobs[first]()
    runs: dict[str, list[float]] = {}
    for r in range(repeats):
        for name, fn in jobs.items():
            t = time.perf_counter()
            out = fn()
            dt = time.perf_counter() - t
            del out
            runs.setdefault(name, []).append(dt)
            say(f"featurize batch: repeat {r + 1}/{repeats} {name}: {dt:.2f} s")

    def med(name: str) -> float | None:
        return statistics.median(runs[name]) if name in runs else None

    return BatchResult(
        rows=n,
        ours_columns=med("ours_columns"),
        ours_rows=med("ours_rows"),
        ours_full=med("ours_full"),
        target_encoder=med("target_encoder"),
        count_encoder=med("count_encoder"),
        n_columns=len(fz_cat.columns),
        n_columns_full=len(fz_full.columns),
        runs=runs,
    )

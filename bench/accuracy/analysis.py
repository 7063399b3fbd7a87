"""The figures of the accuracy report, from the per-cut results (``Eval`` rows): means over the
cuts and noise draws, ratios to the baseline, and the quantities the tables explain them with
(summed noise against the counts, users new to the count period, paired sketch comparisons)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bench.accuracy.plan import Plan
from service.core.features.columns import backoff_threshold

COLUMNS = ("log_loss", "auc", "rounds", "backoff_movie", "backoff_user", "est_bias", "est_rmse")


def summarise(frame: pd.DataFrame) -> pd.DataFrame:
    """Means over the cuts (and over the noise draws) per (method, share, privacy), the ratio to
    the baseline's log-loss, and ``ratio_sd``: the standard deviation of the ratio across noise
    draws (NaN with a single draw)."""
    f = frame.copy()
    f["share"] = f["share"].fillna(0.0)
    f["privacy"] = f["privacy"].fillna("")
    for col in ("backoff_movie", "backoff_user", "est_bias", "est_rmse"):
        if col not in f:
            f[col] = math.nan
    if "draw" not in f:
        f["draw"] = 0
    keys = ["method", "share", "privacy"]
    per_draw = f.groupby([*keys, "draw"], sort=False)[list(COLUMNS)].mean().reset_index()
    g = per_draw.groupby(keys, sort=False)[list(COLUMNS)].mean().reset_index()
    g["draws"] = per_draw.groupby(keys, sort=False)["draw"].nunique().to_numpy()
    base = g.loc[g["method"] == "baseline", "log_loss"].iloc[0]
    g["ratio"] = g["log_loss"] / base
    sd = per_draw.groupby(keys, sort=False)["log_loss"].std().to_numpy()
    g["ratio_sd"] = sd / base
    return g


def get(g: pd.DataFrame, method: str, share: float = 0.0, privacy: str = "") -> pd.Series | None:
    hit = g[(g["method"] == method) & np.isclose(g["share"], share) & (g["privacy"] == privacy)]
    return None if hit.empty else hit.iloc[0]


def val(g: pd.DataFrame, key: str, method: str, share: float, privacy: str = "") -> float:
    r = get(g, method, share, privacy)
    return math.nan if r is None else float(r[key])


@dataclass(frozen=True)
class SignalNoise:
    """At the last cut, for one hot-window share and one noise."""

    windows: int  # windows in the count period
    sd: float  # the count period's noise s.d. per cell and label
    threshold: float  # the back-off threshold
    median_count: float  # median exact count of a test row's movie in the count period
    below: float  # share of test rows whose movie has fewer exact ratings than the threshold


def signal_vs_noise(df: pd.DataFrame, plan: Plan, share: float, variance: float) -> SignalNoise:
    """``variance``: the movie table's per-cell, per-window noise variance."""
    cut = max(plan.cuts)
    w = plan.window(share)
    windows = cut // w - 1
    thr = backoff_threshold(noise_variance=variance, n_windows=windows, n_labels=2, sigmas=1.0)
    counts = df["movie_id"].iloc[: cut - w].value_counts()
    test = df["movie_id"].iloc[plan.test(cut)].map(counts).fillna(0).to_numpy()
    sd = math.sqrt(variance * windows)
    return SignalNoise(windows, sd, thr, float(np.median(test)), float((test < thr).mean()))


def novelty(df: pd.DataFrame, plan: Plan, share: float) -> tuple[float, float]:
    """Mean over the cuts of the share of test rows whose user has no rating in the count
    period (what count features know), and no rating before the cut at all (what the
    baseline knows)."""
    users = df["user_id"].to_numpy()
    w = plan.window(share)
    in_counts, before = [], []
    for cut in plan.cuts:
        test = users[plan.test(cut)]
        in_counts.append(float((~np.isin(test, users[: cut - w])).mean()))
        before.append(float((~np.isin(test, users[:cut])).mean()))
    return statistics.mean(in_counts), statistics.mean(before)


def noise_cost(g: pd.DataFrame, share: float, noisy: str, clean: str = "no noise") -> float:
    """Relative log-loss increase of the HTTP runs with noise ``noisy`` over those without, at
    the same share."""
    return val(g, "log_loss", "http", share, noisy) / val(g, "log_loss", "http", share, clean) - 1


@dataclass(frozen=True)
class Paired:
    """Count-min against count-median, per noise draw (the same draw feeds both sketches)."""

    draws: int
    configs: int
    mean: float  # mean relative log-loss difference, count-min / count-median − 1
    se: float  # its standard error over the draws (NaN with one draw)
    lower_draws: int  # draws where count-median's log-loss is lower
    lower_configs: int  # configurations (share × ε) where its mean is lower
    lo: float  # the smallest per-configuration difference
    hi: float  # the largest


def paired(frame: pd.DataFrame) -> Paired | None:
    core = frame[frame["method"].isin(["core-median", "core-min"])].copy()
    core = core[core["privacy"] != "no noise"]
    if core.empty:
        return None
    if "draw" not in core:
        core["draw"] = 0
    pair = (
        core.groupby(["share", "privacy", "draw", "method"])["log_loss"]
        .mean()
        .unstack("method")
        .dropna()
    )
    deltas = (pair["core-min"] / pair["core-median"] - 1).to_numpy()
    by_config = pair.groupby(level=["share", "privacy"]).mean()
    config_deltas = (by_config["core-min"] / by_config["core-median"] - 1).to_numpy()
    se = float(deltas.std(ddof=1) / math.sqrt(len(deltas))) if len(deltas) > 1 else math.nan
    return Paired(
        draws=len(deltas),
        configs=len(config_deltas),
        mean=float(deltas.mean()),
        se=se,
        lower_draws=int((deltas > 0).sum()),
        lower_configs=int((config_deltas > 0).sum()),
        lo=float(config_deltas.min()),
        hi=float(config_deltas.max()),
    )


def estimate_errors(g: pd.DataFrame) -> dict[str, tuple[float, float]] | None:
    """Means over the noisy configurations of (d), (count-median, count-min): the movie table's
    estimate bias and RMS error, its back-off share, and the s.d. of the log-loss ratio across
    noise draws."""
    med = g[(g["method"] == "core-median") & (g["privacy"] != "no noise")]
    pairs = []
    for _, m in med.iterrows():
        c = get(g, "core-min", m["share"], m["privacy"])
        if c is not None:
            pairs.append((m, c))
    if not pairs:
        return None

    def mean(key: str) -> tuple[float, float]:
        a = [float(m[key]) for m, _ in pairs if not math.isnan(m[key])]
        b = [float(c[key]) for _, c in pairs if not math.isnan(c[key])]
        return (
            statistics.mean(a) if a else math.nan,
            statistics.mean(b) if b else math.nan,
        )

    return {
        "est_bias": mean("est_bias"),
        "est_rmse": mean("est_rmse"),
        "backoff_movie": mean("backoff_movie"),
        "ratio_sd": mean("ratio_sd"),
    }

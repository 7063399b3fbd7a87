"""The accuracy section of BENCHMARKS.md: tables and plots only (``bench.report``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench import lgbm, movielens
from bench.accuracy import analysis
from bench.accuracy.analysis import get
from bench.accuracy.plan import Plan, Privacy, Setup, features_text, make_plan
from bench.accuracy.plots import plot_logloss, plot_sketches
from bench.report import PLOTS, Plot, Table
from service.core.dp.noise import zcdp_to_approx_dp

APPROX_DELTA, APPROX_DELTA_TEXT = 1e-9, "1e-9"  # gaussian rows also as (ε′, δ)-DP at this δ


@dataclass(frozen=True)
class Output:
    """Where a run's per-cut CSV and plots go: ``prefix`` (``--out``) or bench/plots."""

    prefix: Path | None
    quick: bool

    def path(self, suffix: str, ext: str) -> Path:
        if self.prefix is None:
            PLOTS.mkdir(parents=True, exist_ok=True)
            return PLOTS / f"accuracy{'_quick' if self.quick else ''}{suffix}.{ext}"
        self.prefix.parent.mkdir(parents=True, exist_ok=True)
        return self.prefix.parent / f"{self.prefix.name}{suffix}.{ext}"


def pct(share: float) -> str:
    return f"{share * 100:g} %"


def pm(r: pd.Series) -> str:
    """The ratio in bold, ± its s.d. across noise draws when there are several."""
    sd = "" if math.isnan(r["ratio_sd"]) else f" ± {r['ratio_sd']:.3f}"
    return f"**{r['ratio']:.3f}**{sd}"


def title(setup: Setup) -> str:
    sk = setup.sketching
    text = "Accuracy: count featurization on MovieLens 100K" + (" (quick)" if setup.quick else "")
    if not sk.default:
        text += f" (depth {sk.depth}, width {sk.width}, T = {sk.max_tables})"
    return text


def sections(
    frame: pd.DataFrame,
    df: pd.DataFrame,
    setup: Setup,
    out: Output,
    training: lgbm.Training = lgbm.DEFAULT,
) -> list[Table | Plot]:
    plan = make_plan(len(df), setup.cut_shares)
    g = analysis.summarise(frame)
    parts: list[Table | Plot] = [
        setup_table(frame, df, plan, setup, training),
        noise_table(setup),
        references(g, setup),
    ]
    if not g[g["method"] == "http"].empty:
        parts += [
            http_table(g, setup),
            Plot("log-loss ratio and AUC vs exposure", plot_logloss(g, setup, out)),
            signal_table(g, df, plan, setup),
            cost_table(g, setup),
            novelty_table(df, plan, setup),
        ]
    if not g[g["method"].isin(["core-median", "core-min"])].empty:
        parts += [sketch_table(g, setup)]
        figure = plot_sketches(g, setup, out)
        if figure is not None:
            parts.append(Plot("count-median vs count-min", figure))
        parts.append(paired_table(frame, g))
    if not g[g["method"].str.startswith("ablation:")].empty:
        parts.append(ablation_table(g))
    return parts


def setup_table(
    frame: pd.DataFrame, df: pd.DataFrame, plan: Plan, setup: Setup, training: lgbm.Training
) -> Table:
    sk = setup.sketching
    y = movielens.labels01(df)
    cuts = ", ".join(f"{c * 100:g}" for c in setup.cut_shares)
    td = sk.max_tables * sk.depth
    rows: list[list[object]] = [
        ["data", f"MovieLens 100K, {len(df):,} ratings in time order, {y.mean():.1%} positive"],
        ["label", "`rating >= 4`"],
        ["raw features (baselines)", features_text(movielens.FEATURES)],
        ["count tables", features_text(sk.features)],
        ["cuts", f"{cuts} % of the ratings"],
        [
            "test rows",
            f"the next {plan.test_rows:,} at each cut ({len(plan.cuts)} × "
            f"{plan.test_rows:,}, the same for every model; figures are means over the cuts)",
        ],
        ["hot window (exposure)", ", ".join(pct(s) for s in setup.shares)],
        ["count period", "every rating before the hot window (`hot_windows` 1)"],
        [
            "sketch",
            f"width {sk.width}, depth {sk.depth}, `max_tables` {sk.max_tables}: "
            f"Δ1 = {td}, Δ2 = √{td}",
        ],
    ]
    if sk.weights:
        weights = ", ".join(f"{f}={w:g}" for f, w in sk.weights)
        rows.append(["budget split (`table_weights`)", weights])
    rows += [
        ["HTTP replays at ε = 1", setup.http_draws_eps1],
        ["core noise draws per configuration", setup.core_draws],
        *lgbm.describe(training),
        ["runtime", f"{float(frame['elapsed'].iloc[0]) / 60:.1f} min"],
    ]
    return Table(["setup", ""], rows, "Setup")


def noise_table(setup: Setup) -> Table:
    """Every noisy configuration's per-cell, per-window noise, as the service derives it."""
    sk = setup.sketching
    rows = []
    for pr in setup.configs():
        if pr.mechanism == "none":
            continue
        noise = sk.noise(pr)
        approx = (
            "" if pr.rho is None else f"{zcdp_to_approx_dp(rho=pr.rho, delta=APPROX_DELTA):.2g}"
        )
        kind = "b" if pr.mechanism == "laplace" else "σ"
        rows.append(
            [
                pr.label,
                f"{kind} = {noise.scale_for(1.0):.4g}",
                f"{math.sqrt(noise.variance_for(1.0)):.3g}",
                approx,
            ]
        )
    header = ["noise", "scale per cell and window", "s.d.", f"as (ε′, δ = {APPROX_DELTA_TEXT})-DP"]
    return Table(header, rows, "Noise of a table of weight 1")


def references(g: pd.DataFrame, setup: Setup) -> Table:
    base, prior = get(g, "baseline"), get(g, "prior")
    assert base is not None and prior is not None
    cuts = f"{min(setup.cut_shares):.0%}-{max(setup.cut_shares):.0%}"
    rows: list[list[object]] = [
        [
            "(a) baseline: LightGBM, raw categorical",
            "all ratings before the cut",
            cuts,
            f"{base['log_loss']:.4f}",
            "1",
            f"{base['auc']:.4f}",
        ],
        [
            "label prior of the training rows",
            "",
            "",
            f"{prior['log_loss']:.4f}",
            f"{prior['ratio']:.3f}",
            "0.5",
        ],
    ]
    for share in setup.shares:
        r = get(g, "raw-hot", share)
        if r is not None:
            rows.append(
                [
                    "LightGBM, raw categorical, hot window only",
                    "the hot window's raw ratings",
                    pct(share),
                    f"{r['log_loss']:.4f}",
                    f"{r['ratio']:.3f}",
                    f"{r['auc']:.4f}",
                ]
            )
    header = ["model", "trained on", "exposure", "log-loss", "÷ baseline", "AUC"]
    return Table(header, rows, "References")


def http_table(g: pd.DataFrame, setup: Setup) -> Table:
    rows = []
    for pr in setup.configs():
        cells: list[object] = [pr.label]
        for share in setup.shares:
            r = get(g, "http", share, pr.label)
            cells.append("" if r is None else f"{pm(r)} ({r['auc']:.3f})")
        rows.append(cells)
    draws = (
        f"; ε = 1: mean ± s.d. of {setup.http_draws_eps1} replays"
        if setup.http_draws_eps1 > 1
        else ""
    )
    name = f"(b, c) Count features through the service: test log-loss ÷ baseline (AUC){draws}"
    return Table(["count features"] + [pct(s) for s in setup.shares], rows, name)


def _shown(setup: Setup) -> list[Privacy]:
    """The noisy configurations the per-share tables show: ε = 1 and the largest ε."""
    keep = (1.0, max(setup.epsilons))
    return [p for p in setup.configs() if p.mechanism != "none" and p.epsilon in keep]


def signal_table(g: pd.DataFrame, df: pd.DataFrame, plan: Plan, setup: Setup) -> Table:
    sk = setup.sketching
    rows = []
    for share in setup.shares:
        for pr in _shown(setup):
            variance = sk.noise(pr).variance_for(sk.weight("movie_id"))
            s = analysis.signal_vs_noise(df, plan, share, variance)
            r = get(g, "http", share, pr.label)
            rows.append(
                [
                    pct(share),
                    pr.label,
                    s.windows,
                    f"{math.sqrt(variance):.3g}",
                    f"{s.sd:.0f}",
                    f"{s.threshold:.0f}",
                    f"{s.median_count:.0f}",
                    f"{s.below:.0%}",
                    "" if r is None else f"{r['backoff_movie']:.0%}",
                ]
            )
    header = [
        "hot window",
        "noise",
        "count windows",
        "s.d./window",
        "s.d. summed",
        "back-off threshold",
        "median movie count",
        "movies below",
        "measured back-off",
    ]
    name = f"Movie table: summed noise against the counts, at the {max(setup.cut_shares):.0%} cut"
    return Table(header, rows, name)


def cost_table(g: pd.DataFrame, setup: Setup) -> Table:
    rows = []
    for pr in setup.configs():
        if pr.mechanism == "none":
            continue
        rows.append(
            [pr.label] + [f"{analysis.noise_cost(g, s, pr.label):+.1%}" for s in setup.shares]
        )
    header = ["noise"] + [pct(s) for s in setup.shares]
    return Table(header, rows, "Log-loss increase over no noise at the same exposure")


def novelty_table(df: pd.DataFrame, plan: Plan, setup: Setup) -> Table:
    rows = []
    for share in setup.shares:
        new, unseen = analysis.novelty(df, plan, share)
        rows.append([pct(share), f"{new:.0%}", f"{unseen:.0%}", f"{plan.window(share):,}"])
    header = [
        "hot window",
        "user without rating in the count period",
        "user without rating before the cut",
        "training rows",
    ]
    return Table(header, rows, "Test rows from users new to the count period (means over cuts)")


def sketch_table(g: pd.DataFrame, setup: Setup) -> Table:
    core = g[g["method"].isin(["core-median", "core-min"])]
    rows = []
    for share in sorted(core["share"].unique()):
        for pr in setup.core_configs():
            med = get(g, "core-median", share, pr.label)
            cmin = get(g, "core-min", share, pr.label)
            ht = get(g, "http", share, pr.label)
            if med is None or cmin is None:
                continue
            rows.append(
                [
                    pct(share),
                    pr.label,
                    pm(med),
                    pm(cmin),
                    f"{cmin['log_loss'] - med['log_loss']:+.4f}",
                    f"{med['auc']:.3f} / {cmin['auc']:.3f}",
                    f"{med['backoff_movie']:.0%} / {cmin['backoff_movie']:.0%}",
                    f"{med['est_bias']:+.0f} / {cmin['est_bias']:+.0f}",
                    f"{med['est_rmse']:.0f} / {cmin['est_rmse']:.0f}",
                    "" if ht is None else f"{ht['ratio']:.3f}",
                ]
            )
    header = [
        "hot window",
        "noise",
        "count-median ÷ baseline",
        "count-min ÷ baseline",
        "Δ log-loss (min − median)",
        "AUC median / min",
        "movie back-off median / min",
        "movie-count error, mean: median / min",
        "movie-count error, RMS: median / min",
        "HTTP run (count-median, other noise draw)",
    ]
    name = "(d) Count-median vs count-min under the same noise (core, in-process)"
    return Table(header, rows, name)


def paired_table(frame: pd.DataFrame, g: pd.DataFrame) -> Table:
    rows: list[list[object]] = []
    p = analysis.paired(frame)
    if p is not None:
        se = "" if math.isnan(p.se) else f" ± {p.se:.1%} (s.e.)"
        rows += [
            ["paired noise draws (configurations)", f"{p.draws} ({p.configs})"],
            ["count-min log-loss ÷ count-median − 1, mean", f"{p.mean:+.1%}{se}"],
            ["per configuration, from … to", f"{p.lo:+.1%} … {p.hi:+.1%}"],
            [
                "count-median lower: draws, configurations",
                f"{p.lower_draws} of {p.draws}, {p.lower_configs} of {p.configs}",
            ],
        ]
    errors = analysis.estimate_errors(g)
    if errors is not None:
        for key, name, fmt in (
            ("est_bias", "movie-count error, mean", "{:+.0f}"),
            ("est_rmse", "movie-count error, RMS", "{:.0f}"),
            ("backoff_movie", "movie back-off", "{:.0%}"),
            ("ratio_sd", "s.d. of log-loss ÷ baseline across draws", "{:.1%}"),
        ):
            med, cmin = errors[key]
            rows.append([f"{name}: median / min", f"{fmt.format(med)} / {fmt.format(cmin)}"])
    return Table(["count-min vs count-median, noisy configurations of (d)", ""], rows)


def ablation_table(g: pd.DataFrame) -> Table:
    abl = g[g["method"].str.startswith("ablation:")]
    share = float(abl["share"].iloc[0])
    clean = get(g, "core-median", share, "no noise")
    every = get(g, "core-median", share, Privacy("laplace", 1.0).label)
    ref = float("nan") if clean is None else float(clean["log_loss"])
    rows: list[Sequence[object]] = []
    if clean is not None:
        rows.append(["none (no noise)", f"{clean['ratio']:.3f}", "+0.0%"])
    for _, r in abl.sort_values("log_loss", ascending=False).iterrows():
        rows.append(
            [
                f"{r['method'].split(':', 1)[1]} only",
                f"{r['ratio']:.3f}",
                f"{r['log_loss'] / ref - 1:+.1%}",
            ]
        )
    if every is not None:
        rows.append(
            [
                "every table and the prior",
                f"{every['ratio']:.3f}",
                f"{every['log_loss'] / ref - 1:+.1%}",
            ]
        )
    name = (
        f"Noise on one table only (core, count-median, {pct(share)} hot window, laplace ε = 1, "
        f"mean of {int(abl['draws'].max())} draws)"
    )
    return Table(["noise on", "log-loss ÷ baseline", "log-loss vs no noise"], rows, name)

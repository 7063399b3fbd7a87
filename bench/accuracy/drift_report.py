"""The drift evaluation's section of BENCHMARKS.md (``<!-- bench:accuracy-drift -->``): tables
and one plot (``bench.report``), and the per-split figures as CSV in bench/results/.

Every figure of a count model is computed per noise draw against the same split's prior and
raw model, then summarised as mean ± s.d. over the draws; a mean over splits is the mean of the
per-draw means over splits, its spread their s.d. over draws."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench import report
from bench.report import Plot, Table

KEY = "accuracy-drift"
TITLE = "Accuracy across drift: count features split by split, base rate and shrinkage"
RESULTS = report.ROOT / "bench" / "results"
MAIN_COMMAND = "selectivity bench accuracy --drift"
POINTS_COMMAND = "selectivity bench accuracy --drift --points"
GOAL_AUC_LIFT, GOAL_RECALIBRATED = 0.90, 0.85  # issue's goal: mean over splits
STREAM_TITLES = {"movielens": "MovieLens 100K", "acs": "ACS employment MA"}
BASE_RATE = (
    ("columns", 1, "(a) nothing"),
    ("shift H=1", 1, "(b) shift to recency-weighted noisy prior, H = 1"),
    ("shift H=2", 1, "(b) idem, H = 2"),
    ("shift H=4", 1, "(b) idem, H = 4"),
    ("shift H=∞", 1, "(b) idem, H = ∞ (all windows)"),
    ("reweight H=2", 1, "(c) class reweighting to the H = 2 target"),
    ("columns", 2, "(a) nothing, h = 2"),
    ("shift H=2", 2, "(b) H = 2, h = 2"),
    ("prior columns", 2, "(d) noisy prior rates as columns, h = 2"),
)
HOT_ROWS = (
    ("columns", "count columns"),
    ("passthrough", "count columns + raw hot values"),
    ("raw hot period only", "LightGBM on the hot period's raw rows alone"),
)
SHRINKAGE = (
    ("columns", "pseudo-count columns (today's)"),
    ("empirical Bayes", "empirical-Bayes log-odds"),
    ("passthrough", "pseudo-count + raw hot-window values"),
    ("empirical Bayes + passthrough", "empirical Bayes + raw hot-window values"),
)


def figures(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per count model and draw with its split's reference figures and the ratios."""
    keys = ["stream", "split"]
    prior = frame[frame.model == "prior"].set_index(keys)
    raw = frame[frame.model == "raw"].set_index(keys)
    counts = frame[frame.model.isin(["counts", "raw-hot"])].copy()
    idx = pd.MultiIndex.from_frame(counts[keys])
    counts["ll_prior"] = prior.loc[idx, "ll"].to_numpy()
    counts["llo_prior"] = prior.loc[idx, "ll_oracle"].to_numpy()
    counts["ll_raw"] = raw.loc[idx, "ll"].to_numpy()
    counts["llo_raw"] = raw.loc[idx, "ll_oracle"].to_numpy()
    counts["auc_raw"] = raw.loc[idx, "auc"].to_numpy()
    counts["share"] = (counts.ll_prior - counts.ll) / (counts.ll_prior - counts.ll_raw)
    counts["share_oracle"] = (counts.llo_prior - counts.ll_oracle) / (
        counts.llo_prior - counts.llo_raw
    )
    counts["auc_lift"] = (counts.auc - 0.5) / (counts.auc_raw - 0.5)
    counts["gap"] = counts.ll - counts.ll_oracle  # what an intercept could still win
    counts["worse_than_prior"] = counts.ll > counts.ll_prior
    return counts


def per_split(fig: pd.DataFrame) -> pd.DataFrame:
    """Mean and s.d. over draws per stream, split, hot period and variant."""
    cols = ["ll", "auc", "ll_oracle", "share", "share_oracle", "auc_lift", "gap"]
    keys = ["stream", "split", "window", "kind", "hot", "variant"]
    g = fig.groupby(keys, sort=False)
    out = g[cols].mean()
    sd = g[cols].std(ddof=1).add_suffix("_sd")
    first = ["hot_rate", "test_rate", "ll_prior", "llo_prior", "ll_raw", "llo_raw", "auc_raw"]
    out = pd.concat([g[first].first(), out, sd], axis=1).reset_index()
    return out.sort_values(["stream", "split", "hot"], kind="stable").reset_index(drop=True)


def over_splits(fig: pd.DataFrame, column: str) -> tuple[float, float]:
    """The mean over splits of ``column``, ± the s.d. over draws of that mean."""
    by_draw = fig.groupby("draw")[column].mean()
    return float(by_draw.mean()), float(by_draw.std(ddof=1)) if len(by_draw) > 1 else np.nan


def pm(mean: float, sd: float, *, pct: bool = True) -> str:
    if pct:
        text = f"{mean * 100:.0f} %"
        return text if np.isnan(sd) else f"{text} ± {sd * 100:.0f}"
    text = f"{mean:.4f}"
    return text if np.isnan(sd) else f"{text} ± {sd:.4f}"


def split_table(splits: pd.DataFrame, fig: pd.DataFrame, stream: str) -> Table:
    rows: list[list[object]] = []
    s = splits[(splits.stream == stream) & (splits.hot == 1) & (splits.variant == "columns")]
    for r in s.itertuples():
        rows.append(
            [
                f"{r.window} ({r.kind})",
                f"{r.hot_rate:.3f} → {r.test_rate:.3f}",
                f"{r.ll_prior:.4f}",
                f"{r.ll_raw:.4f}",
                pm(r.ll, r.ll_sd, pct=False),
                pm(r.share, r.share_sd),
                pm(r.share_oracle, r.share_oracle_sd),
                f"{r.auc_raw:.4f}",
                pm(r.auc, r.auc_sd, pct=False),
                pm(r.auc_lift, r.auc_lift_sd),
            ]
        )
    f = fig[(fig.stream == stream) & (fig.hot == 1) & (fig.variant == "columns")]
    mean: list[object] = ["**mean**", "", f"{f.ll_prior.mean():.4f}", f"{f.ll_raw.mean():.4f}"]
    mean += [pm(*over_splits(f, "ll"), pct=False), pm(*over_splits(f, "share"))]
    mean += [pm(*over_splits(f, "share_oracle")), f"{f.auc_raw.mean():.4f}"]
    mean += [pm(*over_splits(f, "auc"), pct=False), pm(*over_splits(f, "auc_lift"))]
    rows.append(mean)
    header = [
        "test window",
        "label rate hot → test",
        "LL prior",
        "LL raw",
        "LL counts",
        "share of raw gain kept",
        "after oracle recalibration",
        "AUC raw",
        "AUC counts",
        "AUC lift kept",
    ]
    title = f"{STREAM_TITLES.get(stream, stream)}: per split, h = 1 hot window, ε = 1"
    return Table(header, rows, title)


def summary_rows(f: pd.DataFrame, label: str) -> list[object]:
    per = f.groupby("split")[["share", "ll", "ll_prior"]].mean()
    worse = int((per.ll > per.ll_prior).sum())
    return [
        label,
        pm(*over_splits(f, "ll"), pct=False),
        pm(*over_splits(f, "share")),
        f"{per.share.min() * 100:.0f} %",
        f"{worse} of {len(per)}",
        pm(*over_splits(f, "gap"), pct=False),
        pm(*over_splits(f, "share_oracle")),
        pm(*over_splits(f, "auc_lift")),
    ]


SUMMARY_HEADER = [
    "model",
    "LL (mean over splits)",
    "share kept",
    "worst split",
    "splits worse than the prior",
    "calibration gap (LL − oracle LL)",
    "share after oracle recalibration",
    "AUC lift kept",
]


def hot_table(fig: pd.DataFrame, stream: str) -> Table:
    rows = []
    for variant, label in HOT_ROWS:
        for h in sorted(fig[fig.stream == stream].hot.unique()):
            f = fig[(fig.stream == stream) & (fig.hot == h) & (fig.variant == variant)]
            if len(f):
                rows.append(summary_rows(f, f"{label}, h = {h}"))
    title = f"{STREAM_TITLES.get(stream, stream)}: hot period length h (windows)"
    return Table(SUMMARY_HEADER, rows, title)


def base_rate_table(fig: pd.DataFrame, stream: str) -> Table:
    rows = []
    for variant, h, label in BASE_RATE:
        f = fig[(fig.stream == stream) & (fig.hot == h) & (fig.variant == variant)]
        if len(f):
            rows.append(summary_rows(f, label))
    title = f"{STREAM_TITLES.get(stream, stream)}: base rate"
    return Table(SUMMARY_HEADER, rows, title)


def shrinkage_table(fig: pd.DataFrame, stream: str) -> Table:
    rows = []
    for variant, label in SHRINKAGE:
        f = fig[(fig.stream == stream) & (fig.hot == 1) & (fig.variant == variant)]
        if len(f):
            rows.append(summary_rows(f, label))
    title = f"{STREAM_TITLES.get(stream, stream)}: shrinkage and raw values (h = 1)"
    return Table(SUMMARY_HEADER, rows, title)


def plot(splits: pd.DataFrame, streams: Sequence[str], path: Path) -> Path:
    plt = report.pyplot()
    fig, axes = plt.subplots(1, len(streams), figsize=(6.5 * len(streams), 4.2), squeeze=False)
    lines = (
        ("columns", "share", "counts: share of raw gain kept"),
        ("shift H=2", "share", "counts + shift to noisy prior (H = 2)"),
        ("passthrough", "share", "counts + raw hot-window values"),
        ("columns", "share_oracle", "counts after oracle recalibration"),
        ("columns", "auc_lift", "counts: AUC lift kept"),
    )
    for ax, stream in zip(axes[0], streams, strict=True):
        s = splits[(splits.stream == stream) & (splits.hot == 1)]
        for variant, col, label in lines:
            d = s[s.variant == variant]
            if not len(d):
                continue
            x = np.arange(len(d))
            ax.errorbar(x, d[col] * 100, yerr=d[f"{col}_sd"] * 100, marker="o", capsize=3)
            ax.lines[-1].set_label(label)
        names = s[s.variant == "columns"]
        ax.set_xticks(np.arange(len(names)))
        ax.set_xticklabels([f"{w}\n{k}" for w, k in zip(names.window, names.kind, strict=True)])
        ax.axhline(0, color="grey", lw=0.8)
        ax.axhline(100, color="grey", lw=0.8, ls="--")
        ax.set_ylabel("% of the raw model's (h = 1, ε = 1)")
        ax.set_title(STREAM_TITLES.get(stream, stream))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def saved_command() -> str:
    """The section's command when --points re-makes it: the full run's tables from its CSV."""
    return f"{MAIN_COMMAND} --from-csv bench/results/accuracy_drift.csv"


def points_tables(frame: pd.DataFrame, command: str = POINTS_COMMAND) -> list[Table]:
    """--points: each operating point's figures over the splits (h = 1 and 3; count columns,
    and + every feature's raw hot values), and signal against noise per table."""
    from bench.accuracy import drift

    fig = figures(frame)
    points = [p for p in drift.movielens_points() if p.label in set(fig.point.dropna())]
    draws = int(fig[fig.model == "counts"].draw.nunique())
    n_splits = int(fig.split.nunique())

    def cell(f: pd.DataFrame, col: str) -> str:
        return pm(*over_splits(f, col)) if len(f) else "—"

    arms = {p.label: drift._arm("movielens", None, p) for p in points}
    hot = fig[(fig.model == "raw-hot") & (fig.hot == 3)].drop_duplicates(["split"])
    hot_oracle = float(hot.share_oracle.mean()) if len(hot) else np.nan
    rows: list[list[object]] = []
    for p in points:
        f = fig[fig.point == p.label]
        rt = arms[p.label].runtime(1)
        sd = {t.features[0]: np.sqrt(rt.noise.variance_for(rt.weight_of(t))) for t in rt.tables}
        row: list[object] = [p.label, f"{sd.get('movie_id', np.nan):.1f}"]
        c1 = f[(f.hot == 1) & (f.variant == "columns")]
        row += [cell(c1, "share"), cell(c1, "auc_lift")]
        for variant in ("columns", "passthrough"):
            c3 = f[(f.hot == 3) & (f.variant == variant)]
            row += [cell(c3, "share"), cell(c3, "share_oracle"), cell(c3, "auc_lift")]
        raw3 = f[(f.hot == 3) & (f.variant == "passthrough")]
        if len(raw3):
            recal, lift = over_splits(raw3, "share_oracle")[0], over_splits(raw3, "auc_lift")[0]
            row.append(f"{round((recal - hot_oracle) * 100) + 0:+d} pts")
            worse = (raw3.groupby("split").ll.mean() > raw3.groupby("split").ll_prior.first()).any()
            ok = lift >= GOAL_AUC_LIFT and recal >= GOAL_RECALIBRATED and not worse
            row.append("yes" if ok else "no")
        else:
            row += ["—", "—"]
        rows.append(row)
    if len(hot):
        ref: list[object] = ["LightGBM on the 3 hot windows' raw rows alone (no counts)"]
        ref += [""] * 6
        ref += [f"{hot.share.mean() * 100:.0f} %", f"{hot.share_oracle.mean() * 100:.0f} %"]
        ok = hot.auc_lift.mean() >= GOAL_AUC_LIFT and hot_oracle >= GOAL_RECALIBRATED
        ok = ok and not (hot.ll > hot.ll_prior).any()
        rows.append([*ref, f"{hot.auc_lift.mean() * 100:.0f} %", "", "yes" if ok else "no"])
    header = [
        "operating point (ε = 1, laplace)",
        "noise s.d. per cell and window, movie_id",
        "h = 1 counts: share kept",
        "h = 1: AUC lift kept",
        "h = 3 counts: share kept",
        "h = 3: recalibrated",
        "h = 3: AUC lift kept",
        "h = 3 counts + raw values: share kept",
        "h = 3 + raw: recalibrated",
        "h = 3 + raw: AUC lift kept",
        "h = 3 + raw: recalibrated, against the raw rows alone",
        "goal met (AUC lift ≥ 90 %, recalibrated ≥ 85 %, no split worse than the prior)",
    ]
    title = (
        f"MovieLens 100K: operating points at ε = 1 ({n_splits} splits, {draws} draws; `{command}`)"
    )
    tables = [Table(header, rows, title)]
    base = arms[points[0].label] if points else None
    if base is not None:
        tables.append(signal_table(base, [(p.label, arms[p.label]) for p in points], 3))
    return tables


def signal_table(base: Any, arms: Sequence[tuple[str, Any]], hot: int) -> Table:
    """Per table (a column each): the signal (mean count per key and label in a window, over
    the keys the window holds), how many test rows' keys the count period holds at all (``hot``
    hot windows, mean over the splits), and each operating point's noise s.d. per cell and
    window (summed over k counted windows: × √k, against k × the signal)."""
    s = base.stream
    n_windows = len(s.bounds) - 1
    names = [f["name"] for f in s.features]
    signal: list[object] = ["signal: mean count per key and label, per window"]
    seen: list[object] = [f"test rows whose key the count period holds (h = {hot})"]
    for name in names:
        codes = base.encoded[name].codes
        per_key = [
            len(codes[s.window(i)]) / len(np.unique(codes[s.window(i)])) for i in range(n_windows)
        ]
        signal.append(f"{np.mean(per_key) / 2:.1f}")
        held = []
        for e in s.splits:
            counted = np.unique(codes[: s.bounds[e - hot]])
            held.append(np.isin(codes[s.window(e)], counted).mean())
        seen.append(f"{np.mean(held) * 100:.0f} %")
    rows: list[list[object]] = [signal, seen]
    for label, arm in arms:
        rt = arm.runtime(1)
        sd = {t.features[0]: rt.noise.variance_for(rt.weight_of(t)) ** 0.5 for t in rt.tables}
        row: list[object] = [f"noise s.d.: {label}"]
        rows.append(row + [f"{sd[n]:.1f}" if n in sd else "—" for n in names])
    header = ["", *(f"{n} ({len(base.encoded[n].keys):,} keys)" for n in names)]
    return Table(header, rows, "MovieLens 100K: signal against noise per table (ε = 1)")


def report_parts(
    frame: pd.DataFrame,
    *,
    quick: bool,
    plots: Path = report.PLOTS,
    points: tuple[pd.DataFrame, str] | None = None,
) -> tuple[list[Table | Plot], pd.DataFrame]:
    fig = figures(frame)
    splits = per_split(fig)
    streams = [s for s in STREAM_TITLES if s in set(frame.stream)]
    parts: list[Table | Plot] = []
    for stream in streams:
        parts += [
            split_table(splits, fig, stream),
            hot_table(fig, stream),
            base_rate_table(fig, stream),
            shrinkage_table(fig, stream),
        ]
    http = RESULTS / "accuracy_drift_http.csv"
    if not quick and http.exists():
        confirmed = pd.read_csv(http)
        title = "HTTP against in process: MovieLens, hot window 80-90 %, next 1,000 ratings, ε = 1"
        parts.append(Table(list(confirmed.columns), confirmed.to_numpy().tolist(), title))
    saved = RESULTS / "accuracy_drift_points.csv"
    if points is None and not quick and saved.exists():
        saved_frame = pd.read_csv(saved)
        command = saved_frame["command"].iloc[0] if "command" in saved_frame else POINTS_COMMAND
        points = (saved_frame, str(command))
    if points is not None:
        parts += points_tables(*points)
    suffix = "_quick" if quick else ""
    png = plot(splits, streams, report.plot_path(f"accuracy_drift{suffix}", plots))
    parts.append(Plot("Share of the raw model's gain kept, per split", png))
    return parts, splits


def write(
    frame: pd.DataFrame,
    *,
    command: str,
    write: bool,
    quick: bool,
    out_dir: Path | None = None,
    points: tuple[pd.DataFrame, str] | None = None,
) -> pd.DataFrame:
    """The section (into BENCHMARKS.md when ``write``, else printed), the plot and the
    per-split CSV (in ``out_dir`` when given); the per-split figures. ``points``: the
    operating-point comparison's records and command (default: the saved one, if any)."""
    parts, splits = report_parts(frame, quick=quick, plots=out_dir or report.PLOTS, points=points)
    results = out_dir or RESULTS
    results.mkdir(parents=True, exist_ok=True)
    splits.to_csv(results / f"accuracy_drift_splits{'_quick' if quick else ''}.csv", index=False)
    if write:
        report.write_section(TITLE, parts, command=command, key=KEY)
    else:
        print(report.section(TITLE, parts, command=command))
    return splits

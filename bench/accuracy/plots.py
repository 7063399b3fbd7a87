"""The accuracy benchmark's two figures: log-loss ratio and AUC against exposure (the HTTP runs),
and count-median against count-min under the same noise (the core runs)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from bench.accuracy.analysis import get
from bench.accuracy.plan import Setup, features_text
from bench.report import pyplot

if TYPE_CHECKING:
    from bench.accuracy.report import Output


def _pct(share: float) -> str:
    return f"{share * 100:g} %"


def _line(
    ax: Any, g: pd.DataFrame, shares: list[float], method: str, privacy: str, metric: str, **kw: Any
) -> None:
    ys = [get(g, method, s, privacy) for s in shares]
    if all(v is not None for v in ys):
        ax.plot([s * 100 for s in shares], [v[metric] for v in ys], marker="o", **kw)  # type: ignore[index]


def _panel_title(setup: Setup, mech: str) -> str:
    sk = setup.sketching
    if mech == "laplace":
        per = "ε per window"
    elif setup.gaussian_delta is None:
        per = "ρ = ε²/2 per window"
    else:
        per = f"ρ for (ε, δ = {setup.gaussian_delta:g})-DP per window"
    point = "" if sk.default else f" (depth {sk.depth}, T = {sk.max_tables})"
    return f"{mech}: {per}{point}"


def plot_logloss(g: pd.DataFrame, setup: Setup, out: Output) -> Path:
    plt = pyplot()
    shares = list(setup.shares)
    xs = [s * 100 for s in shares]
    colors = plt.get_cmap("viridis")(np.linspace(0.05, 0.85, len(setup.epsilons)))
    mechs = [m for m in ("laplace", "gaussian") if m in setup.mechanisms] or ["laplace"]
    fig, axes = plt.subplots(
        2, len(mechs), figsize=(5.5 * len(mechs), 8), sharex=True, sharey="row"
    )
    axes = np.asarray(axes).reshape(2, len(mechs))
    base = get(g, "baseline")
    assert base is not None
    for col, mech in enumerate(mechs):
        for row, metric in enumerate(("ratio", "auc")):
            ax = axes[row][col]
            _line(
                ax,
                g,
                shares,
                "http",
                "no noise",
                metric,
                color="black",
                lw=2,
                label="count features, no noise",
            )
            for eps, c in sorted(zip(setup.epsilons, colors, strict=True), reverse=True):
                pr = setup.privacy(mech, eps)
                name = f"ε = {eps:g}" if mech == "laplace" else f"ρ = {pr.rho:.3g} (ε = {eps:g})"
                _line(ax, g, shares, "http", pr.label, metric, color=c, label=name)
            _line(
                ax,
                g,
                shares,
                "raw-hot",
                "",
                metric,
                color="grey",
                ls="--",
                label="raw hot window only (categorical)",
            )
            if metric == "ratio":
                ax.axhline(1.0, color="tab:red", lw=1, label="baseline (all raw data)")
                ax.axhspan(1.0, 1.05, color="tab:red", alpha=0.08, label="within 5 % of baseline")
                prior = get(g, "prior")
                if prior is not None:
                    ax.axhline(prior["ratio"], color="grey", ls=":", label="label prior")
                ax.set_title(_panel_title(setup, mech))
                if col == 0:
                    ax.set_ylabel("test log-loss / baseline log-loss")
            else:
                ax.axhline(base["auc"], color="tab:red", lw=1, label="baseline (all raw data)")
                if col == 0:
                    ax.set_ylabel("test AUC")
                ax.set_xlabel("exposure: hot window, % of all ratings (log scale)")
            ax.set_xscale("log")
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
            ax.minorticks_off()
            ax.grid(alpha=0.3)
            if row == 1:
                handles, names = axes[0][col].get_legend_handles_labels()
                ax.legend(
                    handles,
                    names,
                    fontsize=8,
                    loc="upper center",
                    bbox_to_anchor=(0.5, -0.2),
                    ncol=2,
                )
    sk = setup.sketching
    title = "MovieLens 100K, rating ≥ 4: LightGBM on count features through the service"
    if not sk.default:
        title += (
            f"\n(count tables: {features_text(sk.features)}; width {sk.width}, depth {sk.depth})"
        )
    quick = " (quick run)" if setup.quick else ""
    fig.suptitle(f"{title}, mean of {len(setup.cut_shares)} cuts{quick}", fontsize=10)
    fig.tight_layout()
    path = out.path("_logloss", "png")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_sketches(g: pd.DataFrame, setup: Setup, out: Output) -> Path | None:
    core = g[g["method"].isin(["core-median", "core-min"])]
    if core.empty:
        return None
    plt = pyplot()
    cshares = sorted(core["share"].unique())
    configs = [p.label for p in setup.core_configs()]
    fig, axes = plt.subplots(1, len(cshares), figsize=(3.2 * len(cshares) + 1, 4), sharey=True)
    axes = np.atleast_1d(axes)
    sketches = (
        ("core-median", "count-median", "tab:blue"),
        ("core-min", "count-min", "tab:orange"),
    )
    for ax, share in zip(axes, cshares, strict=True):
        pos = np.arange(len(configs))
        for k, (method, name, color) in enumerate(sketches):
            vals = [get(g, method, share, c) for c in configs]
            hs = [v["ratio"] if v is not None else np.nan for v in vals]
            err = [v["ratio_sd"] if v is not None else np.nan for v in vals]
            ax.bar(
                pos + (k - 0.5) * 0.38,
                hs,
                width=0.38,
                color=color,
                label=name,
                yerr=np.nan_to_num(err),
                capsize=3,
            )
        ax.axhline(1.0, color="tab:red", lw=1)
        ax.set_xticks(pos, [c.replace("laplace ", "") for c in configs], rotation=30, fontsize=8)
        ax.set_title(f"hot window {_pct(share)}", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylim(min(0.95, np.nanmin(core["ratio"]) - 0.02), None)
    axes[0].set_ylabel("test log-loss / baseline log-loss")
    axes[0].legend(fontsize=8)
    fig.suptitle(
        "count-median vs count-min tables under the same Laplace noise (core, in-process; "
        f"mean of {setup.core_draws} noise draws, bars ± 1 s.d.)",
        fontsize=10,
    )
    fig.tight_layout()
    path = out.path("_sketches", "png")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path

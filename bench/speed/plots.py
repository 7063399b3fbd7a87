"""The speed benchmark's figures: the ratios against their targets, the latency CDFs, and the
throughputs against their baselines."""

from __future__ import annotations

import numpy as np

from bench import report
from bench.report import Plot
from bench.speed.batch import BatchResult
from bench.speed.http_bench import HttpResult
from bench.speed.report import Row, rate


def plot(
    b: BatchResult | None,
    h: HttpResult | None,
    rows: list[Row],
    *,
    tag: str = "",
) -> list[Plot]:
    """The figures, as bench/plots/speed{tag}_*.png."""
    plt = report.pyplot()
    out: list[Plot] = []
    targets = [r for r in rows if r.target]
    if targets:
        fig, ax = plt.subplots(figsize=(8, 4.2))
        x = np.arange(len(targets))
        bottom = 0.01
        now = [r.ratio for r in targets]
        colors = ["tab:green" if r.met else "tab:red" for r in targets]
        ax.bar(
            x,
            np.subtract(now, bottom),
            0.6,
            bottom=bottom,
            color=colors,
            label="green: target met",
        )
        for i, r in enumerate(targets):
            bound = float(r.target.split()[1].rstrip("×"))
            ax.hlines(bound, i - 0.45, i + 0.45, colors="black", linestyles="--")
            ax.text(
                i - 0.45,
                bound * 1.05,
                r.target,
                va="bottom",
                fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
            )
            ax.text(
                x[i],
                np.sqrt(bottom * r.ratio),  # mid-bar (log scale): clear of the target lines
                f"{r.ratio:.2f}×",
                ha="center",
                va="top",
                fontsize=8,
                color="white",
                fontweight="bold",
            )
        ax.set_ylim(bottom, 10)
        labels = {
            "featurize_te": "featurize batch\n÷ TargetEncoder",
            "latency_p50": "HTTP featurize p50\n÷ no-op (lower is better)",
            "ingest_counted": "HTTP ingest, counted\n÷ pipelined XADD",
            "trainset": "train set\n÷ raw XRANGE",
        }
        ax.set_xticks(x, [labels.get(r.key, r.what) for r in targets], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("ratio (log scale)")
        ax.set_title("Ratios against the same run's baselines; dashed: the issue's targets")
        ax.legend(loc="upper right", fontsize=8)
        ax.margins(x=0.08)
        fig.tight_layout()
        p = report.plot_path(f"speed{tag}_ratios")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        out.append(Plot("Ratios against targets", p))
    if h is not None:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        labels_ = {
            "featurize": "featurize (1 row, 39 tables)",
            "noop": "no-op (same route class, key check, body, routing depth)",
            "noop_last": "first figures' no-op (matched last)",
            "healthz": "/healthz",
        }
        styles = {"featurize": "-", "noop": "--", "noop_last": "-.", "healthz": ":"}
        for name, style in styles.items():
            if name not in h.latency:
                continue
            xs = np.sort(np.asarray(h.latency[name]) * 1e3)
            ys = np.arange(1, len(xs) + 1) / len(xs)
            label = labels_[name]
            ax.plot(xs, ys, style, label=f"{label}: p50 {np.median(xs):.2f} ms")
        ax.set_xscale("log")
        ax.set_xlabel("client-side latency (ms, log scale)")
        ax.set_ylabel("fraction of requests")
        ax.set_title("HTTP latency, single-row requests, interleaved")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right")
        fig.tight_layout()
        p = report.plot_path(f"speed{tag}_latency_cdf")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        out.append(Plot("Latency CDF: featurize vs no-op", p))

    groups: list[tuple[str, list[tuple[str, float]]]] = []
    if b is not None:
        bars = []
        ours_s = b.ours_columns if b.ours_columns is not None else b.ours_rows
        if ours_s:
            bars.append(("Selectivity\nFeaturizer", b.rows / ours_s))
        if b.target_encoder:
            bars.append(("sklearn\nTargetEncoder", b.rows / b.target_encoder))
        if b.count_encoder:
            bars.append(("category_encoders\nCountEncoder", b.rows / b.count_encoder))
        groups.append((f"featurize batch\n{b.rows:,} rows × 26 categorical", bars))
    if h is not None and h.ingest:
        groups.append(
            ("ingest", [("HTTP ingest", rate(h.ingest)), ("pipelined\nXADD", rate(h.xadd))])
        )
        groups.append(
            (
                "train set",
                [("HTTP train set\n(Arrow)", rate(h.trainset)), ("raw\nXRANGE", rate(h.xrange))],
            )
        )
    if groups:
        fig, axes = plt.subplots(1, len(groups), figsize=(4.4 * len(groups), 4.4))
        axes = np.atleast_1d(axes)
        for ax, (title, bars) in zip(axes, groups, strict=True):
            names = [x[0] for x in bars]
            vals = [x[1] for x in bars]
            colors = ["tab:blue"] + ["tab:gray"] * (len(bars) - 1)
            ax.bar(names, vals, color=colors)
            for i, v in enumerate(vals):
                ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=8)
            ax.set_title(title, fontsize=10)
            ax.set_ylabel("rows / s")
            ax.tick_params(axis="x", labelsize=8)
            ax.margins(y=0.15)
        fig.suptitle("Throughput against baselines measured in the same run (higher is better)")
        fig.tight_layout()
        p = report.plot_path(f"speed{tag}_throughput")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        out.append(Plot("Throughput vs baselines", p))
    return out

"""The quality plot (matplotlib, from the bench extra): ``quality_figure`` builds it,
``plot_quality`` writes it. With no scored epoch the figure says so, and why
(``no_data``), rather than showing empty axes."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

from service.reference.schemas import QualityOut
from service.reference.service import MIN_TRAIN_ROWS

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def no_data(q: QualityOut) -> str | None:
    """Why there is nothing to plot yet (None when some epoch is scored)."""
    if any(p.log_loss is not None for p in q.epochs):
        return None
    if not q.epochs:
        return (
            f"stream {q.stream!r} has no reference model: one is fitted at each roll on the hot "
            f"period's closed windows, once they hold at least {MIN_TRAIN_ROWS} labelled rows "
            "with two labels; ingest labelled observations and roll"
        )
    p = q.epochs[-1]
    if not p.trained:
        return (
            f"the reference model of epoch {p.epoch} was not fitted: {p.train_rows} rows, at "
            f"least {MIN_TRAIN_ROWS} with two labels are needed; ingest labelled observations "
            "and roll"
        )
    return (
        f"the reference model of epoch {p.epoch} has no held-out rows to be scored on yet "
        f"({p.eval_rows or 0}); ingest labelled observations and roll"
    )


def quality_figure(q: QualityOut) -> Figure:
    """Log-loss against the label prior's, and AUC, per epoch; or the reason there are none."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    a, b = fig.subplots(1, 2)
    a.set_xlabel("epoch")
    a.set_ylabel("log-loss on the epoch's new observations")
    a.set_title(f"{q.stream}: progressive validation")
    b.set_xlabel("epoch")
    b.set_ylabel("AUC")
    b.set_title("AUC per epoch")
    why = no_data(q)
    if why is not None:
        for ax in (a, b):
            ax.set_xticks([])
            ax.set_yticks([])
        fig.text(
            0.5,
            0.5,
            textwrap.fill(f"no data yet: {why}", width=70),
            ha="center",
            va="center",
            fontsize=11,
            bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "grey"},
        )
        return fig
    pts = [p for p in q.epochs if p.log_loss is not None]
    a.plot([p.epoch for p in pts], [p.log_loss for p in pts], "o-", label="reference model")
    a.plot([p.epoch for p in pts], [p.prior_log_loss for p in pts], "s--", label="label prior")
    a.legend()
    b.plot([p.epoch for p in pts], [p.auc for p in pts], "o-", color="C2")
    b.axhline(0.5, color="grey", lw=0.8, ls=":")
    fig.tight_layout()
    return fig


def plot_quality(q: QualityOut, path: str) -> None:
    quality_figure(q).savefig(path, dpi=110)

"""The quality plot (matplotlib, from the bench extra)."""

from __future__ import annotations

from service.reference.schemas import QualityOut


def plot_quality(q: QualityOut, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [p for p in q.epochs if p.log_loss is not None]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot([p.epoch for p in pts], [p.log_loss for p in pts], "o-", label="reference model")
    a.plot([p.epoch for p in pts], [p.prior_log_loss for p in pts], "s--", label="label prior")
    a.set_xlabel("epoch")
    a.set_ylabel("log-loss on the epoch's new observations")
    a.set_title(f"{q.stream}: progressive validation")
    a.legend()
    b.plot([p.epoch for p in pts], [p.auc for p in pts], "o-", color="C2")
    b.axhline(0.5, color="grey", lw=0.8, ls=":")
    b.set_xlabel("epoch")
    b.set_ylabel("AUC")
    b.set_title("AUC per epoch")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

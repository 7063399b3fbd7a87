"""DP count-table selection on MovieLens 100K (issue 4): which groups selection picks, when,
and the reference model's progressive-validation quality with and without them.

`selectivity bench selection [--quick]`: two streams replay the same ratings in time order
through the service (in process, embedded Redis: ``bench.harness``) with forced rolls, one with
`epsilon_selection = 1` (one group per round), one without. After every roll the follow-ups the
worker would run (selection round, reference model) are run. Both streams use the same noise
settings; the baseline is the stream without selection, measured in the same run."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from bench import movielens
from bench.harness import Config, InProcess
from bench.report import Plot, Table, append_section, plot_path, pyplot

EPSILON = 5.0  # per-window table budget of both streams (selection's effect is the point here)


async def replay(windows: int, rows: int | None) -> dict[str, Any]:
    df = movielens.load()
    if rows:
        df = df.iloc[:rows]
    out: dict[str, Any] = {}
    async with InProcess(Config(http_timeout=600)) as svc:
        for name, eps_sel in (("without", 0.0), ("with", 1.0)):
            body = {
                "name": name,
                "features": movielens.stream_features(),
                "labels": ["0", "1"],
                "hot_windows": 2,
                "retention_windows": 50,
                "window_seconds": 366 * 86400,
                "sketch": {"width": 16384, "depth": 3},
                "max_tables": len(movielens.FEATURES) + 1 + 4,
                "privacy": {
                    "mechanism": "laplace",
                    "epsilon": EPSILON,
                    "epsilon_selection": eps_sel,
                    "groups_per_round": 1,
                },
            }
            await svc.call("POST", "/streams", "admin", 201, json=body)
            size = len(df) // windows
            t0 = time.perf_counter()
            epochs: list[dict] = []  # the quality of each epoch's model, read while it lives
            for w in range(windows):
                obs = movielens.observations(df.iloc[w * size : (w + 1) * size])
                for i in range(0, len(obs), 10_000):
                    part = {"observations": obs[i : i + 10_000]}
                    await svc.call(
                        "POST", f"/streams/{name}/observations", "producer", 202, json=part
                    )
                await svc.call("POST", f"/streams/{name}/roll", "admin")
                # the worker's part: the selection round and the reference model of the roll
                await svc.settle(name)
                got = (await svc.call("GET", f"/streams/{name}/quality", "admin")).json()
                epochs.extend(got["epochs"])
                print(
                    f"  {name} selection: window {w + 1}/{windows} rolled "
                    f"({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
            out[name] = {
                "tables": (await svc.call("GET", f"/streams/{name}/tables", "admin")).json(),
                "quality": {"epochs": epochs},
            }
    return out


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="selectivity bench selection", description=__doc__)
    p.add_argument("--quick", action="store_true", help="a third of the data, 8 windows")
    args = p.parse_args(argv)
    windows, rows = (8, 33_000) if args.quick else (12, None)
    res = asyncio.run(replay(windows, rows))
    picked = [t for t in res["with"]["tables"]["tables"] if t["reason"] == "selected"]
    q = {
        k: {e["epoch"]: e for e in res[k]["quality"]["epochs"] if e["log_loss"] is not None}
        for k in ("with", "without")
    }
    epochs = sorted(set(q["with"]) & set(q["without"]))
    rows_ = [
        [
            e,
            q["without"][e]["log_loss"],
            q["with"][e]["log_loss"],
            q["with"][e]["log_loss"] / q["without"][e]["log_loss"],
            q["without"][e]["auc"],
            q["with"][e]["auc"],
            q["with"][e]["prior_log_loss"],
        ]
        for e in epochs
    ]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(epochs, [r[1] for r in rows_], "o-", label="without selection")
    ax.plot(epochs, [r[2] for r in rows_], "s-", label="with selection (ε_sel = 1)")
    ax.plot(epochs, [r[6] for r in rows_], ":", color="grey", label="label prior")
    for t in picked:
        ax.axvline(t["first_epoch"], color="C1", lw=0.8, ls="--")
        ax.text(t["first_epoch"], ax.get_ylim()[1], t["name"], rotation=90, va="top", fontsize=7)
    ax.set_xlabel("epoch")
    ax.set_ylabel("log-loss on the epoch's new ratings")
    ax.set_title("Reference model, progressive validation (MovieLens 100K)")
    ax.legend()
    fig.tight_layout()
    png = plot_path("selection")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    mean = (sum(r[3] for r in rows_) / len(rows_)) if rows_ else float("nan")
    setup = Table(
        ["setup", ""],
        [
            [
                "streams",
                "two, the same ratings: one with a selection round at every roll, one without",
            ],
            ["data", f"{windows} windows of MovieLens 100K in time order"],
            [
                "tables",
                f"laplace ε = {EPSILON} per window, sketch 16384 × 3, hot_windows 2, "
                "max_tables = features + 5",
            ],
            ["selection", "ε_sel = 1, one group per round"],
            ["quality", "each epoch's reference model on the newest fifth of its train set"],
            ["mean log-loss ratio with / without selection", f"{mean:.4f}"],
        ],
    )
    groups = Table(
        ["group", "extends", "picked at roll to epoch", "rank", "counted from window"],
        [
            [t["name"], t["extends"], t["selected_epoch"], t["selection_rank"], t["first_epoch"]]
            for t in picked
        ],
        "Selected groups",
    )
    quality = Table(
        [
            "epoch",
            "log-loss without",
            "log-loss with",
            "with / without",
            "AUC without",
            "AUC with",
            "prior log-loss",
        ],
        rows_,
        "Reference model by epoch",
    )
    append_section(
        "DP count-table selection (MovieLens)",
        [setup, groups, quality, Plot("selection", png)],
        command="selectivity bench selection" + (" --quick" if args.quick else ""),
    )

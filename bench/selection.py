"""DP count-table selection on MovieLens 100K (issue 4): which groups selection picks, when,
and the reference model's progressive-validation quality with and without them.

`selectivity bench selection [--quick]`: two streams replay the same ratings in time order
through the service (in process, embedded Redis) with forced rolls, one with
`epsilon_selection = 1` (one group per round), one without. After every roll the worker's
background work (selection round, reference model) is awaited. Both streams use the same noise
settings; the baseline is the stream without selection, measured in the same run."""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench import movielens  # noqa: E402
from bench.report import append_section, markdown_table, plot_path  # noqa: E402
from service import resources  # noqa: E402
from service.admin import service as keys  # noqa: E402
from service.app import create_app  # noqa: E402
from service.config import Settings  # noqa: E402
from service.db.migrate import upgrade  # noqa: E402

EPSILON = 5.0  # per-window table budget of both streams (selection's effect is the point here)


async def _settle(ctx: Any) -> None:
    while ctx.caches.get("background"):
        await asyncio.gather(*list(ctx.caches["background"]), return_exceptions=True)


async def replay(windows: int, rows: int | None) -> dict[str, Any]:
    df = movielens.load()
    if rows:
        df = df.iloc[:rows]
    tmp = Path(tempfile.mkdtemp(prefix="selectivity-bench-"))
    settings = Settings(data_dir=tmp, embedded_worker=False, max_batch=10_000)
    upgrade(settings.resolved_database_url)
    embedded = resources.EmbeddedRedis(settings)
    ctx = await resources.build(settings, embedded=embedded)
    async with ctx.sessionmaker() as session, session.begin():
        admin = (await keys.create(session=session, role="admin")).key
    h = {"Authorization": f"Bearer {admin}"}
    out: dict[str, Any] = {}
    transport = httpx.ASGITransport(app=create_app(ctx=ctx))
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url="http://bench", timeout=600
        ) as c:
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
                r = await c.post("/v1/streams", headers=h, json=body)
                r.raise_for_status()
                size = len(df) // windows
                t0 = time.perf_counter()
                for w in range(windows):
                    part = df.iloc[w * size : (w + 1) * size]
                    obs = movielens.observations(part)
                    for i in range(0, len(obs), 10_000):
                        r = await c.post(
                            f"/v1/streams/{name}/observations",
                            headers=h,
                            json={"observations": obs[i : i + 10_000]},
                        )
                        r.raise_for_status()
                    r = await c.post(f"/v1/streams/{name}/roll", headers=h)
                    r.raise_for_status()
                    await _settle(ctx)
                    print(
                        f"  {name} selection: window {w + 1}/{windows} rolled "
                        f"({time.perf_counter() - t0:.0f} s)",
                        flush=True,
                    )
                out[name] = {
                    "tables": (await c.get(f"/v1/streams/{name}/tables", headers=h)).json(),
                    "quality": (await c.get(f"/v1/streams/{name}/quality", headers=h)).json(),
                }
    finally:
        await resources.close(ctx)
        embedded.close()
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
    groups = (
        markdown_table(
            ["group", "extends", "picked at roll to epoch", "rank", "counted from window"],
            [
                [
                    t["name"],
                    t["extends"],
                    t["selected_epoch"],
                    t["selection_rank"],
                    t["first_epoch"],
                ]
                for t in picked
            ],
        )
        if picked
        else "No group was selected."
    )
    mean = (sum(r[3] for r in rows_) / len(rows_)) if rows_ else float("nan")
    body = (
        f"Two streams, {windows} windows of MovieLens 100K in time order, laplace ε = {EPSILON} "
        f"per window for the tables, sketch 16384 × 3, hot_windows 2, max_tables = features + 5. "
        f"One stream runs a selection round at every roll (ε_sel = 1, one group per round); the "
        f"other does not. Quality: the reference model of each epoch scored on the ratings that "
        f"arrived during it.\n\nSelected groups:\n\n{groups}\n\n"
        + markdown_table(
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
        )
        + f"\n\nMean log-loss ratio with / without selection: {mean:.4f}.\n\n"
        f"![selection](bench/plots/{png.name})"
    )
    append_section(
        "DP count-table selection (MovieLens)",
        body,
        command="selectivity bench selection" + (" --quick" if args.quick else ""),
    )

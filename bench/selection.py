"""DP count-table selection on MovieLens 100K (issues 4 and 18): which groups selection picks,
when, and the reference model's progressive-validation quality with and without them, for each
candidate score.

`selectivity bench selection [--quick] [--replays R]`: per replay, three streams replay the same
ratings in time order through the service (in process, embedded Redis: ``bench.harness``) with
forced rolls: one without selection (the baseline, measured in the same run), one with
`epsilon_selection = 1` scoring candidates by the plug-in gain (`selection_score = "mi"`), one
by the AIC-penalised gain (`"aic"`, the default). After every roll the follow-ups the worker
would run (selection round, reference model) are run. All streams use the same noise settings;
each draws its own noise (CSPRNG), so a replay's ratio carries the noise of two streams, and
the figure is the mean over replays with its standard error."""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import time
from typing import Any

from bench import movielens
from bench.harness import Config, InProcess
from bench.report import Plot, Table, append_section, plot_path, pyplot

EPSILON = 5.0  # per-window table budget of every stream (selection's effect is the point here)
ARMS = (("without", 0.0, "aic"), ("mi", 1.0, "mi"), ("aic", 1.0, "aic"))
FIRST_COUNTED = 4  # a group picked at the first round (roll to epoch 2) is counted from window 4


async def replay(windows: int, rows: int | None, replays: int = 1) -> list[dict[str, Any]]:
    """``replays`` × the three arms of ``ARMS``; per replay and arm its tables and quality."""
    df = movielens.load()
    if rows:
        df = df.iloc[:rows]
    out: list[dict[str, Any]] = []
    async with InProcess(Config(http_timeout=600)) as svc:
        for r in range(replays):
            res: dict[str, Any] = {}
            for arm, eps_sel, score in ARMS:
                name = f"{arm}-{r}"
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
                        "selection_score": score,
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
                    f"  replay {r + 1}/{replays} {arm}: {windows} windows "
                    f"({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
                res[arm] = {
                    "tables": (await svc.call("GET", f"/streams/{name}/tables", "admin")).json(),
                    "quality": {"epochs": epochs},
                }
            out.append(res)
    return out


def _losses(res: dict[str, Any], arm: str) -> dict[int, float]:
    return {
        e["epoch"]: e["log_loss"]
        for e in res[arm]["quality"]["epochs"]
        if e["log_loss"] is not None
    }


def _picked(res: dict[str, Any], arm: str) -> list[dict[str, Any]]:
    return [t for t in res[arm]["tables"]["tables"] if t["reason"] == "selected"]


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per replay and arm the mean over epochs >= FIRST_COUNTED of log-loss ÷ the same epoch's
    log-loss without selection; the mean over replays and its standard error."""
    ratios: dict[str, list[float]] = {"mi": [], "aic": []}
    for res in results:
        base = _losses(res, "without")
        for arm in ratios:
            got = _losses(res, arm)
            epochs = [e for e in sorted(set(base) & set(got)) if e >= FIRST_COUNTED]
            ratios[arm].append(statistics.fmean(got[e] / base[e] for e in epochs))
    out: dict[str, Any] = {"ratios": ratios}
    for arm, values in ratios.items():
        sem = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
        out[arm] = (statistics.fmean(values), sem)
    return out


def _plot(results: list[dict[str, Any]], summary: dict[str, Any], quick: bool) -> Any:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    labels = {"without": "without selection", "mi": "plug-in MI gain", "aic": "AIC-penalised gain"}
    for (arm, _, _), marker in zip(ARMS, "o^s", strict=True):
        per = [_losses(res, arm) for res in results]
        epochs = sorted(set.intersection(*(set(p) for p in per)))
        mean = [statistics.fmean(p[e] for p in per) for e in epochs]
        left.plot(epochs, mean, marker + "-", label=labels[arm])
    left.axvline(FIRST_COUNTED - 0.5, color="grey", lw=0.8, ls=":")
    left.set_xlabel("epoch")
    left.set_ylabel("log-loss on the epoch's new ratings (mean over replays)")
    left.set_title("Reference model, progressive validation")
    left.legend(fontsize=8)
    for x, arm in enumerate(("mi", "aic")):
        values = summary["ratios"][arm]
        right.plot([x] * len(values), values, "o", alpha=0.5, color=f"C{x + 1}")
        mean, sem = summary[arm]
        right.errorbar([x + 0.15], [mean], yerr=[2 * sem if math.isfinite(sem) else 0], fmt="D",
                       color="k", capsize=4)  # fmt: skip
    right.axhline(1.0, color="grey", lw=0.8)
    right.axhline(0.99, color="C3", lw=0.8, ls="--", label="goal: −1 %")
    right.set_xticks([0, 1], [labels["mi"], labels["aic"]])
    right.set_xlim(-0.5, 1.5)
    right.set_ylabel(f"log-loss ÷ without, epochs ≥ {FIRST_COUNTED}")
    right.set_title(f"per replay, mean ± 2 s.e. ({len(results)} replays)")
    right.legend(fontsize=8)
    fig.suptitle(
        "DP count-table selection at ε_sel = 1 (MovieLens 100K)" + (" quick" if quick else "")
    )
    fig.tight_layout()
    png = plot_path("selection")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="selectivity bench selection", description=__doc__)
    p.add_argument("--quick", action="store_true", help="a third of the data, 8 windows")
    p.add_argument("--replays", type=int, default=5, help="replays of the three streams")
    args = p.parse_args(argv)
    if not 1 <= args.replays <= 50:
        p.error(f"--replays must be in [1, 50], got {args.replays}")
    windows, rows = (8, 33_000) if args.quick else (12, None)
    t0 = time.perf_counter()
    results = asyncio.run(replay(windows, rows, args.replays))
    minutes = (time.perf_counter() - t0) / 60
    summary = summarise(results)
    png = _plot(results, summary, args.quick)
    setup = Table(
        ["setup", ""],
        [
            [
                "streams",
                "per replay three, the same ratings: without selection; with a selection round "
                "at every roll scored by the plug-in MI gain ('mi'); the same by the "
                "AIC-penalised gain ('aic', the default)",
            ],
            ["data", f"{windows} windows of MovieLens 100K in time order, {args.replays} replays"],
            [
                "tables",
                f"laplace ε = {EPSILON} per window, sketch 16384 × 3, hot_windows 2, "
                "max_tables = features + 5 (4 free slots), min_records = 100,000 (default)",
            ],
            ["selection", "ε_sel = 1, one group per round"],
            ["quality", "each epoch's reference model on the newest fifth of its train set"],
            [
                "figure",
                f"per replay: mean over epochs ≥ {FIRST_COUNTED} (the first window a pick is "
                "counted in) of log-loss ÷ the same epoch's without selection",
            ],
            ["runtime", f"{minutes:.1f} min"],
        ],
    )
    ratio_rows = [
        [
            arm,
            f"{summary[arm][0]:.4f}",
            f"{summary[arm][1]:.4f}",
            " ".join(f"{v:.4f}" for v in summary["ratios"][arm]),
        ]
        for arm in ("mi", "aic")
    ]
    ratios = Table(
        ["score", "mean ratio with / without", "s.e.", "per replay"],
        ratio_rows,
        "Log-loss with selection ÷ without, by score",
    )
    groups = Table(
        ["replay", "score", "groups in the order picked (counted from window)"],
        [
            [
                r + 1,
                arm,
                ", ".join(f"{t['name']} ({t['first_epoch']})" for t in _picked(res, arm)),
            ]
            for r, res in enumerate(results)
            for arm in ("mi", "aic")
        ],
        "Selected groups",
    )
    append_section(
        "DP count-table selection (MovieLens)",
        [setup, ratios, groups, Plot("selection", png)],
        command="selectivity bench selection"
        + (" --quick" if args.quick else "")
        + f" --replays {args.replays}",
    )

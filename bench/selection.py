"""DP count-table selection on MovieLens 100K (issues 4 and 18): which groups selection picks, when,
and the reference model's progressive-validation quality with and without them, for each candidate
score.

`selectivity bench selection [--quick] [--replays R] [--arms A,B,…]`: per replay, streams replay the
same ratings in time order through the service (in process, embedded Redis: ``bench.harness``) with
forced rolls: one without selection (the baseline, measured in the same run: its rounds run at
threshold ``NEVER`` and add no table, as free slots need selection on) and one per arm: `mi` / `aic`
run a selection round at every roll of the schedule (the rolls to epochs 2 … 5: `selection_rounds`
defaults to the 4 free slots) with `epsilon_selection = 1` and that `selection_score`, one group per
round (`-k2`, `-k4`: that many groups per round, ε_sel split among them), with the default
`selection_threshold` 0 and `selection_margin` 3 (the public outcome "add no table", as one outcome
of score 0 + 3β per candidate); `aic-fill` without that outcome (every round picks, the rule before
it existed), `aic-m0` with the threshold and no margin (the rule before the margin), `aic-t1e-3`
with the threshold at 1e-3 nats per padded record (3.7 noise scales β = 2Δ/ε_sel here) and the
margin; `fixed:a+b/c+d` picks nothing (``NEVER``) but counts the listed groups as features from the
first window on (each group's values joined into one categorical feature): an upper bound on what
selecting those groups could give, without the two windows between a pick and its first count. After
every roll the follow-ups the worker would run (selection round, reference model) are run. All
streams use the same noise settings; each draws its own noise (CSPRNG), so a replay's ratio carries
the noise of two streams, and the figure is the mean over replays with its standard error. A group
picked at the first round (roll to epoch 2) is counted from window 4 and featurizes from epoch 6
(epoch e's count period ends at window e − 2), so the figure averages epochs ≥ 6; epochs 4-5 (the
earlier figure's start) can differ only by noise."""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from bench import movielens
from bench.harness import InProcess
from bench.report import Plot, Table, plot_path, pyplot, write_section
from service.core.streamconfig import PrivacyIn

EPSILON = 5.0  # per-window table budget of every stream (selection's effect is the point here)
# The threshold of the arms that must never pick: the config's largest, 64 nats per record,
# above any score (at most log 2 here) by far more than the noise scale, so every round adds no
# table. A stream must have selection on to hold free slots (the service refuses max_tables above
# features + 1 otherwise), and every arm keeps the same slots, so the same noise per table.
NEVER = 64.0
# arm name -> (epsilon_selection, selection_score, groups_per_round, selection_threshold);
# "without" is the baseline
ARMS: dict[str, tuple[float, str, int, float | None]] = {
    "without": (1.0, "aic", 1, NEVER),
    "mi": (1.0, "mi", 1, 0.0),
    "aic": (1.0, "aic", 1, 0.0),
    "aic-fill": (1.0, "aic", 1, None),  # no "add no table" outcome: every round picks
    "aic-t1e-3": (1.0, "aic", 1, 1e-3),
    "aic-m0": (1.0, "aic", 1, 0.0),  # the threshold without the margin (the rule before it)
    "aic-k4": (1.0, "aic", 4, 0.0),  # every free slot offered at the first round, ε_sel/4 each
    "mi-k2": (1.0, "mi", 2, 0.0),
    "mi-k4": (1.0, "mi", 4, 0.0),
}
DEFAULT_ARMS = ("mi", "aic")
# arm -> privacy.selection_margin where it is not the stream default
DEFAULT_MARGIN = PrivacyIn.model_fields["selection_margin"].default
MARGINS = {"aic-m0": 0.0}
FREE_SLOTS = 4  # max_tables = features + 1 (the prior) + 4, the same in every arm
FIXED = "fixed:"  # arm "fixed:a+b/c+d": no selection, the pairs counted as features from window 1


def _arm(arm: str) -> tuple[float, str, int, float | None, tuple[tuple[str, ...], ...]]:
    """(ε_sel, score, groups per round, threshold, groups counted from the start) of an arm."""
    if arm.startswith(FIXED):
        groups = tuple(tuple(g.split("+")) for g in arm[len(FIXED) :].split("/"))
        if (
            not 1 <= len(groups) <= FREE_SLOTS
            or len(set(groups)) != len(groups)
            or any(len(set(g)) != len(g) or len(g) < 2 for g in groups)
            or any(set(g) - set(movielens.FEATURES) for g in groups)
        ):
            raise ValueError(
                f"{arm!r}: 1 to {FREE_SLOTS} distinct groups of two or more MovieLens features, "
                "features joined by '+', groups by '/'"
            )
        return 1.0, "aic", 1, NEVER, groups
    if arm not in ARMS or arm == "without":
        raise ValueError(f"{arm!r}: not an arm of {sorted(set(ARMS) - {'without'})} or 'fixed:…'")
    return (*ARMS[arm], ())


def _with_groups(
    obs: list[dict[str, Any]], groups: tuple[tuple[str, ...], ...]
) -> list[dict[str, Any]]:
    """Observations with one more categorical feature per group, named ``a__b``: its members'
    values joined by ``|`` (age by its bucket, as its table counts it)."""
    if not groups:
        return obs
    out = []
    for o in obs:
        f = dict(o["features"])
        key = {**f, "age": bisect.bisect_right(movielens.AGE_BUCKETS, f["age"])}
        for g in groups:
            f["__".join(g)] = "|".join(str(key[m]) for m in g)
        out.append({**o, "features": f})
    return out


FIRST_COUNTED = 4  # a group picked at the first round (roll to epoch 2) is counted from window 4
# ... and featurizes from epoch 6 on: epoch e's count period ends at window e − hot_windows
FIRST_USED = FIRST_COUNTED + 2


async def replay(
    windows: int,
    rows: int | None,
    replays: int = 1,
    arms: tuple[str, ...] = DEFAULT_ARMS,
    save: Path | None = None,
) -> list[dict[str, Any]]:
    """``replays`` × ("without", *arms) (names in ``ARMS`` or ``fixed:…``); per replay and arm
    its tables and quality, also written to ``save`` (JSON) after every replay."""
    df = movielens.load()
    if rows:
        df = df.iloc[:rows]
    out: list[dict[str, Any]] = []
    async with InProcess(http_timeout=600) as svc:
        for r in range(replays):
            res: dict[str, Any] = {}
            for a, arm in enumerate(("without", *arms)):
                eps_sel, score, per_round, threshold, fixed = (
                    ARMS[arm] + ((),) if arm == "without" else _arm(arm)
                )
                name = f"arm{a}-{r}"
                body = {
                    "name": name,
                    "features": movielens.stream_features()
                    + [{"name": "__".join(g), "kind": "categorical"} for g in fixed],
                    "labels": ["0", "1"],
                    "hot_windows": 2,
                    "retention_windows": 50,
                    "window_seconds": 366 * 86400,
                    "sketch": {"width": 16384, "depth": 3},
                    "max_tables": len(movielens.FEATURES) + 1 + FREE_SLOTS,
                    "privacy": {
                        "mechanism": "laplace",
                        "epsilon": EPSILON,
                        "epsilon_selection": eps_sel,
                        "groups_per_round": per_round,
                        "selection_score": score,
                        "selection_threshold": threshold,
                        "selection_margin": MARGINS.get(arm, DEFAULT_MARGIN),
                    },
                }
                await svc.call("POST", "/streams", "admin", 201, json=body)
                size = len(df) // windows
                t0 = time.perf_counter()
                epochs: list[dict] = []  # the quality of each epoch's model, read while it lives
                for w in range(windows):
                    obs = _with_groups(
                        movielens.observations(df.iloc[w * size : (w + 1) * size]), fixed
                    )
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
                if threshold == NEVER and _picked(res, arm):
                    raise RuntimeError(f"{arm}: a round picked at threshold {NEVER}")
            out.append(res)
            if save is not None:
                save.write_text(json.dumps(out))
    return out


def _losses(res: dict[str, Any], arm: str) -> dict[int, float]:
    return {
        e["epoch"]: e["log_loss"]
        for e in res[arm]["quality"]["epochs"]
        if e["log_loss"] is not None
    }


def _picked(res: dict[str, Any], arm: str) -> list[dict[str, Any]]:
    return [t for t in res[arm]["tables"]["tables"] if t["reason"] == "selected"]


def _ratio_at(res: dict[str, Any], arm: str, epoch: int) -> float:
    return _losses(res, arm)[epoch] / _losses(res, "without")[epoch]


def _ratio(base: dict[int, float], got: dict[int, float], first: int) -> float:
    return statistics.fmean(got[e] / base[e] for e in sorted(set(base) & set(got)) if e >= first)


def _mean_sem(values: list[float]) -> tuple[float, float]:
    sem = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    return statistics.fmean(values), sem


def summarise(results: list[dict[str, Any]], arms: tuple[str, ...]) -> dict[str, Any]:
    """Per replay and arm the mean over epochs >= FIRST_USED (the first whose features include
    a group of the first round) of log-loss ÷ the same epoch's log-loss without selection; the
    same over epochs >= FIRST_COUNTED (the earlier figure, two epochs diluted by design); the
    mean over replays and its standard error, and the paired difference of each arm against
    the first one."""
    out: dict[str, Any] = {"ratios": {}, "ratios_counted": {}}
    for arm in arms:
        used = [_ratio(_losses(r, "without"), _losses(r, arm), FIRST_USED) for r in results]
        counted = [_ratio(_losses(r, "without"), _losses(r, arm), FIRST_COUNTED) for r in results]
        out["ratios"][arm], out["ratios_counted"][arm] = used, counted
        out[arm], out[arm + "@counted"] = _mean_sem(used), _mean_sem(counted)
    return out


def _short(arm: str) -> str:
    """A plot label: a fixed arm by its first group and how many there are."""
    if not arm.startswith(FIXED):
        return arm
    groups = arm[len(FIXED) :].split("/")
    return f"fixed {groups[0]}" + (f" +{len(groups) - 1}" if len(groups) > 1 else "")


def _plot(
    results: list[dict[str, Any]], summary: dict[str, Any], quick: bool, directory: Path | None
) -> Any:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 5), gridspec_kw={"width_ratios": [3, 2]})
    arms = tuple(summary["ratios"])
    for i, arm in enumerate(("without", *arms)):
        per = [_losses(res, arm) for res in results]
        epochs = sorted(set.intersection(*(set(p) for p in per)))
        mean = [statistics.fmean(p[e] for p in per) for e in epochs]
        left.plot(epochs, mean, "o^sDvP*"[i % 7] + "-", label=_short(arm))
    left.axvline(FIRST_USED - 0.5, color="grey", lw=0.8, ls=":")
    left.set_xlabel("epoch")
    left.set_ylabel("log-loss on the epoch's new ratings (mean over replays)")
    left.set_title("Reference model, progressive validation")
    left.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    for x, arm in enumerate(arms):
        values = summary["ratios"][arm]
        right.plot([x] * len(values), values, "o", alpha=0.5, color=f"C{x + 1}")
        mean, sem = summary[arm]
        right.errorbar([x + 0.15], [mean], yerr=[2 * sem if math.isfinite(sem) else 0], fmt="D",
                       color="k", capsize=4)  # fmt: skip
    right.axhline(1.0, color="grey", lw=0.8)
    right.axhline(0.99, color="C3", lw=0.8, ls="--", label="goal: −1 %")
    right.set_xticks(list(range(len(arms))), [_short(a) for a in arms], rotation=20, fontsize=7)
    right.set_xlim(-0.5, len(arms) - 0.5)
    right.set_ylabel(f"log-loss ÷ without, epochs ≥ {FIRST_USED}")
    right.set_title(f"per replay, mean ± 2 s.e. ({len(results)} replays)")
    right.legend(fontsize=8)
    fig.suptitle(
        "DP count-table selection at ε_sel = 1 (MovieLens 100K)" + (" quick" if quick else "")
    )
    fig.tight_layout()
    png = plot_path("selection") if directory is None else plot_path("selection", directory)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="selectivity bench selection", description=__doc__)
    p.add_argument("--quick", action="store_true", help="a third of the data, 8 windows")
    p.add_argument("--replays", type=int, default=5, help="replays of the streams")
    p.add_argument(
        "--arms",
        default=",".join(DEFAULT_ARMS),
        help="comma-separated arms besides 'without', from "
        + ", ".join(a for a in ARMS if a != "without")
        + " (named by score; '-kN': N groups per round)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write the section here instead of BENCHMARKS.md, the raw results (.json) and the "
        "plot beside it",
    )
    p.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="summarise the raw results of an earlier --out run instead of running",
    )
    args = p.parse_args(argv)
    if not 1 <= args.replays <= 50:
        p.error(f"--replays must be in [1, 50], got {args.replays}")
    arms = tuple(a for a in args.arms.split(",") if a)
    for arm in arms:
        try:
            _arm(arm)
        except ValueError as e:
            p.error(f"--arms: {e}")
    if not arms or len(set(arms)) != len(arms):
        p.error(
            f"--arms must name distinct arms of {sorted(set(ARMS) - {'without'})}: {args.arms!r}"
        )
    windows, rows = (8, 33_000) if args.quick else (12, None)
    t0 = time.perf_counter()
    if args.from_json is not None:
        results = json.loads(args.from_json.read_text())
        if len(results) != args.replays or any(set(r) != {"without", *arms} for r in results):
            p.error(f"{args.from_json} does not hold {args.replays} replays of {arms}")
    else:
        save = None if args.out is None else args.out.with_suffix(".json")
        results = asyncio.run(replay(windows, rows, args.replays, arms, save))
    minutes = (time.perf_counter() - t0) / 60
    summary = summarise(results, arms)
    png = _plot(results, summary, args.quick, None if args.out is None else args.out.parent)
    setup = Table(
        ["setup", ""],
        [
            [
                "streams",
                "per replay, the same ratings: 'without' selection (its rounds at threshold "
                f"{NEVER:g}, which no score reaches: no pick), and per arm a selection round "
                "at every roll: "
                + "; ".join(
                    f"'{a}' score {ARMS[a][1]}, {ARMS[a][2]} group(s) per round, threshold "
                    f"{'none (every round picks)' if ARMS[a][3] is None else ARMS[a][3]}"
                    + ("" if ARMS[a][3] is None else f", margin {MARGINS.get(a, DEFAULT_MARGIN)}")
                    if a in ARMS
                    else f"'{a}' no selection, the groups counted as features from window 1"
                    for a in arms
                ),
            ],
            ["data", f"{windows} windows of MovieLens 100K in time order, {args.replays} replays"],
            [
                "tables",
                f"laplace ε = {EPSILON} per window, sketch 16384 × 3, hot_windows 2, "
                "max_tables = features + 5 (4 free slots), min_records = 100,000 (default)",
            ],
            [
                "selection",
                "ε_sel = 1 per round (split among the round's picks), rounds at the rolls to "
                "epochs 2 … 5 (selection_rounds = the 4 free slots)",
            ],
            ["quality", "each epoch's reference model on the newest fifth of its train set"],
            [
                "figure",
                f"per replay: mean over epochs ≥ {FIRST_USED} (the first whose features include a "
                "group picked at the first round) of log-loss ÷ the same epoch's without "
                f"selection; 'from {FIRST_COUNTED}': the same from the window the group is first "
                "counted in (the earlier figure; epochs 4-5 cannot differ but by noise)",
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
            f"{summary[arm + '@counted'][0]:.4f} ± {summary[arm + '@counted'][1]:.4f}",
        ]
        for arm in arms
    ]
    ratios = Table(
        [
            "arm",
            f"mean ratio with / without, epochs ≥ {FIRST_USED}",
            "s.e.",
            "per replay",
            f"from epoch {FIRST_COUNTED}, ± s.e.",
        ],
        ratio_rows,
        "Log-loss with selection ÷ without, by arm",
    )
    groups = Table(
        ["replay", "arm", "groups in the order picked (counted from window)"],
        [
            [
                r + 1,
                arm,
                ", ".join(f"{t['name']} ({t['first_epoch']})" for t in _picked(res, arm))
                or "(none)",
            ]
            for r, res in enumerate(results)
            for arm in arms
        ],
        "Selected groups",
    )
    epochs = sorted(set.intersection(*(set(_losses(r, "without")) for r in results)))
    per_epoch = Table(
        ["epoch", *(f"{a} ÷ without" for a in arms)],
        [
            [
                e,
                *(f"{statistics.fmean(_ratio_at(r, a, e) for r in results):.4f}" for a in arms),
            ]
            for e in epochs
        ],
        "Per epoch, mean over replays",
    )
    command = (
        "selectivity bench selection"
        + (" --quick" if args.quick else "")
        + f" --replays {args.replays}"
        + ("" if arms == DEFAULT_ARMS else f" --arms {','.join(arms)}")
    )
    parts: list[Table | Plot] = [setup, ratios, per_epoch, groups, Plot("selection", png)]
    title = "DP count-table selection (MovieLens)"
    if args.out is None:
        write_section(title, parts, command=command)
    else:  # a trial run: the section and the raw results beside it, BENCHMARKS.md untouched
        write_section(title, parts, command=command, path=args.out)

"""DP count-table selection on the MovieLens-calibrated simulator (issue 18, part 1): does it
reach the 1 % goal where pair tables are denser?

`python -m bench.accuracy.selection_sim [--scales 1,10] [--replays 4] [--out F]`: per scale one
simulated stream (``simulator.simulate``, grown by more users: copy j of a user has the real
user's attributes and label effect, so a group of user attributes pools k copies while each
copy's ``user_id`` stays as sparse as at ×1). Per replay:

- **selection**: the service's rounds (``service.core.selection.select_round``: the CSPRNG, the
  "aic" score, ε_sel = 1, one group per round, ``min_records`` 100,000) on the schedule of the
  service bench (``bench.selection``): the stream in 12 windows, rounds at the rolls to epochs
  2 … 5 (4 free slots), each reading windows e − 2 … e − 1 (``hot_windows`` 2), each seeing the
  groups picked before it as tables; arm ``aic`` with the default threshold 0 (the outcome "add
  no table"), ``aic-fill`` without it (every round picks);
- **the model**: the picked groups counted from the first window as features (their members'
  values joined, as ``bench.selection``'s ``fixed:`` arms; the two windows between a pick and
  its first count are left out), on ``service.core`` (``core_arm``: the service's tables,
  hashing, laplace noise at ε = 1 per window, featurization; ``max_tables`` = features + 5 in
  every arm, so every table has the same noise), LightGBM trained on the 10 % hot window before
  each cut (50, 70, 90 %) and tested on the next 1 %; ``without``: no group;
  ``fixed:age+occupation``: that pair, no selection;
- **the figure**: per replay and arm, the mean over cuts of log-loss ÷ ``without``'s at the same
  cut (each arm draws its own table noise), then the mean over replays ± its standard error.

×100 (10M events as a frame of strings, about 10 GB) is beyond this machine; ``sim_stream``
counts it in chunks but only for single-feature tables."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench import lgbm, movielens
from bench.accuracy import simulator
from bench.accuracy.plan import Privacy, Sketching, make_plan
from bench.report import Clock, Table, append_section
from service.core.selection import select_round

SEED = 1800  # the simulated stream's (+ scale)
FREE_SLOTS = 4
WINDOWS = 12  # the service bench's windows: rounds at epochs 2 … 5 read windows e − 2 … e − 1
ROUNDS = range(2, 2 + FREE_SLOTS)
CUTS = (0.5, 0.7, 0.9)
SHARE = 0.1  # the hot window the model trains on (10 windows: 9 noise draws per table and run)
EPSILON = 1.0  # laplace, per window, the tables'
EPSILON_SELECTION = 1.0
TRAINING = lgbm.Training(seeds=(7,))
ARMS: dict[str, float | None] = {"aic": 0.0, "aic-fill": None}  # arm -> selection_threshold
FIXED = (("age", "occupation"),)
Group = tuple[str, ...]


def group_name(group: Group) -> str:
    return "__".join(group)


@dataclass(frozen=True)
class GroupSketching(Sketching):
    """``Sketching`` with groups counted as one categorical feature each and ``max_tables``
    fixed at features + 1 + ``FREE_SLOTS`` whatever the number of groups (the same noise per
    table in every arm, as a stream with free slots has)."""

    groups: tuple[Group, ...] = ()

    @property
    def max_tables(self) -> int:
        return len(movielens.FEATURES) + 1 + FREE_SLOTS

    def stream_features(self) -> list[dict[str, Any]]:
        return movielens.stream_features() + [
            {"name": group_name(g), "kind": "categorical"} for g in self.groups
        ]


def _key_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Every feature as the value its table counts (age by its bucket), as strings."""
    out = {f: df[f].astype(str) for f in movielens.FEATURES if f != "age"}
    out["age"] = pd.Series(np.searchsorted(movielens.AGE_BUCKETS, df["age"], side="right"))
    out["age"] = out["age"].astype(str).set_axis(df.index)
    return pd.DataFrame(out)


def _codes(keys: pd.DataFrame) -> dict[str, np.ndarray]:
    return {f: pd.factorize(keys[f])[0].astype(np.int64) for f in movielens.FEATURES}


def rounds(
    codes: dict[str, np.ndarray], labels: np.ndarray, threshold: float | None
) -> list[Group]:
    """The groups the service's rounds pick on the bench schedule (module docstring)."""
    size = len(labels) // WINDOWS
    tables: list[Group] = [(f,) for f in movielens.FEATURES]
    picked: list[Group] = []
    for epoch in ROUNDS:
        rows = slice((max(epoch - 2, 1) - 1) * size, (epoch - 1) * size)
        got = select_round(
            columns={f: c[rows] for f, c in codes.items()},
            labels=labels[rows],
            n_labels=2,
            tables=tables,
            max_tables=len(movielens.FEATURES) + 1 + FREE_SLOTS,
            groups_per_round=1,
            epsilon=EPSILON_SELECTION,
            min_records=100_000,
            score="aic",
            threshold=threshold,
        )
        tables += [c.group for c in got]
        picked += [c.group for c in got]
    return picked


class Streams:
    """The simulated frame and one core arm per set of groups (memoised: encoding and counting
    are the same for every replay; the noise is drawn by every run)."""

    def __init__(self, df: pd.DataFrame) -> None:
        self.df = df
        self.keys = _key_frame(df)
        self.plan = make_plan(len(df), CUTS)
        self._arms: dict[tuple[Group, ...], simulator.ColumnArm] = {}

    def log_losses(self, groups: tuple[Group, ...]) -> list[float]:
        key = tuple(sorted(groups))
        if key not in self._arms:
            frame = self.df.copy()
            for g in key:
                frame[group_name(g)] = self.keys[list(g)].agg("|".join, axis=1).to_numpy()
            sketching = GroupSketching(
                features=(*movielens.FEATURES, *(group_name(g) for g in key)), groups=key
            )
            self._arms[key] = simulator.ColumnArm(frame, sketching, TRAINING)
        evals = self._arms[key].run(
            self.plan, SHARE, Privacy("laplace", EPSILON), kinds=("median",)
        )
        return [e.log_loss for e in evals]


def measure(
    cal: simulator.Calibration,
    scale: int,
    replays: int,
    say: Clock,
    save: Callable[[list[dict[str, Any]]], None],
) -> list[dict[str, Any]]:
    df = simulator.simulate(cal, scale, SEED + scale)
    streams = Streams(df)
    codes = _codes(streams.keys)
    labels = movielens.labels01(df).astype(np.int64)
    say(f"x{scale}: {len(df):,} events, hot periods of {2 * (len(df) // WINDOWS):,} rows")
    out = []
    for r in range(replays):
        res: dict[str, Any] = {"scale": scale, "picks": {}, "losses": {}}
        res["losses"]["without"] = streams.log_losses(())
        for arm, threshold in ARMS.items():
            res["picks"][arm] = [list(g) for g in rounds(codes, labels, threshold)]
            groups = tuple(tuple(g) for g in res["picks"][arm])
            res["losses"][arm] = streams.log_losses(groups)
        res["losses"]["fixed"] = streams.log_losses(FIXED)
        out.append(res)
        save(out)
        say(
            f"x{scale} replay {r + 1}/{replays}: "
            + ", ".join(f"{a} {_ratio(res, a):.4f}" for a in (*ARMS, "fixed"))
            + f"; picks {res['picks']}"
        )
    return out


def _ratio(res: dict[str, Any], arm: str) -> float:
    base = res["losses"]["without"]
    return statistics.fmean(x / b for x, b in zip(res["losses"][arm], base, strict=True))


def summary(results: list[dict[str, Any]]) -> dict[tuple[int, str], tuple[float, float]]:
    out = {}
    for scale in sorted({r["scale"] for r in results}):
        rows = [r for r in results if r["scale"] == scale]
        for arm in (*ARMS, "fixed"):
            values = [_ratio(r, arm) for r in rows]
            sem = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
            out[(scale, arm)] = (statistics.fmean(values), sem)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.accuracy.selection_sim", description=__doc__)
    p.add_argument("--scales", default="1,10", help="comma-separated ×k of the stream")
    p.add_argument("--replays", type=int, default=4, help="selection rounds and noise draws")
    p.add_argument("--out", type=Path, help="write the section here instead of BENCHMARKS.md")
    p.add_argument("--from-json", type=Path, help="report the raw results of an earlier run")
    args = p.parse_args(argv)
    scales = [int(s) for s in args.scales.split(",")]
    if any(not 1 <= s <= 30 for s in scales) or not 1 <= args.replays <= 20:
        p.error("scales must be in [1, 30] (a frame in memory) and --replays in [1, 20]")
    say = Clock()
    t0 = time.perf_counter()
    if args.from_json:
        results = json.loads(args.from_json.read_text())
    else:
        cal = simulator.fit(movielens.load())
        results = []

        def save(partial: list[dict[str, Any]]) -> None:  # after every replay
            if args.out:
                args.out.with_suffix(".json").write_text(json.dumps(results + partial))

        for k in scales:
            results += measure(cal, k, args.replays, say, save)
    minutes = (time.perf_counter() - t0) / 60
    figures = summary(results)
    table = Table(
        ["scale", *(f"{a} ÷ without" for a in ARMS), "fixed age+occupation ÷ without"],
        [
            [
                f"×{s}",
                *(f"{figures[(s, a)][0]:.4f} ± {figures[(s, a)][1]:.4f}" for a in (*ARMS, "fixed")),
            ]
            for s in sorted({r["scale"] for r in results})
        ],  # fmt: skip
        "Log-loss with the groups ÷ without, mean over cuts, then over replays ± s.e.",
    )
    picks = Table(
        ["scale", "replay", *ARMS],
        [
            [
                f"×{r['scale']}",
                i + 1,
                *(", ".join("+".join(g) for g in r["picks"][a]) or "(none)" for a in ARMS),
            ]
            for i, r in enumerate(results)
        ],  # fmt: skip
        "Groups picked (in order)",
    )
    setup = Table(
        ["setup", ""],
        [
            [
                "stream",
                "simulator.simulate, grown by users; "
                + ", ".join(
                    f"×{s}: {100_000 * s:,} events" for s in sorted({r["scale"] for r in results})
                ),
            ],
            [
                "selection",
                f"aic, ε_sel = {EPSILON_SELECTION}, 1 group per round at epochs 2 … 5 "
                "of 12 windows (hot_windows 2), min_records 100,000",
            ],
            [
                "model",
                f"core arm, laplace ε = {EPSILON} per window, sketch 16384 × 3, "
                f"max_tables 12 in every arm; LightGBM on the {SHARE:.0%} hot window before each "
                f"cut {', '.join(map(str, CUTS))}, tested on the next 1 %; groups counted "
                "from window 1",
            ],
            ["runtime", f"{minutes:.1f} min"],
        ],  # fmt: skip
    )
    command = f"python -m bench.accuracy.selection_sim --scales {args.scales} --replays "
    command += str(len([r for r in results if r["scale"] == results[0]["scale"]]))
    title = "DP count-table selection on the simulator"
    if args.out is None:
        append_section(title, [setup, table, picks], command=command)
    else:
        append_section(title, [setup, table, picks], command=command, path=args.out)


if __name__ == "__main__":
    main()

"""DP count-table selection on the MovieLens-calibrated simulator (issue 18, part 1): does it
reach the 1 % goal where pair tables are denser?

`python -m bench.accuracy.selection_sim [--scales 1,10] [--replays 4] [--pair-effects]
[--pair-gain G] [--out F]`: per scale one simulated stream (``simulator.simulate``, grown by
more users: copy j of a user has the real user's attributes and label effect, so a group of
user attributes pools k copies while each copy's ``user_id`` stays as sparse as at ×1). Per
replay:

- **selection**: the service's rounds (``service.core.dp.selection.select_round``: the CSPRNG, the
  "aic" score, ε_sel = 1, one group per round, ``min_records`` 100,000) on the schedule of the
  service bench (``bench.selection``): the stream in 12 windows, rounds at the rolls to epochs
  2 … 5 (4 free slots), each reading windows e − 2 … e − 1 (``hot_windows`` 2), each seeing the
  groups picked before it as tables; arm ``aic`` with the service's defaults (threshold 0 and
  margin 3 noise scales for the outcome "add no table"; the MovieLens streams' ``of``
  declarations, ``bench.movielens.OF``, so no group of one user's attributes is offered),
  ``aic-fill`` without "add no table" and without ``of`` (every round picks, the rule of the
  earlier figures);
- **the model**: the picked groups counted from the first window as features (their members'
  values joined, as ``bench.selection``'s ``fixed:`` arms; the two windows between a pick and
  its first count are left out), on ``service.core`` (``core_arm``: the service's tables,
  hashing, laplace noise at ε = 1 per window, featurization; ``max_tables`` = features + 5 in
  every arm, so every table has the same noise), LightGBM trained on the 10 % hot window before
  each cut (50, 70, 90 %) and tested on the next 1 %; ``without``: no group;
  ``fixed:age+occupation``: that pair, no selection;
- **with ``--pair-effects``** the simulator's labels also carry MovieLens's genre × user
  attribute interactions (``bench.accuracy.pair_effects``: empirical-Bayes shrunk residual
  log-odds per cell, multiplied by ``--pair-gain``), so that useful groups exist; the arms are
  then ``aic`` (the defaults, as above), ``aic-m0-noof`` (threshold 0, no margin, no ``of``:
  the rule before them) and ``fixed:`` the planted pairs
  (the oracle, counted from window 1); ``bound``: the Bayes log-loss with the pair effects ÷
  without them on the same test rows (what knowing the planted effects exactly would give; a
  group can also help otherwise, e.g. by pooling a user's copies);
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench import lgbm, movielens
from bench.accuracy import pair_effects, simulator
from bench.accuracy.plan import Plan, Privacy, Sketching, make_plan
from bench.report import Clock, Table, write_section
from service.core.dp.selection import select_round
from service.core.streamconfig import PrivacyIn

SEED = 1800  # the simulated stream's (+ scale)
FREE_SLOTS = 4
WINDOWS = 12  # the service bench's windows: rounds at epochs 2 … 5 read windows e − 2 … e − 1
ROUNDS = range(2, 2 + FREE_SLOTS)
CUTS = (0.5, 0.7, 0.9)
SHARE = 0.1  # the hot window the model trains on (10 windows: 9 noise draws per table and run)
EPSILON = 1.0  # laplace, per window, the tables'
EPSILON_SELECTION = 1.0
TRAINING = lgbm.Training(seeds=(7,))


@dataclass(frozen=True)
class Rule:
    """An arm's selection rule: the stream's ``selection_threshold`` and ``selection_margin``,
    and whether the stream declares what determines what (``bench.movielens.OF``)."""

    threshold: float | None
    margin: float = PrivacyIn.model_fields["selection_margin"].default
    of: bool = True


ARMS = {"aic": Rule(0.0), "aic-fill": Rule(None, 0.0, of=False)}
FIXED = (("age", "occupation"),)
PAIR_ARMS = {  # with --pair-effects
    "aic": Rule(0.0),  # the service's defaults
    "aic-m0-noof": Rule(0.0, 0.0, of=False),  # the rule before the margin and "of"
}
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


def rounds(codes: dict[str, np.ndarray], labels: np.ndarray, rule: Rule) -> list[Group]:
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
            threshold=rule.threshold,
            margin=rule.margin,
            attributes=movielens.OF if rule.of else None,
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


def planted(cal: simulator.Calibration) -> tuple[Group, ...]:
    """The groups whose tables count the calibration's pair effects (those with ``τ̂ > 0``)."""
    return tuple(tuple(sorted((p.movie_column, p.user_column))) for p in cal.pairs if p.tau > 0)


def bound(cal: simulator.Calibration, df: pd.DataFrame, plan: Plan) -> float:
    """The Bayes log-loss with ``cal``'s pair effects ÷ without them on the test rows, mean
    over cuts (1 without pair effects)."""
    if not cal.pairs:
        return 1.0
    base = replace(cal, pairs=())
    user_index = pd.Index(cal.user_table["user_id"])
    movie_index = pd.Index(cal.movie_table["movie_id"])
    out = []
    for cut in plan.cuts:
        test = df.iloc[plan.test(cut)]
        u = user_index.get_indexer(test["user_id"].str.split("~").str[0])
        m = movie_index.get_indexer(test["movie_id"])
        y = movielens.labels01(test)
        assert (u >= 0).all() and (m >= 0).all()
        assert np.allclose(cal.probability(u, m), test["p_true"].to_numpy())
        out.append(
            lgbm.log_loss(y, cal.probability(u, m)) / lgbm.log_loss(y, base.probability(u, m))
        )
    return statistics.fmean(out)


def measure(
    cal: simulator.Calibration,
    scale: int,
    replays: int,
    say: Clock,
    save: Callable[[list[dict[str, Any]]], None],
    gain: float | None = None,
) -> list[dict[str, Any]]:
    """``replays`` replays at ×``scale`` (module docstring); ``gain``: the pair effects' (for
    the report)."""
    arms, fixed = (PAIR_ARMS, planted(cal)) if cal.pairs else (ARMS, FIXED)
    df = simulator.simulate(cal, scale, SEED + scale)
    streams = Streams(df)
    codes = _codes(streams.keys)
    labels = movielens.labels01(df).astype(np.int64)
    say(f"x{scale}: {len(df):,} events, hot periods of {2 * (len(df) // WINDOWS):,} rows")
    out = []
    for r in range(replays):
        res: dict[str, Any] = {"scale": scale, "picks": {}, "losses": {}}
        res["arms"] = list(arms)
        res["fixed"] = [list(g) for g in fixed]
        res["bound"] = bound(cal, df, streams.plan)
        res["pairs"] = pair_effects.summary(cal)
        res["gain"] = gain if cal.pairs else None
        res["losses"]["without"] = streams.log_losses(())
        for arm, rule in arms.items():
            res["picks"][arm] = [list(g) for g in rounds(codes, labels, rule)]
            groups = tuple(tuple(g) for g in res["picks"][arm])
            res["losses"][arm] = streams.log_losses(groups)
        res["losses"]["fixed"] = streams.log_losses(fixed)
        out.append(res)
        save(out)
        say(
            f"x{scale} replay {r + 1}/{replays}: "
            + ", ".join(f"{a} {_ratio(res, a):.4f}" for a in (*arms, "fixed"))
            + f"; bound {res['bound']:.4f}; picks {res['picks']}"
        )
    return out


def _ratio(res: dict[str, Any], arm: str) -> float:
    base = res["losses"]["without"]
    return statistics.fmean(x / b for x, b in zip(res["losses"][arm], base, strict=True))


def _arms(res: dict[str, Any]) -> list[str]:
    return res.get("arms", list(ARMS))  # results before --pair-effects have no "arms"


def summary(results: list[dict[str, Any]]) -> dict[tuple[int, str], tuple[float, float]]:
    """Per scale and arm (and ``bound``): the mean over replays ± its standard error."""
    out = {}
    for scale in sorted({r["scale"] for r in results}):
        rows = [r for r in results if r["scale"] == scale]
        for arm in (*_arms(rows[0]), "fixed", "bound"):
            values = [r.get("bound", 1.0) if arm == "bound" else _ratio(r, arm) for r in rows]
            sem = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
            out[(scale, arm)] = (statistics.fmean(values), sem)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.accuracy.selection_sim", description=__doc__)
    p.add_argument("--scales", default="1,10", help="comma-separated ×k of the stream")
    p.add_argument("--replays", type=int, default=4, help="selection rounds and noise draws")
    p.add_argument(
        "--pair-effects",
        action="store_true",
        help="labels with MovieLens's genre × user attribute effects (bench.accuracy.pair_effects)",
    )
    p.add_argument("--pair-gain", type=float, default=1.0, help="multiply the pair effects")
    p.add_argument("--out", type=Path, help="write the section here instead of BENCHMARKS.md")
    p.add_argument("--from-json", type=Path, help="report the raw results of an earlier run")
    args = p.parse_args(argv)
    scales = [int(s) for s in args.scales.split(",")]
    if any(not 1 <= s <= 30 for s in scales) or not 1 <= args.replays <= 20:
        p.error("scales must be in [1, 30] (a frame in memory) and --replays in [1, 20]")
    if not 0 <= args.pair_gain <= 10 or (args.pair_gain != 1 and not args.pair_effects):
        p.error("--pair-gain must be in [0, 10] and needs --pair-effects")
    say = Clock()
    t0 = time.perf_counter()
    if args.from_json:
        results = json.loads(args.from_json.read_text())
    else:
        df = movielens.load()
        cal = simulator.fit(df)
        if args.pair_effects:
            cal = pair_effects.add(cal, pair_effects.estimate(df, cal), args.pair_gain)
            say(f"pair effects (gain {args.pair_gain}): {pair_effects.summary(cal)}")
        results = []

        def save(partial: list[dict[str, Any]]) -> None:  # after every replay
            if args.out:
                args.out.with_suffix(".json").write_text(json.dumps(results + partial))

        for k in scales:
            results += measure(cal, k, args.replays, say, save, args.pair_gain)
    minutes = (time.perf_counter() - t0) / 60
    append_report(results, minutes, args.scales, args.out)


def append_report(
    results: list[dict[str, Any]], minutes: float, scales: str, out: Path | None
) -> None:
    figures = summary(results)
    arms = _arms(results[0])
    fixed = " + ".join("+".join(g) for g in results[0].get("fixed", FIXED))
    pairs = results[0].get("pairs") or []
    gain = results[0].get("gain")
    table = Table(
        [
            "scale",
            *(f"{a} ÷ without" for a in arms),
            f"fixed {fixed} ÷ without",
            *(["bound (Bayes)"] if pairs else []),
        ],
        [
            [
                f"×{s}",
                *(
                    f"{figures[(s, a)][0]:.4f} ± {figures[(s, a)][1]:.4f}"
                    for a in (*arms, "fixed", *(["bound"] if pairs else []))
                ),
            ]
            for s in sorted({r["scale"] for r in results})
        ],  # fmt: skip
        "Log-loss with the groups ÷ without, mean over cuts, then over replays ± s.e.",
    )
    picks = Table(
        ["scale", "replay", *arms],
        [
            [
                f"×{r['scale']}",
                1 + sum(q["scale"] == r["scale"] for q in results[:i]),  # replay within scale
                *(", ".join("+".join(g) for g in r["picks"][a]) or "(none)" for a in arms),
            ]
            for i, r in enumerate(results)
        ],  # fmt: skip
        "Groups picked (in order)",
    )
    planted = "; ".join(
        f"{q['pair']}: τ̂ = {q['tau']:.3f}, planted sd {q['sd_planted']:.3f} ({q['cells']} cells)"
        for q in pairs
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
            *(
                [
                    [
                        "pair effects",
                        f"pair_effects.estimate × gain {gain} (log-odds, ×gain): {planted}; "
                        "bound = Bayes log-loss with them ÷ without on the test rows",
                    ]
                ]
                if pairs
                else []
            ),
            [
                "selection",
                f"aic, ε_sel = {EPSILON_SELECTION}, 1 group per round at epochs 2 … 5 "
                "of 12 windows (hot_windows 2), min_records 100,000"
                + "; "
                + "; ".join(
                    f"{a}: threshold {r.threshold}, margin {r.margin:g} noise scales"
                    + (", the 'of' declarations" if r.of else ", no 'of' declarations")
                    for a in arms
                    if (r := (PAIR_ARMS if pairs else ARMS).get(a)) is not None
                ),
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
    command = f"python -m bench.accuracy.selection_sim --scales {scales} --replays "
    command += str(len([r for r in results if r["scale"] == results[0]["scale"]]))
    title = "DP count-table selection on the simulator"
    if pairs:
        command += f" --pair-effects --pair-gain {gain}"
        title += f" with MovieLens's pair effects × {gain}"
    if out is None:
        write_section(title, [setup, table, picks], command=command)
    else:
        write_section(title, [setup, table, picks], command=command, path=out)


if __name__ == "__main__":
    main()

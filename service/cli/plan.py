"""``selectivity privacy plan``: the budget planner (``service.core.dp.plan``) on the command
line, computed locally (no server)."""

from __future__ import annotations

import argparse
import json
import sys

from pydantic import ValidationError


def _cardinality(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected FEATURE=KEYS, got {text!r}")
    try:
        return name, int(value)
    except ValueError:
        msg = f"{name}: KEYS must be an integer, got {value!r}"
        raise argparse.ArgumentTypeError(msg) from None


def cmd_plan(args: argparse.Namespace) -> None:
    from service.core.dp.plan import PlanRequest, make_plan  # numpy, through the noise module

    cards = dict(args.cardinality)
    if len(cards) != len(args.cardinality):
        sys.exit("error: cardinality: a feature is given twice")
    body = {
        "observations_per_window": args.observations_per_window,
        "cardinalities": cards,
        "labels": args.labels,
        "target_loss": args.target_loss,
        "target_dp_cost": args.target_dp_cost,
        "max_exposure": args.max_exposure,
        "max_epsilon": args.max_epsilon,
        "window_seconds": args.window_seconds,
        "hot_windows": args.hot_windows,
        "max_hot_seconds": args.max_hot_seconds,
        "epsilon_selection": args.epsilon_selection,
        "selection_slots": args.selection_slots,
        "depth": args.depth,
        "peak_rows_per_second": args.peak_rows_per_second,
    }
    try:
        req = PlanRequest.model_validate(body)
    except ValidationError as exc:
        msgs = [
            ": ".join(
                [".".join(map(str, e["loc"]))] * bool(e["loc"])
                + [str(e["msg"]).removeprefix("Value error, ")]
            )
            for e in exc.errors()
        ]
        sys.exit("error: " + "; ".join(msgs))
    p = make_plan(req)
    if args.json:
        print(json.dumps(p.as_dict() | {"stream": p.stream_body("planned")}, indent=2))
        return
    verdict = "proposal" if p.feasible else "closest (target not met)"
    print(
        f"{verdict}: laplace epsilon={p.epsilon:g} per window, window_seconds={p.window_seconds} "
        f"(hot_windows={p.hot_windows}, retention_windows={p.retention_windows}), "
        f"sketch {p.width} x {p.depth}"
    )
    weights = ", ".join(f"{t}={w:.3g}" for t, w in p.table_weights.items())
    print(f"table_weights: {weights}; prior_weight={p.prior_weight:.3g}")
    print(
        f"raw data held (the hot period): {p.raw_rows_held:,} rows, {p.raw_hours_held:,.4g} "
        f"hours, {p.exposure:.2%} of the retained windows"
    )
    if p.selection_slots:
        without = (
            f"without them epsilon={p.epsilon_without_slots:g} meets the target at this window"
            if p.epsilon_without_slots is not None
            else "this window misses the target without them too"
        )
        print(
            f"selection: epsilon_selection={p.epsilon_selection:g}, "
            f"max_tables={len(p.tables) + p.selection_slots} ({p.selection_slots} slots, "
            f"{p.slot_share:.2%} of epsilon each, every table's noise x{p.slot_noise_factor:.3g}; "
            f"{without})"
        )
    else:
        print(f"selection: off, max_tables={len(p.tables)} (no slot reserved)")
    print(
        f"partitions: {p.partitions}"
        + (" (one counting job)" if p.partitions == 1 else " (one counting job each, in parallel)")
    )
    print("why:")
    for line in p.why:
        print(f"  {line}")


def register(privacy: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``plan`` under ``selectivity privacy``."""
    pp = privacy.add_parser(
        "plan",
        help="propose epsilon, window, sketch size and the per-table budget split for a stream",
    )
    pp.add_argument("--observations-per-window", type=int, required=True)
    pp.add_argument(
        "--cardinality",
        type=_cardinality,
        action="append",
        required=True,
        metavar="FEATURE=KEYS",
        help="distinct keys expected of a feature (repeat per feature)",
    )
    pp.add_argument("--labels", type=int, default=2, help="number of labels")
    pp.add_argument(
        "--target-loss",
        type=float,
        default=None,
        help="log-loss / full-data baseline (default 1.03 without --target-dp-cost)",
    )
    pp.add_argument(
        "--target-dp-cost",
        type=float,
        default=None,
        help="log-loss at epsilon / without noise, e.g. 1.02",
    )
    pp.add_argument(
        "--max-exposure", type=float, default=0.01, help="hot windows / retained windows"
    )
    pp.add_argument("--max-epsilon", type=float, default=1.0)
    pp.add_argument(
        "--window-seconds",
        type=int,
        default=86400,
        help="the window the observations are counted in",
    )
    pp.add_argument(
        "--hot-windows",
        type=int,
        default=None,
        help="windows in the train set (default: chosen from the rate, within --max-hot-seconds)",
    )
    pp.add_argument(
        "--max-hot-seconds",
        type=int,
        default=None,
        help="the longest span of raw rows the hot period may keep (default 7 days, or one "
        "--window-seconds if longer)",
    )
    pp.add_argument(
        "--epsilon-selection",
        type=float,
        default=0.0,
        help="plan for count-table selection at this budget per round (default 0: off, no slot)",
    )
    pp.add_argument(
        "--selection-slots",
        type=int,
        default=None,
        help="table slots for selected groups (default 4 with --epsilon-selection, else 0)",
    )
    pp.add_argument("--depth", type=int, default=3, help="sketch depth (fitted at 3)")
    pp.add_argument(
        "--peak-rows-per-second",
        type=float,
        default=None,
        help="peak ingest rate, for the proposed partitions (default: the window's mean rate)",
    )
    pp.add_argument("--json", action="store_true", help="print the proposal as JSON")
    pp.set_defaults(fn=cmd_plan)

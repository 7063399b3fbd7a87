"""CLI for re-identification audits: ``selectivity audit reidentify`` starts an audit of a
stream over HTTP (``POST /v1/audits/reidentification``, as an analyst or admin), shows its
progress and prints the release's guarantee and, per attack, the accuracy over the noise draws
(mean, s.d., range), the positive class's precision and recall and the gains over the prior
(docs/ARCHITECTURE.md, "Re-identification audits")."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from service.cli.http import checked, http_client

ATTACKS = ("growpu", "nnpu", "upu", "kmeans")
POLL_SECONDS = 0.5
NAMES = {
    "growpu": "growPU",
    "nnpu": "nnPU",
    "upu": "uPU",
    "kmeans": "K-means (best assignment)",
    "prior": "prior (majority class)",
    "oracle": "oracle (supervised)",
}


def body_of(args: argparse.Namespace) -> dict[str, Any]:
    """The request body from the command line."""
    release: dict[str, Any] = {"kind": args.release}
    if args.epsilon is not None:
        release["epsilon"] = args.epsilon
    return {
        "source": {"stream": args.stream},
        "positive_label": args.positive_label,
        "release": release,
        "attacks": args.attacks,
        "classifier": args.classifier,
        "draws": args.draws,
    }


def _pct(v: float | None) -> str:
    return "" if v is None else f"{100 * v:.1f} %"


def _points(v: float | None) -> str:
    return "" if v is None else f"{100 * v:+.1f}"


def table(out: dict[str, Any]) -> Any:
    """The results as a rich table, attacks first, then the baselines."""
    from rich.table import Table

    t = Table(title=f"re-identification audit {out['id']}")
    for col in (
        "attack",
        "accuracy",
        "s.d.",
        "range",
        "precision",
        "recall",
        "gain (accuracy)",
        "gain (precision)",
        "draws",
        "seconds",
    ):
        t.add_column(col, justify="left" if col == "attack" else "right")
    res = out["results"]
    for name in [*(a for a in ATTACKS if a in res), "prior", "oracle"]:
        if name in res:
            r = res[name]
            acc = (r.get("spread") or {}).get("accuracy") or {}
            span = f"{100 * acc['min']:.1f}-{100 * acc['max']:.1f}" if acc else ""
            t.add_row(
                NAMES[name],
                _pct(r["accuracy"]),
                "" if not acc else f"{100 * acc['sd']:.1f}",
                span,
                _pct(r.get("precision")),
                _pct(r.get("recall")),
                _points(r.get("accuracy_gain")),
                _points(r.get("precision_gain")),
                str(r.get("draws") or ""),
                "" if r.get("seconds") is None else f"{r['seconds']:.1f}",
            )
    return t


def guarantee_line(out: dict[str, Any]) -> str:
    """What the release guarantees, in one line."""
    g = out.get("guarantee")
    if out.get("epsilon") is None or g is None:
        return "guarantee: none (the exact release)"
    if "epsilon_sum" not in g:  # the stream's count tables
        return (
            f"guarantee: ε = {g['epsilon']:g} ({g.get('mechanism')}), {g['unit']}, neighbours "
            f"{g['neighbours']}; source: {g['source']}"
        )
    dom = g["domain"]
    what = (
        f"one-hot, {dom['tables']} tables"
        if dom["kind"] == "one_hot"
        else f"each coordinate in [{dom['min']:g}, {dom['max']:g}]"
    )
    return (
        f"guarantee: ε = {g['epsilon']:g} for {g['unit']}, {g['neighbours']} "
        f"(ε {g['epsilon_sum']:g} to the sum, {g['epsilon_count']:g} to the count; {what}, "
        f"L1 bound {g['l1_bound']:g}); "
        f"source: {g['source']}"
    )


def progress_line(out: dict[str, Any]) -> str:
    """One line of an audit's state: its progress and stage while it runs; once it failed,
    that it failed, how far it got and why."""
    if out["status"] == "failed":
        pct = f"{100 * out['progress']:.1f} %"
        return f"failed at {pct}: {out.get('error') or 'no reason recorded'}"
    return f"{100 * out['progress']:5.1f} % {out.get('stage') or out['status']}"


def cmd_reidentify(args: argparse.Namespace) -> None:
    """Start the audit, follow its progress (a bar; on a non-terminal also one line per
    stage), print the results."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

    console = Console(width=None if sys.stdout.isatty() else 140)  # a log keeps the whole table
    with http_client(args) as c:
        a = checked(c.post("/v1/audits/reidentification", json=body_of(args)))["id"]
        console.print(f"audit {a} started")
        with Progress(
            TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), console=console
        ) as bar:
            task = bar.add_task("queued", total=1.0)
            stage = None
            while True:
                out = checked(c.get(f"/v1/audits/reidentification/{a}"))
                bar.update(task, completed=out["progress"], description=out.get("stage") or "")
                if out.get("stage") != stage and not console.is_terminal:
                    stage = out.get("stage")
                    bar.console.print(progress_line(out))
                if out["status"] != "running":
                    break
                time.sleep(POLL_SECONDS)
    if out["status"] == "failed":
        sys.exit(f"error: the audit {progress_line(out)}")
    eps = out.get("epsilon")
    console.print(
        f"{out['source']}, release {out['release']['kind']}"
        f" (ε = {'none: exact' if eps is None else f'{eps:g}'}"
        + (f", {out['mechanism']}" if out.get("mechanism") else "")
        + f"): n = {out['n']} records of {out['dimensions']} numbers, "
        f"π_p = {out['pi_p']:.3f}, {out['seconds']:.1f} s"
    )
    console.print(guarantee_line(out))
    console.print(table(out))
    console.print(
        "accuracy, precision, recall: means over the draws; gains: accuracy − the prior's, "
        "precision − π_p (in points)"
    )


def register(audit: Any) -> None:
    """``selectivity audit reidentify``: ``audit`` is ``selectivity audit``'s sub-commands,
    which ``cli_coldstore.register`` made and returned."""
    p = audit.add_parser(
        "reidentify",
        help="what an attacker holding a stream's records recovers of their labels from a "
        "class-level release (over HTTP, analyst or admin)",
    )
    p.add_argument("--url", default=os.environ.get("SELECTIVITY_URL", "http://127.0.0.1:8000"))
    p.add_argument("--key", help="API key (default: $SELECTIVITY_API_KEY)")
    p.add_argument("--stream", required=True)
    p.add_argument("--positive-label", required=True, help="the label whose class is released")
    p.add_argument("--release", choices=["count_tables", "class_mean"], required=True)
    p.add_argument(
        "--epsilon",
        type=float,
        default=None,
        help="class_mean: ε for the whole record, add/remove one record (omitted: the exact mean)",
    )
    p.add_argument("--attacks", nargs="+", choices=ATTACKS, default=list(ATTACKS))
    p.add_argument("--classifier", choices=["linear", "mlp"], default="linear")
    p.add_argument(
        "--draws",
        type=int,
        default=5,
        help="noise draws, each attacked by freshly trained attacks (1-20; count_tables: the "
        "tables' one release, re-trained on)",
    )
    p.set_defaults(fn=cmd_reidentify)

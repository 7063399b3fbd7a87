"""Empirical DP audit of the service's releases: audited lower bounds on ε against the claims.

`selectivity bench dp-audit [--releases N] [--selection-releases M] [--confidence C]`: every
case of ``service.privacy.auditing.suite`` (the service's mechanisms on the neighbouring pairs
the search finds, then the planted bugs) draws N releases on each input (M for the cases that
run a selection round per release: ``select`` is one call each), and bounds ε from below at
confidence C (Clopper–Pearson on a threshold test chosen on the first half of the releases,
evaluated on the second; ``service.privacy.auditing``). A row PASSes when the bound is at most
the claimed ε; a planted bug must FAIL. Tightness is bound / claim; "pair ε" is the exact
privacy loss of the pair audited where it has a closed form (the bound cannot pass it).

Writes the table into BENCHMARKS.md (section "DP audit"), the rows to
``bench/results/dp_audit.csv`` and the plot of audited against claimed ε to
``bench/plots/dp_audit.png``.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from bench.report import ROOT, Clock, Plot, Table, plot_path, pyplot, write_section
from service.privacy.auditing import suite

RESULTS = ROOT / "bench" / "results"
COLUMNS = (
    "mechanism",
    "neighbours",
    "planted",
    "claimed_epsilon",
    "delta",
    "claim_source",
    "pair_epsilon",
    "audited_epsilon",
    "confidence",
    "tightness",
    "verdict",
    "releases",
    "seconds",
)


def _plot(rows: list[dict]) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    top = max(max(r["claimed_epsilon"], r["audited_epsilon"]) for r in rows) * 1.1
    ax.plot([0, top], [0, top], color="grey", lw=1, ls="--", label="audited = claimed")
    honest = [r for r in rows if not r["planted"]]
    bugs = [r for r in rows if r["planted"]]
    ax.scatter(
        [r["claimed_epsilon"] for r in honest],
        [r["audited_epsilon"] for r in honest],
        marker="o",
        label="service (must be below)",
    )
    ax.scatter(
        [r["claimed_epsilon"] for r in bugs],
        [r["audited_epsilon"] for r in bugs],
        marker="x",
        color="crimson",
        s=60,
        label="planted bug (must be above)",
    )
    for i, r in enumerate(rows, 1):
        ax.annotate(
            str(i),
            (r["claimed_epsilon"], r["audited_epsilon"]),
            textcoords="offset points",
            xytext=(4, 3) if i % 2 else (-12, -10),
            fontsize=7,
        )
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("claimed ε")
    ax.set_ylabel(f"audited lower bound on ε ({rows[0]['confidence']:.0%} confidence)")
    ax.set_title("DP audit: audited against claimed ε (numbers: table rows)")
    ax.legend(loc="lower right", fontsize=8)
    path = plot_path("dp_audit")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(
        prog="selectivity bench dp-audit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--releases", type=int, default=1_000_000, help="releases per input (bulk-drawn cases)"
    )
    ap.add_argument(
        "--selection-releases",
        type=int,
        default=200_000,
        help="releases per input of cases with selection rounds",
    )
    ap.add_argument("--confidence", type=float, default=suite.CONFIDENCE)
    ap.add_argument(
        "--no-write",
        action="store_true",
        help="print only; leave BENCHMARKS.md, the CSV and the plot",
    )
    args = ap.parse_args(argv)
    clock = Clock()
    clock("searching neighbouring pairs")
    cases = suite.service_cases() + suite.planted_cases()
    rows = []
    for i, case in enumerate(cases, 1):
        n = args.selection_releases if "selection" in case.mechanism else args.releases
        clock(f"{i}/{len(cases)} {case.mechanism} | {case.relation}: {n:,} releases a side")
        r = suite.audit(case, releases=n, confidence=args.confidence)
        row = r.row()
        rows.append(row)
        claimed, audited = row["claimed_epsilon"], row["audited_epsilon"]
        clock(f"    claimed {claimed:.4g}, audited >= {audited:.4g}: {row['verdict']}")
    if args.no_write:
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    with (RESULTS / "dp_audit.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    png = _plot(rows)
    table = Table(
        [
            "#",
            "mechanism",
            "neighbours",
            "claimed ε",
            "δ",
            "claim from",
            "pair ε",
            "audited ε ≥",
            "audited / claimed",
            "verdict",
            "releases a side",
        ],
        [
            [
                i,
                r["mechanism"],
                r["neighbours"],
                r["claimed_epsilon"],
                r["delta"],
                r["claim_source"],
                "" if r["pair_epsilon"] is None else r["pair_epsilon"],
                r["audited_epsilon"],
                r["tightness"],
                r["verdict"] + (" (planted: must FAIL)" if r["planted"] else ""),
                f"{r['releases']:,}",
            ]
            for i, r in enumerate(rows, 1)
        ],
    )
    command = "selectivity bench dp-audit " + " ".join(argv)
    write_section(
        "DP audit",
        [table, Plot("audited against claimed ε", png)],
        command=command.strip(),
        key="dp-audit",
    )

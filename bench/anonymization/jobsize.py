"""``python -m bench.anonymization.jobsize``: SaNGreeA's run time in the worst case a user job
can ask for, to set the inline-row limit of ``POST /v1/anonymizations`` (BENCHMARKS.md,
"Anonymization job size").

The worst case is range quasi-identifiers only, every value distinct, at k = 2: one
categorical combination, so the lower bound prunes nothing and every greedy step scores every
unassigned row (Θ(n²·s) work, ``service.core.anonymity.sangreea``). Rows are uniform random floats
(seeded); each size is timed once on one thread (``openmp_limited(1)``, BLAS likewise), as a job
runs at ``SELECTIVITY_AUDIT_THREADS`` = 1. Prints one line per (rows, quasi-identifiers) with
the seconds and the fitted constant ``seconds / (rows² · (s + 1))``."""

from __future__ import annotations

import argparse
import time

import numpy as np
from threadpoolctl import threadpool_limits

from service.core.anonymity.sangreea import QuasiIdentifier, anonymize


def run(rows: int, qis: int, k: int, kind: str = "range", seed: int = 7) -> float:
    rng = np.random.default_rng(seed)
    names = [f"q{j}" for j in range(qis)]
    if kind == "range":
        columns = {name: rng.uniform(0, 1000, rows).tolist() for name in names}
    else:  # flat trees of 50 values each: nearly every row its own combination
        columns = {name: [f"v{v}" for v in rng.integers(0, 50, rows)] for name in names}
    spec = [QuasiIdentifier(name=name, kind=kind) for name in names]  # type: ignore[arg-type]
    start = time.process_time()
    anonymize(columns, spec, k)
    return time.process_time() - start


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", default="1000,2000,4000,8000", help="comma-separated sizes")
    p.add_argument("--qis", default="8", help="comma-separated numbers of range QIs")
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--kind", choices=["range", "hierarchy"], default="range")
    args = p.parse_args(argv)
    print("kind,rows,qis,k,cpu_seconds,seconds_per_row2_qi")
    with threadpool_limits(limits=1):
        for s in (int(v) for v in args.qis.split(",")):
            for n in (int(v) for v in args.rows.split(",")):
                t = run(n, s, args.k, args.kind)
                print(
                    f"{args.kind},{n},{s},{args.k},{t:.2f},{t / (n * n * (s + 1)):.3g}", flush=True
                )


if __name__ == "__main__":
    main()

"""Re-identification from the service's own count tables: MovieLens 100K, accuracy against ε.

``python -m bench.reidentification.movielens [--count N] [--hot N] [--eps 0.001 0.01 ...]``:
one stream per ε (laplace, ε per window; and one with ``mechanism: none``), features as in the
accuracy benchmark (``bench.movielens``: user, movie, genres, age, gender, occupation, zip3; a
table each), label "1" when rating ≥ 4. The first ``--count`` ratings in time order go into
window 1, which the roll moves into the count period; the next ``--hot`` ratings into window 2,
the hot period. With ``--same`` window 1 holds those hot ratings themselves (the paper's
setting: the tables count exactly the records the attacker holds, as they will once the hot
window has rolled into the count period). Then, through the service's own endpoint
(``POST /v1/audits/reidentification``, the job run here as the worker would), on the hot
records one-hot per table:

* ``count_tables``: the positive class's mean read off the count period's noisy tables (an
  attacker who reads the tables; ``service.audits.encoding``), at the stream's ε;
* ``class_mean``: the hot records' own positive class, its noisy sum and noisy count at the
  same ε for the whole record, add/remove one record
  (``service.core.reidentification.attacks.SumRelease``: one-hot
  records, L1 bound = the number of tables, 7).

growPU, nnPU (linear) and K-means, with the prior and the oracle; each audit attacks
``--draws`` noise draws (``count_tables``: the tables' one release, re-trained on; a new stream
per ε draws new tables) and the table shows the means over them. Prints a markdown table and
writes
``bench/plots/reidentification_movielens_eps.png``. Budgets are reduced as in the MNIST profile
(``--t-pre``, ``--t-tune``, ``--pu-epochs``); the oracle trains 1,000 epochs
(``--oracle-epochs``). BLAS on one thread.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import secrets
import time
from typing import Any

from threadpoolctl import threadpool_limits

from bench import movielens
from bench.harness import InProcess
from bench.report import markdown_table, plot_path, pyplot
from service.audits import service as audits
from service.core.reidentification.attacks import PUConfig

EPS: tuple[float | None, ...] = (0.001, 0.01, 0.1, 1.0, 10.0, None)
ATTACKS = ["growpu", "nnpu", "kmeans"]


async def _stream(
    svc: InProcess, counted: list[dict[str, Any]], hot: list[dict[str, Any]], eps: float | None
) -> str:
    name = f"reid-{secrets.token_hex(4)}"
    privacy = {"mechanism": "none"} if eps is None else {"mechanism": "laplace", "epsilon": eps}
    body = {
        "name": name,
        "features": movielens.stream_features(),
        "labels": ["0", "1"],
        "window_seconds": 86_400,
        "hot_windows": 1,
        "retention_windows": 1,
        "privacy": privacy,
        "sketch": {"width": 16384, "depth": 1},
    }
    await svc.call("POST", "/streams", "admin", 201, json=body)
    batch = svc.settings.max_batch
    for part, window in ((counted, 1), (hot, 2)):
        if window == 2:
            r = await svc.call("POST", f"/streams/{name}/roll", "admin")
            assert r.json() == {"epoch": 2}, r.json()
            await svc.settle(name)
        for lo in range(0, len(part), batch):
            chunk = part[lo : lo + batch]
            url = f"/streams/{name}/observations"
            r = await svc.call("POST", url, "producer", 202, json={"observations": chunk})
            assert r.json()["window"] == window, r.json()
    return name


async def _audit(svc: InProcess, name: str, release: dict[str, Any], draws: int) -> dict[str, Any]:
    body = {
        "source": {"stream": name},
        "positive_label": "1",
        "release": release,
        "attacks": ATTACKS,
        "classifier": "linear",
        "draws": draws,
    }
    a = (await svc.call("POST", "/audits/reidentification", "admin", 202, json=body)).json()["id"]
    assert (await audits.run(ctx=svc.ctx, a=a))["status"] == "done"
    out = (await svc.call("GET", f"/audits/reidentification/{a}", "admin")).json()
    assert out["status"] == "done", out
    return dict(out)


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    df = movielens.load().iloc[: args.count + args.hot]
    obs = movielens.observations(df)
    hot = obs[args.count :]
    counted = hot if args.same else obs[: args.count]
    rows: list[dict[str, Any]] = []
    async with InProcess() as svc:
        for eps in args.eps:
            t0 = time.perf_counter()
            name = await _stream(svc, counted, hot, eps)
            for kind in ("count_tables", "class_mean"):
                release = {"kind": kind}
                if kind == "class_mean" and eps is not None:
                    release["epsilon"] = eps
                out = await _audit(svc, name, release, args.draws)
                res = out["results"]
                rows.append(
                    {
                        "epsilon": eps,
                        "release": kind,
                        **{k: 100 * v["accuracy"] for k, v in res.items()},
                        "n": out["n"],
                        "dimensions": out["dimensions"],
                        "pi_p": out["pi_p"],
                        "seconds": out["seconds"],
                    }
                )
                print(rows[-1], flush=True)
            await svc.forget(name)
            print(f"ε = {eps}: {time.perf_counter() - t0:.0f} s", flush=True)
    return rows


def _plot(rows: list[dict[str, Any]], name: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    finite = [e for e in EPS if e is not None]
    x_of = {e: (e if e is not None else 100.0) for e in EPS}
    styles = {"count_tables": "-", "class_mean": "--"}
    for kind, ls in styles.items():
        for attack, color in (("growpu", "C0"), ("nnpu", "C1")):
            pts = sorted((x_of[r["epsilon"]], r[attack]) for r in rows if r["release"] == kind)
            ax.plot(*zip(*pts, strict=True), ls, marker="o", color=color, label=f"{attack}, {kind}")
    km = [r["kmeans"] for r in rows]
    prior = rows[0]["prior"]
    oracle = max(r["oracle"] for r in rows)
    ax.axhline(sum(km) / len(km), color="C2", ls=":", label="K-means (mean)")
    ax.axhline(prior, color="grey", ls=":", label="prior")
    ax.axhline(oracle, color="k", ls=":", label="oracle")
    ax.set_xscale("log")
    ax.set_xticks([*finite, 100.0], [*(f"{e:g}" for e in finite), "none"])
    ax.set_xlabel("ε per window (none: exact counts / exact mean)")
    ax.set_ylabel("re-identification accuracy, %")
    ax.set_title("MovieLens 100K, label rating ≥ 4: hot records labelled from a release")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(plot_path(name), dpi=120)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.reidentification.movielens")
    p.add_argument("--count", type=int, default=50_000, help="ratings in the count period")
    p.add_argument("--hot", type=int, default=3_000, help="ratings in the hot period (attacked)")
    p.add_argument("--eps", type=lambda s: None if s == "none" else float(s), nargs="+")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    p.add_argument(
        "--same",
        action="store_true",
        help="the count period holds the hot records themselves (the paper's setting: the "
        "attacker holds exactly the counted records), not the --count earlier ratings",
    )
    p.add_argument("--draws", type=int, default=5, help="noise draws per audit (1-20)")
    p.add_argument("--t-pre", type=int, default=3_000)
    p.add_argument("--t-tune", type=int, default=3_000)
    p.add_argument("--pu-epochs", type=int, default=250)
    p.add_argument(
        "--oracle-epochs",
        type=int,
        default=1_000,
        help="the supervised upper bound's epochs (PUConfig's 100 leave it under-trained here)",
    )
    args = p.parse_args(argv)
    args.eps = args.eps or list(EPS)
    audits.CONFIG = dataclasses.replace(
        PUConfig(),
        t_pre=args.t_pre,
        t_tune=args.t_tune,
        pu_epochs=args.pu_epochs,
        oracle_epochs=args.oracle_epochs,
    )
    with threadpool_limits(1):
        rows = asyncio.run(run(args))
    cols = ["growpu", "nnpu", "kmeans", "prior", "oracle"]
    table = [
        [
            "none" if r["epsilon"] is None else f"{r['epsilon']:g}",
            r["release"],
            *(f"{r[c]:.1f}" for c in cols),
            f"{r['seconds']:.0f}",
        ]
        for r in rows
    ]
    print(markdown_table(["ε", "release", *cols, "seconds"], table))
    print(
        f"n = {rows[0]['n']} hot records, {rows[0]['dimensions']} one-hot columns, "
        f"π_p = {rows[0]['pi_p']:.3f}"
    )
    if len(args.eps) > 1 and not args.no_plot:
        _plot(
            rows,
            "reidentification_movielens_same" if args.same else "reidentification_movielens_eps",
        )


if __name__ == "__main__":
    main()

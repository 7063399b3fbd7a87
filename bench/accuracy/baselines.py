"""(a) The raw baselines: LightGBM with native categorical features on every raw rating before
the cut (the baseline every ratio divides by), the label prior of those ratings, and the same
model on the raw hot window only."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from bench import lgbm, movielens
from bench.accuracy.plan import Eval, Plan


def raw_evals(
    df: pd.DataFrame,
    plan: Plan,
    shares: Sequence[float],
    say: Callable[[str], None],
    training: lgbm.Training = lgbm.DEFAULT,
) -> list[Eval]:
    raw = movielens.raw_frame(df)
    y = movielens.labels01(df)
    out: list[Eval] = []
    for cut in plan.cuts:
        t = plan.test(cut)
        started = time.perf_counter()
        p, rounds = lgbm.fit_predict(raw.iloc[:cut], y[:cut], raw.iloc[t], training)
        base = Eval("baseline", None, None, cut, lgbm.log_loss(y[t], p), lgbm.auc(y[t], p), rounds)
        prior = np.full(len(p), y[:cut].mean())
        out += [base, Eval("prior", None, None, cut, lgbm.log_loss(y[t], prior), 0.5)]
        say(
            f"baseline   cut {cut:>6}: log-loss {base.log_loss:.4f} AUC {base.auc:.4f} "
            f"({rounds} rounds, {time.perf_counter() - started:.1f}s)"
        )
        for share in shares:
            w = plan.window(share)
            hot = slice(cut - w, cut)
            p, rounds = lgbm.fit_predict(raw.iloc[hot], y[hot], raw.iloc[t], training)
            out.append(
                Eval(
                    "raw-hot",
                    share,
                    None,
                    cut,
                    lgbm.log_loss(y[t], p),
                    lgbm.auc(y[t], p),
                    rounds,
                )
            )
    return out

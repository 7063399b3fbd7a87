"""``python -m bench anonymization utility``: the utility experiment of Malle, Kieseberg and
Holzinger ("Interactive Anonymization for Privacy aware Machine Learning", sections 4.1–4.4):
how well four classifiers predict a target from an Adult table k-anonymised by SaNGreeA
(``service.core.anonymity.sangreea.anonymize``) with equal, "bias" and iML weight vectors, against
the
un-anonymised table (shown at k = 1) and a strict Mondrian partition (``mondrian.py``) at equal k.

**Data.** The first ``--rows`` complete Adult rows in file order (``adult.load``: the paper's
preprocessing; default 3,000, the paper's batch size), the trees of ``examples/adult/hierarchies``.
With 3 folds the whole run (3 targets × 6 k × 7 weight vectors + Mondrian + the raw table, 4
classifiers each: 588 cross-validations) takes about 10 minutes on two shared cores; 5 folds
would take ~18.

**Targets** (section 4.4). ``income`` (2 classes), ``marital-status`` (7 classes, as in the
data) and ``education`` in the paper's 4 groups, made from ``education-num`` (the paper drops
``education`` and keeps ``education-num``): pre-high-school = 1–8 (Preschool … 12th, no
diploma), high-school = 9 (HS-grad), ≤ bachelors = 10–13 (Some-college, Assoc-voc, Assoc-acdm,
Bachelors), advanced-studies = 14–16 (Masters, Prof-school, Doctorate). The target's own column
is not a quasi-identifier (it is kept as it is and is the label only); the other ten attributes
(age, education-num, hours-per-week as ranges, the seven categorical ones as hierarchies) are,
and ``income``, released unchanged when it is not the target, is a feature like any released
column.

**Weight vectors** (mean 1, ``normalise_weights``). ``equal``; ``bias``: the hand-set vectors of
``TARGETS`` (three per target, each with why); ``iml``: learned by a simulated human playing the
service's iML game (``simulate_iml``) through the real update rule ``service.anonymize.iml``:
exactly the session loop of ``service.anonymize.service`` (cluster the first 500 rows, the
paper's iML sample, by SaNGreeA at k = ``IML_K`` with the current weights; the question is row
``answered mod 500`` and the two clusters ``iml.candidates`` picks; the answer moves the weights
by ``iml.update``), ``--answers`` questions per session. The simulated human prefers the cluster
that keeps the target-relevant attributes: it picks the candidate with the smaller
``Σ_{j ∈ R} d[c, j]`` (``d`` = ``iml.row_costs``, attribute j's normalised generalisation of
the cluster with the row added; ``R`` = the target's ``relevant`` attributes), ties to the
smaller ``Σ_j d[c, j]``, then to the first; a careless human answers the other way with
probability ``noise``. Three users per target: one careful (noise 0) and two careless (noise
0.2, two seeds).

**Classifiers** (scikit-learn, one thread): linear SVC, logistic regression, gradient boosting
(``GradientBoostingClassifier``, 50 stages of depth 3 on √features per split: the full one is
~5× slower on the 7-class target and this box has two shared cores) and a random forest (50
trees). **Features**: a range QI as three columns, the interval's lo, hi and midpoint; a
hierarchy QI (and a released categorical column) one-hot over its node names; numbers
standardised. The un-anonymised table is encoded the same way (lo = hi = mid = the value, the
leaves). **Score**: F1 by stratified ``--folds``-fold (default 3) cross-validation
(shuffled, seed 0; the mean over folds), ``f1_score(y_true, y_pred)`` in that order (the
reference evaluation swaps the arguments of its precision score), averaged ``weighted`` by class
support (for binary income too, so the three targets use one measure); ``macro`` is in the CSV
as well.

**NGIL.** Every release is scored by the GIL of ``service.core.anonymity.sangreea`` with equal
weights
(``partition_ngil``), so weighted SaNGreeA runs and Mondrian are compared on one objective.

Writes ``anonymization_utility.csv`` (one line per target, weight vector, k and classifier),
``anonymization_utility_weights.csv``, ``anonymization_utility_f1.png`` and
``anonymization_utility_ngil.png`` to ``--out`` and prints a BENCHMARKS.md section."""

from __future__ import annotations

import argparse
import csv
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
from sklearn.base import ClassifierMixin
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score
from sklearn.model_selection import StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from sklearn.svm import LinearSVC
from threadpoolctl import threadpool_limits

from bench import report
from bench.anonymization import adult
from bench.anonymization.mondrian import mondrian
from service.anonymize import iml
from service.core.anonymity.hierarchy import flat_hierarchy
from service.core.anonymity.sangreea import (
    QuasiIdentifier,
    anonymize,
    normalise_weights,
    partition_ngil,
)

K_VALUES = (5, 10, 20, 50, 100, 200)
IML_ROWS = 500  # the paper's iML sample: the first 500 complete rows
IML_K = 10
EDUCATION_GROUPS = (
    (8, "pre-high-school"),
    (9, "high-school"),
    (13, "<=bachelors"),
    (16, "advanced-studies"),
)


@dataclass(frozen=True)
class Target:
    name: str
    column: str  # the source column (and the QI taken out of the QIs)
    relevant: tuple[str, ...]  # what the simulated iML human keeps
    bias: Mapping[str, Mapping[str, float]]  # name → weights (omitted = 1, before mean 1)
    why: Mapping[str, str]


TARGETS: dict[str, Target] = {
    "income": Target(
        "income",
        "income",
        relevant=("education-num", "occupation", "hours-per-week", "age"),
        bias={
            "bias-work": {"education-num": 4, "occupation": 3, "hours-per-week": 3, "age": 2},
            "bias-household": {"marital-status": 4, "relationship": 4, "age": 2, "sex": 2},
            "bias-stereotype": {"sex": 4, "race": 4, "native-country": 2, "age": 2},
        },
        why={
            "bias-work": "pay follows schooling, job and hours (human capital)",
            "bias-household": "married men (husbands) earn most in Adult",
            "bias-stereotype": "the stereotypes the paper suspects of its users (gender, race)",
        },
    ),
    "marital-status": Target(
        "marital-status",
        "marital-status",
        relevant=("relationship", "age", "sex"),
        bias={
            "bias-relationship": {"relationship": 5},
            "bias-lifestage": {"relationship": 3, "age": 3, "sex": 2, "hours-per-week": 2},
            "bias-stereotype": {"sex": 3, "age": 3, "race": 2, "native-country": 2},
        },
        why={
            "bias-relationship": "husband/wife implies married: the paper's users overvalued it",
            "bias-lifestage": "relationship plus age and sex (never-married are young)",
            "bias-stereotype": "demographics without relationship",
        },
    ),
    "education": Target(
        "education",
        "education-num",
        relevant=("occupation", "workclass", "age"),
        bias={
            "bias-occupation": {"occupation": 5, "workclass": 2},
            "bias-career": {"occupation": 3, "hours-per-week": 2, "age": 2, "workclass": 2},
            "bias-stereotype": {"race": 3, "native-country": 3, "sex": 2},
        },
        why={
            "bias-occupation": "professions need degrees",
            "bias-career": "job, hours and age together",
            "bias-stereotype": "origin and gender, a misleading cue",
        },
    ),
}
IML_USERS = (("iml-careful", 0.0, 0), ("iml-careless-1", 0.2, 1), ("iml-careless-2", 0.2, 2))


def classifiers() -> dict[str, Callable[[], ClassifierMixin]]:
    return {
        "linear SVC": lambda: LinearSVC(max_iter=5000, random_state=0),
        "logistic regression": lambda: LogisticRegression(max_iter=1000),
        "gradient boosting": lambda: GradientBoostingClassifier(
            n_estimators=50, max_depth=3, max_features="sqrt", random_state=0
        ),
        "random forest": lambda: RandomForestClassifier(n_estimators=50, random_state=0),
    }


def labels_of(target: Target, df: pd.DataFrame) -> npt.NDArray[Any]:
    """The class of every row: the column itself, or education-num in the paper's 4 groups."""
    if target.name != "education":
        return df[target.column].astype(str).to_numpy()
    num = df[target.column].to_numpy()
    out = np.empty(len(num), dtype=object)
    lo = 0
    for hi, name in EDUCATION_GROUPS:
        out[(num > lo) & (num <= hi)] = name
        lo = hi
    return out


def target_qis(target: Target) -> list[QuasiIdentifier]:
    return [q for q in adult.quasi_identifiers() if q.name != target.column]


def released_columns(target: Target) -> list[str]:
    """The released columns that are not QIs and not the label (income for the others)."""
    return [c for c in adult.KEEP if c != target.column]


def generalise(
    df: pd.DataFrame, qis: Sequence[QuasiIdentifier], labels: npt.NDArray[np.int64]
) -> pd.DataFrame:
    """The release of a partition as numbers and node names, one row per input row: a range QI
    ``a`` as ``a.lo``, ``a.hi``, ``a.mid`` (the cluster's min, max, midpoint), a hierarchy QI as
    the name of the lowest common ancestor of the cluster's values. ``labels = arange(n)`` gives
    the un-anonymised table in the same form."""
    out: dict[str, Any] = {}
    for q in qis:
        col = df[q.name]
        if q.kind == "range":
            g = col.astype(float).groupby(labels)
            lo = g.transform("min").to_numpy()
            hi = g.transform("max").to_numpy()
            out[f"{q.name}.lo"], out[f"{q.name}.hi"], out[f"{q.name}.mid"] = lo, hi, (lo + hi) / 2
        else:
            h = q.hierarchy or flat_hierarchy(str(v) for v in col)
            index = h.index()
            nodes = np.array([index[str(v)] for v in col], dtype=np.int64)
            c = int(labels.max()) + 1
            lca = np.full(c, -1, dtype=np.int64)
            for i, node in zip(labels.tolist(), nodes.tolist(), strict=True):
                lca[i] = node if lca[i] < 0 else h.lca[lca[i], node]
            out[q.name] = np.array(h.names, dtype=object)[lca[labels]]
    return pd.DataFrame(out)


def features(
    df: pd.DataFrame, target: Target, labels: npt.NDArray[np.int64]
) -> tuple[pd.DataFrame, list[str], list[str]]:
    """(X, numeric columns, categorical columns) of a release for ``target``."""
    x = generalise(df, target_qis(target), labels)
    for c in released_columns(target):
        x[c] = df[c].astype(str).to_numpy()
    numeric = [c for c in x.columns if c.endswith((".lo", ".hi", ".mid"))]
    return x, numeric, [c for c in x.columns if c not in numeric]


def cross_validated_f1(
    x: pd.DataFrame,
    y: npt.NDArray[Any],
    numeric: list[str],
    categorical: list[str],
    make: Callable[[], ClassifierMixin],
    folds: int,
) -> tuple[float, float, float]:
    """(mean weighted F1, its s.d. over folds, mean macro F1) by stratified k-fold CV, each
    fold scored as ``f1_score(y_true, y_pred)``."""
    weighted, macro = [], []
    split = StratifiedKFold(n_splits=folds, shuffle=True, random_state=0)
    with warnings.catch_warnings():
        # a class rarer than the folds (Married-AF-spouse: 3 in 3,000) and a linear model
        # stopping at max_iter are expected here, not errors
        warnings.filterwarnings("ignore", message="The least populated class", category=UserWarning)
        warnings.filterwarnings("ignore", category=ConvergenceWarning)
        for train, test in split.split(x, y):
            pipe = make_pipeline(
                ColumnTransformer(
                    [
                        ("cat", OneHotEncoder(handle_unknown="ignore"), categorical),
                        ("num", StandardScaler(), numeric),
                    ],
                    sparse_threshold=0.0,
                ),
                make(),
            )
            pipe.fit(x.iloc[train], y[train])
            y_true, y_pred = y[test], pipe.predict(x.iloc[test])
            weighted.append(f1_score(y_true, y_pred, average="weighted", zero_division=0))
            macro.append(f1_score(y_true, y_pred, average="macro", zero_division=0))
    return float(np.mean(weighted)), float(np.std(weighted)), float(np.mean(macro))


def simulated_choice(
    d: npt.NDArray[np.float64], names: Sequence[str], relevant: Sequence[str]
) -> int:
    """0 or 1: the candidate (rows of ``d``) that generalises the relevant attributes less
    (ties: all attributes less; then the first)."""
    rel = [names.index(r) for r in relevant if r in names]
    keys = [(float(d[c, rel].sum()), float(d[c].sum())) for c in (0, 1)]
    return 0 if keys[0] <= keys[1] else 1


def simulate_iml(
    df: pd.DataFrame,
    qis: Sequence[QuasiIdentifier],
    relevant: Sequence[str],
    *,
    k: int,
    answers: int,
    noise: float,
    seed: int,
) -> dict[str, float]:
    """The weights after ``answers`` questions of the service's iML session loop (module
    docstring) answered by the simulated human."""
    cols = {q.name: df[q.name].to_numpy() for q in qis}
    names = [q.name for q in qis]
    weights = normalise_weights(names, None)
    rng = np.random.default_rng(seed)  # simulation, not privacy noise
    for answered in range(answers):
        res = anonymize(cols, qis, k, weights)
        r = answered % len(df)
        d = iml.row_costs(res, {n: cols[n][r] for n in names})
        a, b = iml.candidates(res, r, d)
        order = [*res.ranges, *res.cats]
        pair = d[[a, b]]
        choice = simulated_choice(pair, order, relevant)
        if rng.random() < noise:
            choice = 1 - choice
        weights = iml.update(weights, order, pair[choice], pair[1 - choice])
    return weights


@dataclass
class Record:
    target: str
    method: str
    family: str  # raw, equal, bias, iml, mondrian
    k: int
    classifier: str
    f1: float
    f1_sd: float
    f1_macro: float
    ngil: float  # equal-weight GIL of the partition
    clusters: int
    min_cluster: int
    anonymize_s: float


@dataclass
class Plan:
    rows: int = 3000
    ks: tuple[int, ...] = K_VALUES
    targets: tuple[str, ...] = tuple(TARGETS)
    classifiers: tuple[str, ...] = tuple(classifiers())
    folds: int = 3
    bias: int = 3  # the first n bias vectors per target
    iml_users: int = 3
    answers: int = 50
    say: Callable[[str], None] = field(default=print)


def weight_vectors(
    df: pd.DataFrame, target: Target, plan: Plan
) -> list[tuple[str, str, dict[str, float]]]:
    """(name, family, weights) for the target: equal, its bias vectors, its simulated iML users."""
    qis = target_qis(target)
    names = [q.name for q in qis]
    out = [("equal", "equal", normalise_weights(names, None))]
    for name in list(target.bias)[: plan.bias]:
        out.append((name, "bias", normalise_weights(names, target.bias[name])))
    sample = df.head(IML_ROWS)
    for name, noise, seed in IML_USERS[: plan.iml_users]:
        w = simulate_iml(
            sample, qis, target.relevant, k=IML_K, answers=plan.answers, noise=noise, seed=seed
        )
        out.append((name, "iml", w))
    return out


@dataclass
class _Task:
    """One target's data: rows, QIs, label."""

    target: Target
    df: pd.DataFrame
    qis: list[QuasiIdentifier]
    y: npt.NDArray[Any]

    @property
    def columns(self) -> dict[str, Any]:
        return {q.name: self.df[q.name].to_numpy() for q in self.qis}


def score(
    task: _Task, plan: Plan, method: str, family: str, k: int, labels: Any, secs: float
) -> list[Record]:
    """The plan's classifiers on one release (``labels``: a partition of the rows)."""
    x, num, cat = features(task.df, task.target, labels)
    ngil = partition_ngil(task.columns, task.qis, labels)[1]
    sizes = np.bincount(labels)
    makers = classifiers()
    out = []
    for cname in plan.classifiers:
        f1, sd, macro = cross_validated_f1(x, task.y, num, cat, makers[cname], plan.folds)
        out.append(
            Record(
                task.target.name,
                method,
                family,
                k,
                cname,
                f1,
                sd,
                macro,
                ngil,
                len(sizes),
                int(sizes.min()),
                secs,
            )
        )
    mean = np.mean([r.f1 for r in out])
    plan.say(f"{task.target.name}: {method} k={k}: NGIL {ngil:.4f}, mean F1 {mean:.4f}")
    return out


def run(plan: Plan) -> tuple[list[Record], list[dict[str, Any]]]:
    """Every (target, weight vector, k, classifier) of the plan, the raw table at k = 1 and
    Mondrian at each k; also the weight vectors used."""
    with threadpool_limits(1):  # BLAS/OpenMP on one thread: the box's two cores are shared
        return _run(plan)


def _run(plan: Plan) -> tuple[list[Record], list[dict[str, Any]]]:
    df = adult.load(plan.rows)
    records: list[Record] = []
    vectors: list[dict[str, Any]] = []
    for tname in plan.targets:
        target = TARGETS[tname]
        task = _Task(target, df, target_qis(target), labels_of(target, df))
        cols = task.columns
        records += score(task, plan, "raw", "raw", 1, np.arange(len(df)), 0.0)
        t0 = time.perf_counter()
        vecs = weight_vectors(df, target, plan)
        plan.say(f"{tname}: {len(vecs)} weight vectors in {time.perf_counter() - t0:.1f} s")
        for name, family, w in vecs:
            why = target.why.get(name, "")
            vectors.append({"target": tname, "vector": name, "family": family, "why": why, **w})
        for k in plan.ks:
            for name, family, w in vecs:
                t = time.perf_counter()
                res = anonymize(cols, task.qis, k, w)
                records += score(task, plan, name, family, k, res.cluster, time.perf_counter() - t)
            t = time.perf_counter()
            labels = mondrian(cols, task.qis, k)
            records += score(task, plan, "mondrian", "mondrian", k, labels, time.perf_counter() - t)
    return records, vectors


FAMILIES = (("equal", "o-"), ("bias", "s-"), ("iml", "^-"), ("mondrian", "x--"))


def _family_curve(
    recs: Sequence[Record], family: str, value: Callable[[Record], float]
) -> tuple[list[int], list[float], list[float], list[float]]:
    """k, mean, min, max over the family's weight vectors (of the per-vector values)."""
    ks = sorted({r.k for r in recs if r.family == family})
    mean, lo, hi = [], [], []
    for k in ks:
        v = [value(r) for r in recs if r.family == family and r.k == k]
        mean.append(float(np.mean(v)))
        lo.append(float(np.min(v)))
        hi.append(float(np.max(v)))
    return ks, mean, lo, hi


def plot_f1(records: Sequence[Record], plan: Plan, path: Path) -> None:
    plt = report.pyplot()
    rows, cols = len(plan.targets), len(plan.classifiers)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    for i, tname in enumerate(plan.targets):
        for j, cname in enumerate(plan.classifiers):
            ax = axes[i][j]
            recs = [r for r in records if r.target == tname and r.classifier == cname]
            raw = [r.f1 for r in recs if r.family == "raw"][0]
            for family, style in FAMILIES:
                ks, mean, lo, hi = _family_curve(recs, family, lambda r: r.f1)
                if not ks:
                    continue
                (line,) = ax.plot([1, *ks], [raw, *mean], style, label=family, markersize=4)
                if lo != hi:
                    ax.fill_between(ks, lo, hi, alpha=0.12, color=line.get_color())
            ax.axhline(raw, color="grey", lw=0.8, ls=":")
            ax.set_xscale("log")
            ax.set_xticks([1, *plan.ks], ["raw", *map(str, plan.ks)])
            ax.tick_params(axis="x", labelsize=7)
            ax.set_title(f"{tname}: {cname}", fontsize=9)
            ax.grid(True, alpha=0.3)
            if j == 0:
                ax.set_ylabel("F1 (weighted)")
            if i == rows - 1:
                ax.set_xlabel("k")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(
        f"F1 against k on {plan.rows} Adult rows (band: min–max over the family's vectors)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_ngil(records: Sequence[Record], plan: Plan, path: Path) -> None:
    plt = report.pyplot()
    fig, axes = plt.subplots(1, len(plan.targets), figsize=(4.5 * len(plan.targets), 3.6))
    axes = np.atleast_1d(axes)
    for ax, tname in zip(axes, plan.targets, strict=True):
        recs = [r for r in records if r.target == tname and r.classifier == plan.classifiers[0]]
        for family, style in FAMILIES:
            ks, mean, lo, hi = _family_curve(recs, family, lambda r: r.ngil)
            if ks:
                label = "Mondrian" if family == "mondrian" else f"SaNGreeA {family}"
                ax.plot(ks, mean, style, label=label, markersize=4)
        ax.set(xscale="log", xlabel="k", ylabel="NGIL (equal weights)", title=tname)
        ax.set_xticks(list(plan.ks), list(map(str, plan.ks)))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("NGIL against k: SaNGreeA vs Mondrian (lower keeps more)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def tables(
    records: Sequence[Record], vectors: Sequence[Mapping[str, Any]], plan: Plan
) -> list[report.Table]:
    out = []
    for tname in plan.targets:
        recs = [r for r in records if r.target == tname]
        raw = np.mean([r.f1 for r in recs if r.family == "raw"])
        rows: list[list[object]] = [["1 (raw)", f"{raw:.3f}", "", "", "", "0", "0"]]
        for k in plan.ks:
            cells: list[object] = [k]
            for family in ("equal", "bias", "iml", "mondrian"):
                v = [r.f1 for r in recs if r.family == family and r.k == k]
                cells.append(f"{np.mean(v):.3f}" if v else "–")
            for family in ("equal", "mondrian"):
                g = [r.ngil for r in recs if r.family == family and r.k == k]
                cells.append(f"{g[0]:.3f}" if g else "–")
            rows.append(cells)
        out.append(
            report.Table(
                [
                    "k",
                    "F1 equal",
                    "F1 bias",
                    "F1 iML",
                    "F1 Mondrian",
                    "NGIL SaNGreeA equal",
                    "NGIL Mondrian",
                ],
                rows,
                title=f"{tname}: F1 (weighted, mean over the classifiers and the family's vectors)",
            )
        )
    names = [q.name for q in adult.quasi_identifiers()]
    out.append(
        report.Table(
            ["target", "vector", *names],
            [
                [v["target"], v["vector"], *[f"{v[n]:.2f}" if n in v else "–" for n in names]]
                for v in vectors
            ],
            title="Weight vectors (mean 1; – = the target's own column, not a QI)",
        )
    )
    return out


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def parse(argv: list[str]) -> argparse.Namespace:
    assert __doc__ is not None
    p = argparse.ArgumentParser(
        prog="selectivity bench anonymization utility", description=__doc__.split("\n")[0]
    )
    p.add_argument("--rows", type=int, default=3000)
    p.add_argument("--ks", default=",".join(map(str, K_VALUES)))
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--folds", type=int, default=3)
    p.add_argument("--answers", type=int, default=50, help="questions per simulated iML user")
    p.add_argument(
        "--quick", action="store_true", help="600 rows, k 5,50, 3 folds, 1 bias, 1 iML user"
    )
    p.add_argument("--out", type=Path, default=report.PLOTS)
    p.add_argument(
        "--replot",
        action="store_true",
        help="redraw the plots and the section from the CSVs in --out (no new run)",
    )
    return p.parse_args(argv)


def read_csvs(out: Path) -> tuple[list[Record], list[dict[str, Any]]]:
    """The records and weight vectors of an earlier run, from its two CSVs."""
    types = {f: Record.__dataclass_fields__[f].type for f in Record.__dataclass_fields__}
    cast = {"int": int, "float": float, "str": str}
    with (out / "anonymization_utility.csv").open() as f:
        records = [
            Record(**{k: cast[str(types[k])](v) for k, v in row.items()})
            for row in csv.DictReader(f)
        ]
    with (out / "anonymization_utility_weights.csv").open() as f:
        vectors: list[dict[str, Any]] = [
            {
                k: (float(v) if v and k not in ("target", "vector", "family", "why") else v)
                for k, v in row.items()
                if v != ""
            }
            for row in csv.DictReader(f)
        ]
    return records, vectors


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    opt = parse(args)
    if not adult.available():
        sys.exit(f"Adult is not at {adult.DATA}")
    clock = report.Clock()
    plan = Plan(
        rows=opt.rows,
        ks=tuple(int(k) for k in opt.ks.split(",")),
        targets=tuple(t for t in opt.targets.split(",") if t),
        folds=opt.folds,
        answers=opt.answers,
        say=clock,
    )
    if opt.quick:
        plan.rows, plan.ks, plan.folds, plan.bias, plan.iml_users = 600, (5, 50), 3, 1, 1
        plan.answers = min(plan.answers, 10)
    unknown = set(plan.targets) - set(TARGETS)
    if unknown:
        sys.exit(f"--targets: unknown {sorted(unknown)}; known {list(TARGETS)}")
    if opt.replot:
        records, vectors = read_csvs(opt.out)
        plan.rows = next(r.clusters for r in records if r.family == "raw")  # raw: n clusters
        plan.ks = tuple(sorted({r.k for r in records if r.family != "raw"}))
        plan.targets = tuple(dict.fromkeys(r.target for r in records))
        plan.classifiers = tuple(dict.fromkeys(r.classifier for r in records))
    else:
        records, vectors = run(plan)
        opt.out.mkdir(parents=True, exist_ok=True)
        write_csv(opt.out / "anonymization_utility.csv", [asdict(r) for r in records])
        write_csv(opt.out / "anonymization_utility_weights.csv", vectors)
    f1_png = report.plot_path("anonymization_utility_f1", opt.out)
    ngil_png = report.plot_path("anonymization_utility_ngil", opt.out)
    plot_f1(records, plan, f1_png)
    plot_ngil(records, plan, ngil_png)
    parts: list[report.Table | report.Plot] = [
        *tables(records, vectors, plan),
        report.Plot("F1 against k per target and classifier", f1_png),
        report.Plot("NGIL against k, SaNGreeA vs Mondrian", ngil_png),
    ]
    command = " ".join(["python -m bench anonymization utility", *args])
    print(
        report.section(
            f"Anonymization utility: F1 against k on {plan.rows} Adult rows", parts, command=command
        )
    )


if __name__ == "__main__":
    main()

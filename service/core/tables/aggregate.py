"""The count-period aggregate of one epoch: the sum of the count period's window tables
(sketches are linear), what featurization reads."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import orjson

from service.core.tables import cells as cell_codec

CHUNK_BYTES = 1 << 21  # 2 MiB of int32 cells per hash field (a multiple of 4)


def chunk_field(token: str, i: int) -> str:
    return f"c:{token}:{i}"


@dataclass
class Aggregate:
    """Sum of the count period's tables for one epoch: one flat int64 array in memory, the
    tables in ``layout`` order and then the prior table's L cells. Stored like the window
    tables, as big-endian int32 (half the bytes of int64 for every roll and every API process
    that loads it); a sum beyond the int32 range saturates, as window cells do (BITFIELD SAT)."""

    epoch: int
    lo: int
    hi: int
    windows: list[int]  # the windows actually summed (those of [lo, hi] that exist)
    layout: list[tuple[int, int]]  # (table id, number of cells), in storage order
    cells: np.ndarray  # flat int64

    @property
    def n_windows(self) -> int:
        return len(self.windows)

    @cached_property
    def tables(self) -> dict[int, np.ndarray]:
        """Table id → its flat cells (views into ``cells``)."""
        out: dict[int, np.ndarray] = {}
        pos = 0
        for tid, size in self.layout:
            out[tid] = self.cells[pos : pos + size]
            pos += size
        return out

    @property
    def prior(self) -> np.ndarray:
        return self.cells[sum(size for _, size in self.layout) :]

    def aligned(self, layout: list[tuple[int, int]], n_labels: int) -> np.ndarray:
        """A copy of the cells laid out as ``layout`` (tables it lacks are zeros)."""
        if layout == self.layout:
            return self.cells.copy()
        mine = self.tables
        parts = [mine.get(tid, np.zeros(size, np.int64)) for tid, size in layout]
        prior = self.prior if self.prior.size == n_labels else np.zeros(n_labels, np.int64)
        return np.concatenate([*parts, prior])

    def to_redis(self, token: str = "0") -> dict[str, bytes]:
        """The hash fields to store: ``meta`` and the cells in pieces of at most
        ``CHUNK_BYTES`` (``c:<token>:<i>``), so that no single Redis command moves the whole
        aggregate (Redis serves nobody else during a command: ~10 ms for 32 MB at 100
        tables); ``token`` names this version, so that a reader can tell a piece of another
        version from a missing one."""
        raw = cell_codec.encode(self.cells)
        n = max(1, -(-len(raw) // CHUNK_BYTES))
        meta = {
            "epoch": self.epoch,
            "lo": self.lo,
            "hi": self.hi,
            "windows": self.windows,
            "tables": [list(x) for x in self.layout],
            "token": token,
            "chunks": n,
        }
        out = {"meta": orjson.dumps(meta)}
        for i in range(n):
            out[chunk_field(token, i)] = raw[i * CHUNK_BYTES : (i + 1) * CHUNK_BYTES]
        return out

    @staticmethod
    def chunks_of(meta: bytes) -> list[str]:
        """The fields holding the cells, in order, from the stored metadata alone."""
        m = orjson.loads(meta)
        if "token" not in m:  # stored whole, before issue 17
            return ["cells"]
        return [chunk_field(m["token"], i) for i in range(int(m["chunks"]))]

    @staticmethod
    def span_of(meta: bytes) -> tuple[int, int]:
        """``(lo, hi)`` from the stored metadata alone."""
        m = orjson.loads(meta)
        return int(m["lo"]), int(m["hi"])

    @classmethod
    def from_redis(cls, data: dict[bytes, bytes]) -> Aggregate:
        """From the stored fields (``to_redis``); KeyError if a piece is missing."""
        meta = orjson.loads(data[b"meta"])
        raw = b"".join(data[f.encode()] for f in cls.chunks_of(data[b"meta"]))
        cells = cell_codec.decode(raw)
        layout = [(int(t), int(n)) for t, n in meta["tables"]]
        return cls(meta["epoch"], meta["lo"], meta["hi"], meta["windows"], layout, cells)

"""The count-period aggregate of one epoch: the sum of the count period's window tables
(sketches are linear), what featurization reads."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import orjson

from service.core import cells as cell_codec


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

    def to_redis(self) -> dict[str, bytes]:
        meta = {
            "epoch": self.epoch,
            "lo": self.lo,
            "hi": self.hi,
            "windows": self.windows,
            "tables": [list(x) for x in self.layout],
        }
        return {"meta": orjson.dumps(meta), "cells": cell_codec.encode(self.cells)}

    @staticmethod
    def span_of(meta: bytes) -> tuple[int, int]:
        """``(lo, hi)`` from the stored metadata alone."""
        m = orjson.loads(meta)
        return int(m["lo"]), int(m["hi"])

    @classmethod
    def from_redis(cls, data: dict[bytes, bytes]) -> Aggregate:
        meta = orjson.loads(data[b"meta"])
        cells = cell_codec.decode(data[b"cells"])
        layout = [(int(t), int(n)) for t, n in meta["tables"]]
        return cls(meta["epoch"], meta["lo"], meta["hi"], meta["windows"], layout, cells)

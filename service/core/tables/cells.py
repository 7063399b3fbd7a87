"""The one encoding of count cells outside process memory: big-endian int32 (``'>i4'``), read
with one ``GET`` into ``np.frombuffer``. Redis ``BITFIELD ... OVERFLOW SAT INCRBY i32``
updates the same bytes in place and saturates at the int32 range; everything written from
numpy saturates the same way (``saturate``), so a cell never wraps around."""

from __future__ import annotations

import numpy as np

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
DTYPE = ">i4"


def saturate(cells: np.ndarray) -> np.ndarray:
    """``cells`` clipped to the int32 range (a copy only when a value is out of range)."""
    if cells.size and (cells.max() > INT32_MAX or cells.min() < INT32_MIN):
        return np.clip(cells, INT32_MIN, INT32_MAX)
    return cells


def encode(cells: np.ndarray) -> bytes:
    """Integer cells as stored: big-endian int32, saturated as BITFIELD SAT saturates."""
    return np.asarray(saturate(np.asarray(cells)), dtype=DTYPE).tobytes()


def decode(data: bytes) -> np.ndarray:
    """Stored cells as int64 (room to sum windows without overflow)."""
    return np.frombuffer(data, dtype=DTYPE).astype(np.int64)


def zeros(n: int) -> bytes:
    """``n`` cells of 0, as stored."""
    return bytes(4 * n)

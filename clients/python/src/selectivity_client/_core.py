"""What the sync and async clients share and that does no I/O: turning rows and DataFrames into
request bodies, batching with derived idempotency keys, the retry policy, the SSE parser, and
turning answers into tables."""

from __future__ import annotations

import datetime as dt
import json
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

try:  # optional: pandas in, pandas out
    import pandas as pd
except ImportError:  # pragma: no cover - exercised where pandas is absent
    pd = None

EPOCH_KEY = b"selectivity.epoch"
OBSERVATION_FIELDS = ("id", "label", "event_time")
DEFAULT_BATCH = 10_000  # the service's default SELECTIVITY_MAX_BATCH
MAX_KEY = 200  # the service's Idempotency-Key limit
RETRY_STATUSES = frozenset({503})


@dataclass(frozen=True)
class Event:
    """One server-sent event: ``roll`` or ``retrain_required`` (``data`` is its JSON)."""

    id: int
    event: str
    data: Any


@dataclass
class IngestResult:
    """What ``ingest`` did: rows accepted, the windows they landed in, the batches sent and how
    many of them the service answered as replays (sent before under the same key)."""

    accepted: int = 0
    windows: list[int] = field(default_factory=list)
    batches: int = 0
    replayed: int = 0
    idempotency_key: str = ""


def backoff_delay(attempt: int, base: float, retry_after: str | None = None) -> float:
    """Seconds before retry ``attempt`` (0-based): ``Retry-After`` when the service sent one,
    else full-jitter exponential backoff ``uniform(0, base * 2**attempt)`` capped at 30 s."""
    if retry_after is not None:
        try:
            return min(max(float(retry_after), 0.0), 60.0)
        except ValueError:
            pass
    return random.uniform(0, min(30.0, base * 2**attempt))


def _scalar(v: Any) -> Any:
    """A JSON scalar for a feature value: numpy/pandas scalars unwrapped, NaN and NA as None,
    timestamps as ISO 8601."""
    if v is None or isinstance(v, str | bool | int):
        return v
    if isinstance(v, float):
        return None if math.isnan(v) else v
    if isinstance(v, dt.datetime | dt.date):
        return v.isoformat()
    if pd is not None and v is pd.NA:
        return None
    item = getattr(v, "item", None)  # numpy scalars
    if callable(item):
        return _scalar(item())
    if pd is not None and isinstance(v, pd.Timestamp):
        return v.isoformat()
    return v


def records(rows: Any) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts: from a pandas DataFrame, a pyarrow Table, or dicts."""
    if pd is not None and isinstance(rows, pd.DataFrame):
        raw = rows.to_dict(orient="records")
    elif isinstance(rows, pa.Table | pa.RecordBatch):
        raw = rows.to_pylist()
    elif isinstance(rows, Mapping):
        raise TypeError("rows: expected a sequence of dicts or a DataFrame, not one dict")
    else:
        raw = list(rows)
    out = []
    for i, r in enumerate(raw):
        if not isinstance(r, Mapping):
            raise TypeError(f"rows[{i}]: expected a dict, got {type(r).__name__}")
        out.append({str(k): _scalar(v) for k, v in r.items()})
    return out


def observations(rows: Any, *, label: str = "label") -> list[dict[str, Any]]:
    """Ingest bodies' observations. A row is either already an observation (it has
    ``features``) or flat: its ``label`` column is the label, ``id`` and ``event_time`` are
    taken when present, every other column is a feature."""
    out = []
    for i, r in enumerate(records(rows)):
        if isinstance(r.get("features"), Mapping):
            out.append(r)
            continue
        if r.get(label) is None:
            raise ValueError(f"rows[{i}]: no {label!r} column")
        obs: dict[str, Any] = {
            "features": {k: v for k, v in r.items() if k != label and k not in OBSERVATION_FIELDS},
            "label": str(r[label]),
        }
        for k in ("id", "event_time"):
            if r.get(k) is not None:
                obs[k] = str(r[k])
        out.append(obs)
    return out


def batches(n: int, size: int) -> Iterator[tuple[int, int]]:
    if size < 1:
        raise ValueError(f"batch_size must be >= 1, got {size}")
    for start in range(0, n, size):
        yield start, min(n, start + size)


def batch_key(key: str, start: int, end: int) -> str:
    """The Idempotency-Key of rows ``[start, end)`` of a call made with ``key``: the same rows
    in the same batches get the same keys, so repeating the whole call is safe too."""
    return f"{key}:{start}-{end}"


def check_key(key: str) -> str:
    if not key or len(key) > MAX_KEY - 24:
        raise ValueError(f"idempotency_key: 1 to {MAX_KEY - 24} characters, got {len(key)}")
    return key


def features_table(payloads: Sequence[Mapping[str, Any]]) -> pa.Table:
    """The featurize answers (in order) as one table, float64 columns but for those holding
    strings (the raw values of categorical features passed through: string columns, as in
    the train set; one whose values are all missing reads as float64 nulls); epoch in its
    schema metadata."""
    columns = list(payloads[0]["columns"])
    rows = [row for p in payloads for row in p["rows"]]
    values = [[r[j] for r in rows] for j in range(len(columns))]
    types = [
        pa.string() if any(isinstance(v, str) for v in col) else pa.float64() for col in values
    ]
    arrays = [pa.array(col, type=t) for col, t in zip(values, types, strict=True)]
    schema = pa.schema(
        [pa.field(c, t) for c, t in zip(columns, types, strict=True)],
        metadata={EPOCH_KEY: str(payloads[0]["epoch"]).encode()},
    )
    return pa.Table.from_arrays(arrays, schema=schema)


def output(table: pa.Table, fmt: str | None) -> Any:
    """``fmt`` "pandas" (the default when pandas is installed: a DataFrame with the epoch in
    ``attrs["selectivity_epoch"]``), "arrow" (a pyarrow Table) or "records" (list of dicts)."""
    fmt = fmt or ("pandas" if pd is not None else "arrow")
    if fmt == "arrow":
        return table
    if fmt == "records":
        return table.to_pylist()
    if fmt == "pandas":
        if pd is None:
            raise ImportError(
                "output='pandas' needs pandas: pip install 'selectivity-client[pandas]'"
            )
        df = table.to_pandas()
        df.attrs["selectivity_epoch"] = epoch_of(table)
        return df
    raise ValueError(f"output: 'pandas', 'arrow' or 'records', got {fmt!r}")


def epoch_of(data: Any) -> int | None:
    """The epoch a featurize result or a train set was computed at."""
    if isinstance(data, pa.Table):
        meta = data.schema.metadata or {}
        return int(meta[EPOCH_KEY]) if EPOCH_KEY in meta else None
    attrs = getattr(data, "attrs", None)
    if isinstance(attrs, Mapping) and "selectivity_epoch" in attrs:
        return int(attrs["selectivity_epoch"])
    return None


def with_epoch(table: pa.Table, epoch: str | None) -> pa.Table:
    if epoch is None:
        return table
    meta = dict(table.schema.metadata or {})
    meta[EPOCH_KEY] = epoch.encode()
    return table.replace_schema_metadata(meta)


class SSEParser:
    """The server-sent events wire format (WHATWG HTML, "Parsing an event stream"): fed lines,
    gives complete events; comments (keep-alives) and unknown fields are skipped."""

    def __init__(self) -> None:
        self._id: str | None = None
        self._event = ""
        self._data: list[str] = []

    def feed(self, line: str) -> Event | None:
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        return None

    def _dispatch(self) -> Event | None:
        data, event, eid = self._data, self._event, self._id
        self._data, self._event = [], ""
        if not data:
            return None
        text = "\n".join(data)
        try:
            parsed: Any = json.loads(text)
        except ValueError:
            parsed = text
        return Event(
            id=int(eid) if eid and eid.isdigit() else 0, event=event or "message", data=parsed
        )


def add_ingest(result: IngestResult, body: Mapping[str, Any], replayed: str | None) -> None:
    result.accepted += int(body["accepted"])
    if body["window"] not in result.windows:
        result.windows.append(int(body["window"]))
    result.batches += 1
    result.replayed += replayed == "true"

"""A stream as the hot paths need it: specs, hash seed, tables, noise parameters (the noise
and its derivation: ``service.core.dp.budget``)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from service.core.dp.budget import Noise, noise_for
from service.core.features.columns import FeatureSpec, canonical_value
from service.core.streamconfig import StreamCreate
from service.core.tables.sketch import SketchSpec


@dataclass(frozen=True)
class TableRef:
    id: int
    name: str
    features: tuple[str, ...]
    first_epoch: int
    reason: str = "feature"


@dataclass(frozen=True)
class StreamRuntime:
    id: int
    name: str
    config: StreamCreate
    hash_seed: bytes
    tables: tuple[TableRef, ...]
    features: tuple[FeatureSpec, ...] = field(init=False)
    spec: SketchSpec = field(init=False)
    noise: Noise = field(init=False)
    label_index: dict[str, int] = field(init=False)
    passthrough: tuple[str, ...] = field(init=False)  # numeric: float '<f>:value' columns
    # categorical features passed through: their raw values as string '<f>:value' columns
    passthrough_categorical: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.config
        set_ = object.__setattr__
        set_(
            self,
            "features",
            tuple(
                FeatureSpec(f.name, f.kind, tuple(f.buckets or ()), f.passthrough)
                for f in cfg.features
            ),
        )
        set_(
            self,
            "spec",
            SketchSpec(width=cfg.sketch.width, depth=cfg.sketch.depth, n_labels=len(cfg.labels)),
        )
        set_(self, "noise", noise_for(cfg))
        set_(self, "label_index", {lab: i for i, lab in enumerate(cfg.labels)})
        set_(
            self,
            "passthrough",
            tuple(f.name for f in cfg.features if f.passthrough and f.kind == "numeric"),
        )
        set_(
            self,
            "passthrough_categorical",
            tuple(f.name for f in cfg.features if f.passthrough and f.kind != "numeric"),
        )

    def weight_of(self, table: TableRef) -> float:
        """The table's share of the budget, relative (``privacy.table_weights``; a selected
        group's is 1)."""
        if table.reason != "feature":
            return 1.0
        return self.config.privacy.table_weights.get(table.name, 1.0)

    @property
    def parts(self) -> int:
        """How many parts each window is split into (``StreamCreate.partitions``)."""
        return self.config.partitions

    def parts_of(
        self, features: Sequence[Mapping[str, object]], rows: Sequence[bytes]
    ) -> list[int]:
        """Each row's part of the window: a keyed hash (BLAKE2b with the stream's hash seed) of
        the canonical value of its user key (``privacy.user_key``; the per-user counters that
        bound a user's contribution are per part, and every observation of one user goes to
        the same part, so the bound holds per window exactly), else of the row as stored
        (``rows``: deterministic, so a retried batch splits as its first attempt did). All 0
        with one part."""
        n = self.parts
        if n == 1:
            return [0] * len(rows)
        user_key = self.config.privacy.user_key
        seed = self.hash_seed[:64]
        if user_key is None:
            keys: Sequence[bytes] = rows
        else:
            spec = next(f for f in self.features if f.name == user_key)
            keys = [canonical_value(f.get(user_key), spec) for f in features]
        return [
            int.from_bytes(
                hashlib.blake2b(k, key=seed, person=b"selectivity-prt", digest_size=8).digest(),
                "little",
            )
            % n
            for k in keys
        ]

    @property
    def prior_weight(self) -> float:
        return self.config.privacy.prior_weight

    @property
    def labels(self) -> list[str]:
        return self.config.labels

    @property
    def feature_names(self) -> set[str]:
        return {f.name for f in self.features}

    def counted_at(self, epoch: int) -> StreamRuntime:
        """The runtime as featurization at ``epoch`` sees it: only tables with a window in the
        count period (a selected group joins once its first window is counted; the per-feature
        tables are always there, all zeros before any window is counted). Memoised, and
        ``self`` when every table qualifies, so callers can cache by identity."""
        hi = self.count_period(epoch)[1]
        visible = tuple(t for t in self.tables if t.reason == "feature" or t.first_epoch <= hi)
        if len(visible) == len(self.tables):
            return self
        memo: dict[int, StreamRuntime] = self.__dict__.setdefault("_counted", {})
        if hi not in memo:
            memo[hi] = replace(self, tables=visible)
        return memo[hi]

    def count_period(self, epoch: int) -> tuple[int, int]:
        """Windows [lo, hi] summed for featurization when ``epoch`` is the open window:
        the ``retention_windows`` windows before the hot period
        (docs/ARCHITECTURE.md, "Streams, windows and periods")."""
        hi = epoch - self.config.hot_windows
        return hi - self.config.retention_windows + 1, hi

    def hot_period(self, epoch: int) -> tuple[int, int]:
        return epoch - self.config.hot_windows + 1, epoch

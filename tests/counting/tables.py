"""What a window's tables must hold for given rows, computed in memory (no Redis): the
reference the counting tests compare Redis with."""

from __future__ import annotations

from typing import Any

import numpy as np

from service.core.features import counting as counting_math
from service.core.tables import cells as cell_codec
from service.ingest import service as ingest_service
from service.ingest.schemas import IngestIn
from service.streams import service as streams
from tests.conftest import Api


async def expected_tables(
    api: Api, name: str, rows: list[dict[str, Any]], bound: int | None = None
) -> np.ndarray:
    """The exact tables of window 1 for ``rows`` (with a user key, the first ``bound`` of each
    user's, in arrival order; the stream's bound when None), computed in memory as one part
    would count them: the prior table last."""
    rt = await streams.runtime(ctx=api.ctx, name=name)
    raw = ingest_service.batch_rows(IngestIn.model_validate({"observations": rows}))
    parsed, _ = counting_math.parse_rows(rt, b",".join(raw), after=b"", last=b"")
    kept = parsed
    if parsed.users is not None:
        c = rt.config.privacy.max_contributions_per_window if bound is None else bound
        seen = np.zeros(len(parsed.user_ids), np.int64)
        kept = parsed.only(counting_math.within_bound(parsed.users, seen, c)[0])
    tables = counting_math.tables_of(rt, 1)
    inc = counting_math.count_increments(rt, tables, kept.encoded, kept.labels)
    zeros = np.zeros(rt.spec.cells, np.int64)
    flat = [
        cell_codec.decode(inc.added_to(i, cell_codec.encode(zeros))) for i in range(len(tables))
    ]
    prior = np.bincount(kept.labels, minlength=rt.spec.n_labels)
    return np.concatenate([*flat, prior])

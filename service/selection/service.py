"""Count-table selection on each roll (DESIGN §5), with the pure core in
``service.core.selection``: the hot period's closed windows are read, candidate groups scored by
empirical mutual-information gain, up to ``groups_per_round`` picked by the exponential
mechanism under ``epsilon_selection``, and each pick gets a table.

A group picked at the roll to epoch t is counted from window t + 2 on: window t + 1 may already
be prepared (noise-initialised ahead of time) without it, and a prepared window's table set is
fixed. Featurization includes the group's columns once it has a window in the count period.
The exact gains are computed on raw hot data and are not private: only the picks and their
order are released (``count_table.score`` stays empty)."""

from __future__ import annotations

import logging

import numpy as np
import orjson
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import AppContext
from service.core.featurize import row_keys, table_name
from service.core.selection import Candidate, select_round
from service.db.models import CountTable, StreamEvent
from service.models import repository as events_repo
from service.streams import repository
from service.streams import service as streams
from service.streams.runtime import StreamRuntime
from service.windows.service import store_of

log = logging.getLogger("selectivity.selection")
READ_CHUNK = 5000


async def _hot_matrix(
    ctx: AppContext, rt: StreamRuntime, epoch: int
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Integer codes of every feature and the label indices of the hot period that just ended
    (windows epoch − H … epoch − 1, all closed now): an observation is read by H rounds."""
    store = store_of(ctx)
    feats: list[dict] = []
    labels: list[int] = []
    for w in range(max(epoch - rt.config.hot_windows, 1), epoch):
        last = await store.hot_last_id(rt.name, w)
        start: bytes | str = "-"
        while last is not None:
            entries = await store.hot_range(rt.name, w, start, last, READ_CHUNK)
            if not entries:
                break
            for _, fields in entries:
                rec = orjson.loads(fields[b"d"])
                feats.append(rec["f"])
                labels.append(rt.label_index[rec["y"]])
            if entries[-1][0] == last:
                break
            start = b"(" + entries[-1][0]
    values = row_keys(feats, rt.features)
    columns = (
        {
            name: np.unique(np.array(col, dtype=object), return_inverse=True)[1].astype(np.int64)
            for name, col in values.items()
        }
        if feats
        else {}
    )
    return columns, np.array(labels, np.int64)


def _round(
    columns: dict[str, np.ndarray],
    labels: np.ndarray,
    n_labels: int,
    tables: list[tuple[str, ...]],
    max_tables: int,
    k: int,
    epsilon: float,
) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """The round itself (process pool); returns (group, base) pairs only — never the gains."""
    picks: list[Candidate] = select_round(
        columns=columns,
        labels=labels,
        n_labels=n_labels,
        tables=tables,
        max_tables=max_tables,
        groups_per_round=k,
        epsilon=epsilon,
    )
    return [(c.group, c.base) for c in picks]


async def select_tables(*, ctx: AppContext, name: str, epoch: int) -> list[str]:
    """The selection round of the roll to ``epoch`` (once: a round that already added tables
    with ``first_epoch == epoch + 2`` is not repeated)."""
    rt = await streams.runtime(ctx=ctx, name=name)
    cfg = rt.config
    eps = cfg.privacy.epsilon_selection
    assert cfg.max_tables is not None
    if eps <= 0 or len(rt.tables) + 1 >= cfg.max_tables:
        return []
    first_epoch = epoch + 2
    if any(t.first_epoch == first_epoch and t.reason == "selected" for t in rt.tables):
        return []
    columns, labels = await _hot_matrix(ctx, rt, epoch)
    if len(labels) < 2:
        return []
    groups = [tuple(sorted(t.features)) for t in rt.tables]
    picks = await ctx.run_cpu(
        _round,
        columns,
        labels,
        len(rt.labels),
        groups,
        cfg.max_tables,
        cfg.privacy.groups_per_round,
        eps,
    )
    if not picks:
        return []
    names = [table_name(group) for group, _ in picks]
    async with ctx.sessionmaker() as session, session.begin():
        stream = await repository.get_by_name(session, name, for_update=True)
        assert stream is not None
        existing = {t.name for t in await repository.tables_of(session, stream.id)}
        for rank, (group, base) in enumerate(picks, start=1):
            tname = table_name(group)
            if tname in existing:
                continue
            session.add(
                CountTable(
                    stream_id=stream.id,
                    name=tname,
                    features=list(group),
                    first_epoch=first_epoch,
                    reason="selected",
                    selected_epoch=epoch,
                    selection_rank=rank,
                    selection_epsilon=eps,
                    extends=table_name(base),
                )
            )
        await events_repo.add_event(
            session,
            StreamEvent(
                stream_id=stream.id,
                kind="tables_selected",
                data={
                    "stream": name,
                    "epoch": epoch,
                    "tables": names,
                    "first_epoch": first_epoch,
                    "epsilon_selection": eps,
                },
            ),
        )
    streams.forget_runtime(ctx, name)
    log.info("stream %s: selected %s from window %d on", name, names, first_epoch)
    return names


async def list_tables(*, session: AsyncSession, name: str) -> list[CountTable]:
    stream = await streams.get(session=session, name=name)
    return list(await repository.tables_of(session, stream.id))

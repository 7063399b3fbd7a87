"""Count-table selection on each roll (docs/ARCHITECTURE.md, "Count-table selection"), with
the pure core in
``service.core.dp.selection``: the hot period's closed windows are read, candidate groups scored by
empirical mutual-information gain (by default less Akaike's penalty: ``privacy.selection_score``),
up to ``groups_per_round`` picked by the exponential
mechanism under ``epsilon_selection``, and each pick gets a table. The mechanism has one more
outcome, ⊥ ("add no table", public, at the threshold ``privacy.selection_threshold``), which
ends the round's picks; rounds run on a public schedule (the rolls to epochs 2 … Q + 1,
Q = ``privacy.selection_rounds``), so the ledger's Q bounds them whatever they pick.

A group picked at the roll to epoch t is counted from window t + 2 on: window t + 1 may already
be prepared (noise-initialised ahead of time) without it, and a prepared window's table set is
fixed. Featurization includes the group's columns once it has a window in the count period.

Counting a pick from the windows the round read (e − H … e − 1, whose raw rows are still held)
instead would not change any window's guarantee: while selection is on, every window's budget
split keeps the free slots in W (``service.core.dp.budget``: ε_s = ε·w_s/W, Σ over all T =
``max_tables`` slots is ε whether a slot is filled or not), so a group counted in window w with
fresh noise at a free slot's scale leaves w with at most T tables, ε-DP together (basic
composition; adaptive, the group being the output of the round, which the ledger charges on its
own: ``service.core.dp.accounting``), and the ledger's per-window figures unchanged. It is not
done: a window's table set is fixed once it is prepared, and counting is exactly-once against
one checkpoint per window for that set (``service.counting``), so a table joining a window
already (partly) counted needs a checkpoint of its own, a cap of T tables per window checked
where it is added, and its noise drawn once per window. Measured on ACS employment, where no
pair pays, the earlier start gains nothing (BENCHMARKS.md, "DP count-table selection (ACS
employment)").

The exact gains are computed on raw hot data and are not private: only the picks and their
order are released (``count_table.score`` stays empty)."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import orjson
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import AppContext
from service.core.dp.selection import Candidate, candidate_groups, select_round
from service.core.features.columns import FeatureSpec, row_keys, table_name
from service.core.features.counting import within_bound
from service.core.features.runtime import StreamRuntime
from service.core.streamconfig import StreamCreate
from service.db.models import CountTable, StreamEvent
from service.models import repository as events_repo
from service.selection import repository
from service.streams import repository as streams_repo
from service.streams import service as streams
from service.streams.lock import stream_lock

log = logging.getLogger("selectivity.selection")
READ_CHUNK = 5000
EARLIER_ROUND_WAIT_SECONDS = 540.0  # under the follow-up job's timeout (600 s)
EARLIER_ROUND_POLL_SECONDS = 0.2


def _counted(rows: list[dict], spec: FeatureSpec, bound: int) -> np.ndarray:
    """Mask of one window's rows (in arrival order) that the counter counts: the first
    ``bound`` of each user's (``service.core.features.counting.within_bound``, on the user key's
    canonical value as the counter groups it)."""
    keys = row_keys(rows, [spec])[spec.name]
    if not keys:
        return np.zeros(0, dtype=bool)
    users = np.unique(np.array(keys, dtype=object), return_inverse=True)[1].astype(np.int64)
    mask, _ = within_bound(users.reshape(-1), np.zeros(int(users.max()) + 1, np.int64), bound)
    return mask


async def _hot_matrix(
    ctx: AppContext, rt: StreamRuntime, epoch: int
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Integer codes of every feature and the label indices of the hot period that just ended
    (windows epoch − H … epoch − 1, all closed now): an observation is read by H rounds.

    Only the rows the counter counts are read: with a user key, the first
    ``max_contributions_per_window`` of each user's in each window, in arrival order (the
    counter's rule, ``within_bound``), so a user is at most c·H of a round's records (the group
    size the ledger charges per round). Every feature has a column, empty when no row is."""
    store = ctx.stores.windows
    privacy = rt.config.privacy
    user_spec = next((f for f in rt.features if f.name == privacy.user_key), None)
    feats: list[dict] = []
    labels: list[int] = []
    for w in range(max(epoch - rt.config.hot_windows, 1), epoch):
        window_feats: list[dict] = []
        window_labels: list[int] = []
        for p in range(rt.parts):  # a user's rows are all in one part, in arrival order
            last = await store.hot_last_id(rt.name, w, p)
            start: bytes | str = "-"
            while last is not None:
                entries = await store.hot_range(rt.name, w, start, last, READ_CHUNK, p)
                if not entries:
                    break
                for _, fields in entries:
                    rec = orjson.loads(fields[b"d"])
                    window_feats.append(rec["f"])
                    window_labels.append(rt.label_index[rec["y"]])
                if entries[-1][0] == last:
                    break
                start = b"(" + entries[-1][0]
        if user_spec is not None:
            keep = _counted(window_feats, user_spec, privacy.max_contributions_per_window)
            window_feats = [f for f, k in zip(window_feats, keep.tolist(), strict=True) if k]
            window_labels = [y for y, k in zip(window_labels, keep.tolist(), strict=True) if k]
        feats.extend(window_feats)
        labels.extend(window_labels)
    values = row_keys(feats, rt.features)
    columns = {
        name: np.unique(np.array(col, dtype=object), return_inverse=True)[1]
        .reshape(-1)
        .astype(np.int64)
        if col
        else np.zeros(0, np.int64)
        for name, col in values.items()
    }
    return columns, np.array(labels, np.int64)


def _round(
    columns: dict[str, np.ndarray],
    labels: np.ndarray,
    n_labels: int,
    tables: list[tuple[str, ...]],
    max_tables: int,
    k: int,
    epsilon: float,
    min_records: int,
    score: str,
    threshold: float | None,
    margin: float,
    attributes: dict[str, str],
) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """The round itself (process pool); returns (group, base) pairs only — never the gains;
    ``[]`` is the outcome ⊥."""
    picks: list[Candidate] = select_round(
        columns=columns,
        labels=labels,
        n_labels=n_labels,
        tables=tables,
        max_tables=max_tables,
        groups_per_round=k,
        epsilon=epsilon,
        min_records=min_records,
        score=score,
        threshold=threshold,
        margin=margin,
        attributes=attributes,
    )
    return [(c.group, c.base) for c in picks]


async def _wait_for_earlier_rounds(
    ctx: AppContext, stream_id: int, epoch: int, *, max_tables: int, max_attempts: int
) -> None:
    """Rounds commit in epoch order: the round of ``epoch`` reads the stream's tables only
    once the round of ``epoch − 1`` can no longer commit (recorded, done, given up, or no slot
    free). Otherwise which table set a round scored against, and so its candidates, would
    depend on how long the earlier round took to read and score its hot period: on n."""
    deadline = asyncio.get_running_loop().time() + EARLIER_ROUND_WAIT_SECONDS
    while epoch - 1 >= 2:
        async with ctx.sessionmaker() as session:
            tables = await streams_repo.tables_of(session, stream_id)
            if len(list(tables)) + 1 >= max_tables or not await repository.round_pending(
                session, stream_id, epoch - 1, max_attempts=max_attempts
            ):
                return
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"the round of epoch {epoch - 1} has not committed yet")
        await asyncio.sleep(EARLIER_ROUND_POLL_SECONDS)


async def select_tables(
    *, ctx: AppContext, name: str, epoch: int, max_attempts: int = 5
) -> dict[str, object]:
    """The selection round of the roll to ``epoch`` (the ``selection_round`` follow-up).

    Idempotent and safe under any interleaving with rolls and other rounds: the hot rows are
    read and scored without a lock, then the outcome is committed under the stream's lock
    (``stream_lock``, which rolls hold too), in a transaction that re-reads the stream and its
    tables: the picks as tables and a ``tables_selected`` event, or ⊥ as a
    ``nothing_selected`` event. Nothing of what is committed depends on how long the round
    took (a function of the hot period's size): the event and the tables carry the time of
    the roll to ``epoch``, not of the commit; a round that finishes after later rolls still
    commits, its tables starting two windows after the stream's epoch then (the windows before
    may be prepared, with a fixed table set); rounds commit in epoch order
    (:func:`_wait_for_earlier_rounds`), and a round that finds the tables changed since it
    scored scores again against them (the discarded draw was never released, and the reason to
    discard it is public). A round of ``epoch`` that has committed already (either event) is
    not drawn again, and never more tables than the free slots of ``max_tables`` it finds are
    added. Returns what it did, for the follow-up's record (never the gains).

    Privacy (docs/ARCHITECTURE.md, "Privacy ledger"): the round is calibrated to the public
    ``min_records``, never to the hot period's size, and no outcome depends on that size (no
    round is skipped for few rows): the only data-dependent output is the picks, or ⊥. A
    round runs only at the rolls to epochs 2 … Q + 1 (Q = ``privacy.selection_rounds``), one
    per epoch, so a stream releases at most Q rounds: what the ledger charges, whether they
    pick tables or ⊥. Every reason to release nothing (no budget, past the schedule, no free
    slot, no candidate) is a public fact, and so is every time recorded of it."""
    async with ctx.sessionmaker() as session:  # fresh, not the cached runtime
        current = await streams.get(session=session, name=name)
        tables_now = list(await streams_repo.tables_of(session, current.id))
        rt = streams.runtime_of(current, tables_now)
        recorded = await repository.round_epochs(session, current.id)
    cfg = rt.config
    privacy = cfg.privacy
    eps = privacy.epsilon_selection
    assert cfg.max_tables is not None and privacy.selection_rounds is not None
    if eps <= 0 or len(rt.tables) + 1 >= cfg.max_tables:
        return {"selected": [], "reason": "no budget or no free slot"}
    if not 2 <= epoch <= privacy.selection_rounds + 1:
        return {"selected": [], "reason": "past the schedule"}
    if epoch in recorded:
        return {"selected": [], "reason": "done"}
    await _wait_for_earlier_rounds(
        ctx, rt.id, epoch, max_tables=cfg.max_tables, max_attempts=max_attempts
    )
    columns: dict[str, np.ndarray] | None = None
    labels = np.zeros(0, np.int64)
    attributes = {f.name: f.of for f in cfg.features if f.of is not None}
    features = [f.name for f in rt.features]
    for _ in range(MAX_RESCORES):
        async with ctx.sessionmaker() as session:
            tables_now = list(await streams_repo.tables_of(session, rt.id))
        groups = [tuple(sorted(t.features)) for t in tables_now]
        if len(tables_now) + 1 >= cfg.max_tables:
            return {"selected": [], "reason": "no budget or no free slot"}
        if not candidate_groups(tables=groups, features=features, attributes=attributes):
            return {"selected": [], "reason": "no candidate"}
        if columns is None:
            columns, labels = await _hot_matrix(ctx, rt, epoch)
        picks = await ctx.run_cpu(
            _round,
            columns,
            labels,
            len(rt.labels),
            groups,
            cfg.max_tables,
            privacy.groups_per_round,
            eps,
            privacy.min_records,
            privacy.selection_score,
            privacy.selection_threshold,
            privacy.selection_margin,
            attributes,
        )
        outcome = await _commit(ctx, name, epoch, rt.config, {table_name(g) for g in groups}, picks)
        if outcome is not None:
            break
    else:
        raise RuntimeError(f"the tables of stream changed {MAX_RESCORES} times during a round")
    if outcome == "done":
        return {"selected": [], "reason": "done"}
    assert not isinstance(outcome, str)
    added, first_epoch = outcome
    if not added:
        log.debug("stream %s: the round of epoch %d picked no table", name, epoch)
        return {"selected": [], "reason": "nothing picked"}
    streams.forget_runtime(ctx, name)
    log.debug("stream %s: selected %s from window %d on", name, added, first_epoch)
    return {"selected": added, "first_epoch": first_epoch}


MAX_RESCORES = 5


async def _commit(
    ctx: AppContext,
    name: str,
    epoch: int,
    cfg: StreamCreate,
    scored: set[str],
    picks: list[tuple[tuple[str, ...], tuple[str, ...]]],
) -> tuple[list[str], int] | str | None:
    """Commit a round's outcome under the stream lock: (tables added, first epoch), ``([], e)``
    for ⊥, ``"done"`` when a round of ``epoch`` is recorded already, ``None`` when the tables
    are no longer those the round scored against (score again)."""
    async with stream_lock(ctx, name), ctx.sessionmaker() as session, session.begin():
        stream = await streams_repo.get_by_name(session, name, for_update=True)
        assert stream is not None
        tables = list(await streams_repo.tables_of(session, stream.id))
        if epoch in await repository.round_epochs(session, stream.id) or any(
            t.selected_epoch == epoch for t in tables
        ):
            return "done"
        existing = {t.name for t in tables}
        if existing != scored:
            return None
        # windows up to the stream's epoch + 1 (or a crashed roll's target + 1) may be prepared
        # already, each with a fixed table set
        first_epoch = max(epoch, stream.epoch, stream.roll_target or 0) + 2
        at = await repository.roll_time(session, stream.id, epoch)
        assert cfg.max_tables is not None
        privacy = cfg.privacy
        eps = privacy.epsilon_selection
        free = cfg.max_tables - 1 - len(tables)  # the prior table takes a slot
        added: list[str] = []
        for rank, (group, base) in enumerate(picks, start=1):
            tname = table_name(group)
            if tname in existing or len(added) >= free:
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
                    **({"created_at": at} if at is not None else {}),
                )
            )
            added.append(tname)
        data: dict[str, object] = {"stream": name, "epoch": epoch, "epsilon_selection": eps}
        if added:
            data |= {"tables": added, "first_epoch": first_epoch}
        else:  # ⊥ first (the picks are never names of tables that exist: same table set)
            data["threshold"] = privacy.selection_threshold
            data["margin"] = privacy.selection_margin
        await events_repo.add_event(
            session,
            StreamEvent(
                stream_id=stream.id,
                kind=repository.PICKED if added else repository.NOTHING,
                data=data,
                **({"created_at": at} if at is not None else {}),
            ),
        )
        return added, first_epoch


async def list_tables(*, session: AsyncSession, name: str) -> list[CountTable]:
    stream = await streams.get(session=session, name=name)
    return list(await streams_repo.tables_of(session, stream.id))

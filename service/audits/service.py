"""Re-identification audits as a job (docs/ARCHITECTURE.md, "Re-identification audits"): what
an attacker who holds the records and reads a class-level release recovers of their classes
(Su et al., KDD 2020; the attacks are ``service.core.reidentification.attacks``).

``create`` checks the request, stores its spec (and inline records) in Redis and enqueues
``reidentification_run`` keyed by the audit's id; ``run`` (the job) builds the records and the
release, runs ``service.core.reidentification.attacks.audit`` in a worker thread (BLAS and OpenMP on
``Settings.audit_threads`` threads: ``service.core.threads``) while a throttled writer records
its progress, and stores the accuracies; ``get`` reads them back; ``latest`` gives a stream's
latest finished audit for its privacy ledger. A run already done is not redone.

Resuming. The job checkpoints every noise draw (``_attacks``): the draw's noisy release before
its attacks train, their figures after; and a stream source's records once read. A run that
was interrupted (the worker stopped, or killed: ``workers.runner`` requeues its job within
seconds, up to ``RESUMES`` times) resumes from them: finished draws are kept, an unfinished
one is re-trained on its stored release, never on a fresh noise draw, so the figures are of
the same kind as an uninterrupted run's (``draws`` releases, each attacked once, each drawn
once); the progress shown never goes back. Nothing is charged to a privacy ledger either way.

Sources. Inline: the records as given; ``class_mean`` with ε clips them to the declared
``value_range``. A stream: the records of the hot period of the served epoch (the open epoch's
when there is no count period yet), at most ``MAX_STREAM_ROWS``, one-hot encoded per count
table (``service.audits.encoding``: one 1 per table, so a record's L1 norm is at most the
number of tables, the declared bound); ``count_tables`` reads the mean off the count period's
noisy tables as an attacker would (``encoding``) at the stream's own ε.

The release (``class_mean`` with ε): the noisy sum and count of the positive class,
``service.core.reidentification.attacks.SumRelease``: ε for the whole record, add/remove one record
of the records
audited (on a hot period of more than ``MAX_STREAM_ROWS`` records a record added before the
last one audited displaces it: a swap, up to 2ε). Each audit attacks ``draws`` noise draws
(count_tables: the tables' one release, re-trained on) and reports per attack the means,
precision, recall, gains over the prior and their spread.

Owner. An audit belongs to the key that created it (``spec.owner``, the key id): a read by any
other key, an admin's included, is the 404 of an unknown id.

Lifetime. Every key of an audit expires ``AUDIT_TTL_SECONDS`` (one day) after its creation; for
a stream source at most ``window_seconds`` after it, and before that ``expire_for_stream``
deletes it at the roll that ends the hot period of the oldest window it read (the job lists it
in the stream's index before it reads, ``AuditStore.index``; an audit that sees the stream roll
past that window while it reads deletes itself). Inline records are deleted as soon as the
audit is done or failed and appear in no log, audit entry or error.

The audit protects nothing: it measures what a class-level release tells about a population.
It is not charged in the privacy ledger (it reads the service's own data and releases only
accuracies to analysts and admins).
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import threading
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson

from service.audits.encoding import count_table_mean, one_hot
from service.audits.schemas import (
    MAX_STREAM_DIMENSIONS,
    MAX_STREAM_ROWS,
    AuditCreate,
    AuditOut,
)
from service.audits.store import AuditStore
from service.context import AppContext
from service.core.features.runtime import StreamRuntime
from service.core.reidentification import attacks as pu
from service.core.threads import blas_limited, openmp_limited
from service.errors import Conflict, NotFound, ServiceError, ValidationError
from service.features import service as features
from service.streams import service as streams

log = logging.getLogger("selectivity.audits")

AUDIT_TTL_SECONDS = 86_400
JOB_TIMEOUT_SECONDS = 4 * 3600
# The job fails itself (and stops its thread) before SAQ's timeout would cancel it and leave
# its status "running" until it expired.
COMPUTE_SECONDS = JOB_TIMEOUT_SECONDS - 300
RESUMES = 20
"""Runs after an interruption (a lost worker, a stopped one) before the job is given up: each
resumes from the last checkpoint. The job has RESUMES + 1 runs (SAQ's retries): the first
RESUMES compute, the last only marks the audit failed, so an audit given up never reads
"running" until it expires."""
PROGRESS_SECONDS = 0.5  # the least time between two progress writes of an audit
HOT_CHUNK = 5000
CONFIG = pu.PUConfig()
"""The attacks' budgets: the paper's Table 3 (``service.core.reidentification.attacks.PUConfig``).
Tests set a
smaller one."""

NAMES = {"growpu": "growPU", "nnpu": "nnPU", "upu": "uPU", "kmeans": "K-means"}


def _store(ctx: AppContext) -> AuditStore:
    return AuditStore(ctx.redis, ctx.keys)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _pack(x: np.ndarray, labels: list[str]) -> bytes:
    head = orjson.dumps({"n": x.shape[0], "d": x.shape[1], "labels": labels})
    return head + b"\n" + np.ascontiguousarray(x, dtype="<f4").tobytes()


def _unpack(blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    head, _, body = blob.partition(b"\n")
    h = orjson.loads(head)
    x = np.frombuffer(body, dtype="<f4").reshape(h["n"], h["d"])
    return x, np.asarray(h["labels"], dtype=object)


async def create(*, ctx: AppContext, body: AuditCreate, owner: str) -> tuple[str, dict[str, Any]]:
    """Store the audit of key ``owner`` and enqueue its job: its id and the spec stored (no
    values), which the caller audits."""
    ttl = AUDIT_TTL_SECONDS
    positive = str(body.positive_label)
    stream_id = None
    data = None
    if body.source.stream is not None:
        name = body.source.stream
        rt = await streams.runtime(ctx=ctx, name=name)  # 404 for an unknown one
        if positive not in rt.labels:
            raise ValidationError(
                f"positive_label: {positive!r} is not a label of stream {name!r} ({rt.labels})"
            )
        served = await ctx.stores.windows.served(name)
        if body.release.kind == "count_tables" and (
            served is None or rt.count_period(served)[1] < 1
        ):
            raise Conflict(
                f"release: stream {name!r} has no count period yet (its tables are read "
                "after its first roll); retry after it"
            )
        ttl = min(ttl, rt.config.window_seconds)
        source, stream_id, rows = f"stream:{name}", rt.id, None
    else:
        source = "inline"
        labels = [str(v) for v in body.source.labels or []]
        x = await asyncio.to_thread(np.asarray, body.source.rows, np.float32)  # |v| ≤ 1e30
        data, rows = _pack(x, labels), len(labels)
    a = f"ra_{secrets.token_hex(16)}"
    spec = {
        "source": source,
        "stream_id": stream_id,
        "positive_label": positive,
        "release": body.release.model_dump(mode="json"),
        "attacks": list(body.attacks),
        "classifier": body.classifier,
        "draws": body.draws,
        "owner": owner,
        "created_at": _now_iso(),
    }
    expires_at_ms = int((time.time() + ttl) * 1000)
    await _store(ctx).create(a, spec=spec, data=data, expires_at_ms=expires_at_ms)
    await ctx.jobs.enqueue(
        "reidentification_run",
        key=f"reidentification:{a}",
        owner=owner,
        timeout=JOB_TIMEOUT_SECONDS,
        retries=RESUMES + 1,  # the last run only marks the audit failed
        id=a,
    )
    detail = {
        **{k: v for k, v in spec.items() if k not in ("created_at", "owner")},
        "rows": rows,
        "ttl_seconds": ttl,
    }
    return a, detail


async def _meta(ctx: AppContext, a: str, owner: str) -> dict[str, bytes]:
    """The audit's meta when key ``owner`` created it; the same 404 when it did not as when the
    audit does not exist."""
    meta = await _store(ctx).meta(a)
    if meta is None or "spec" not in meta or orjson.loads(meta["spec"]).get("owner") != owner:
        raise NotFound(f"re-identification audit {a!r} not found (or expired)")
    return meta


async def get(*, ctx: AppContext, a: str, owner: str) -> AuditOut:
    meta = await _meta(ctx, a, owner)
    spec = orjson.loads(meta["spec"])
    summary = orjson.loads(meta["summary"]) if "summary" in meta else {}
    summary.pop("finished_at", None)
    return AuditOut(
        id=a,
        status=meta["status"].decode(),  # type: ignore[arg-type]
        progress=float(meta.get("progress", b"0")),
        stage=meta["stage"].decode() if "stage" in meta else None,
        source=spec["source"],
        positive_label=spec["positive_label"],
        release=spec["release"],
        attacks=spec["attacks"],
        classifier=spec["classifier"],
        created_at=spec["created_at"],
        error=meta["error"].decode() if "error" in meta else None,
        **summary,
    )


async def _hot_columns(
    ctx: AppContext, name: str, lo: int, hi: int, wanted: list[str], parts: int = 1
) -> tuple[dict[str, list[Any]], list[Any]]:
    """Windows ``lo..hi`` of the stream's hot rows (each window's ``parts`` parts one after
    the other) in entry order, at most ``MAX_STREAM_ROWS``: one list per wanted feature
    (absent values None) and the labels."""
    store = ctx.stores.windows
    columns: dict[str, list[Any]] = {c: [] for c in wanted}
    labels: list[Any] = []
    for w in range(max(lo, 1), hi + 1):
        if len(labels) >= MAX_STREAM_ROWS:
            break
        async for rows in store.hot_rows(name, w, parts=parts, count=HOT_CHUNK):
            for rec in orjson.loads(b"[" + rows + b"]")[: MAX_STREAM_ROWS - len(labels)]:
                feats = rec.get("f") or {}
                for c in wanted:
                    columns[c].append(feats.get(c))
                labels.append(rec.get("y"))
            if len(labels) >= MAX_STREAM_ROWS:
                break
    return columns, labels


class _Rolled(Exception):
    """The stream rolled past the oldest window an audit reads while it read them."""


async def _stream_input(
    ctx: AppContext, spec: dict[str, Any], a: str | None = None
) -> dict[str, Any]:
    """The records of a stream source, one-hot per count table, their labels, and for
    ``count_tables`` the mean read off the tables (``service.audits.encoding``). With ``a``,
    the audit is listed in the stream's index (by the oldest window read) before the records
    are read, and ``_Rolled`` raised when a roll ended that window's hot period meanwhile."""
    name = spec["source"].split(":", 1)[1]
    rt = await streams.runtime(ctx=ctx, name=name)
    if rt.id != spec["stream_id"]:
        raise ValueError(f"source.stream: stream {name!r} was deleted since the audit began")
    served = await ctx.stores.windows.served(name)
    kind = spec["release"]["kind"]
    fz = None
    if served is not None:
        fz = await features.featurizer(ctx=ctx, name=name)
        rt, epoch = fz.rt, fz.epoch
    else:
        epoch = await ctx.stores.windows.epoch(name) or 1
    if kind == "count_tables" and (fz is None or fz.agg.n_windows == 0):
        raise ValueError(f"release: stream {name!r} has no count period")
    lo, hi = rt.hot_period(epoch)
    oldest = max(lo, 1)
    if a is not None:
        await _store(ctx).index(name, a, oldest=oldest, longest_ms=AUDIT_TTL_SECONDS * 1000)
    wanted = list(dict.fromkeys(f for t in rt.tables for f in t.features))
    columns, labels = await _hot_columns(ctx, name, lo, hi, wanted, rt.parts)
    if a is not None and not await _still_hot(ctx, rt, oldest):
        raise _Rolled
    y = np.asarray([str(v) if v is not None else "" for v in labels], dtype=object)
    positive = spec["positive_label"]
    if not (y == positive).any() or (y == positive).all():
        raise ValueError(
            f"source.stream: the hot period's {len(y)} records need the positive label "
            f"{positive!r} and at least one other"
        )
    enc = await asyncio.to_thread(
        one_hot, rt, columns, len(labels), max_columns=MAX_STREAM_DIMENSIONS
    )
    del columns
    out: dict[str, Any] = {
        "x": enc.x,
        "y": y,
        "epoch": epoch,
        "domain": pu.Domain.one_hot(len(rt.tables)),
        "source": f"the first {len(labels)} records (at most {MAX_STREAM_ROWS}) of the hot "
        f"period of epoch {epoch}, windows {oldest}-{hi}, one-hot per count table",
        "windows": [oldest, hi],
    }
    out["dropped_columns"] = enc.dropped
    if kind == "count_tables":
        assert fz is not None
        mean, n_hat = count_table_mean(
            rt, enc, cells=fz.cells, offsets=fz.offsets, prior=fz.agg.prior, positive=positive
        )
        p = rt.config.privacy
        out["released"] = mean
        out["mechanism"] = p.mechanism
        out["epsilon"] = p.epsilon if p.mechanism == "laplace" else None
        out["count_period"] = [min(fz.agg.windows), max(fz.agg.windows)]
        out["n_hat_p"] = n_hat
        out["guarantee"] = {
            "epsilon": out["epsilon"],
            "mechanism": p.mechanism,
            "neighbours": f"as GET /v1/streams/{name}/privacy states for the stream's tables",
            "unit": "one observation of the count period",
            "source": "the count tables of windows "
            f"{out['count_period'][0]}-{out['count_period'][1]}",
        }
    return out


async def _still_hot(ctx: AppContext, rt: StreamRuntime, oldest: int) -> bool:
    """Whether window ``oldest`` is still in the hot period of the stream's open epoch."""
    epoch = await ctx.stores.windows.epoch(rt.name) or 1
    return max(rt.hot_period(epoch)[0], 1) <= oldest


async def expire_for_stream(*, ctx: AppContext, rt: StreamRuntime, epoch: int) -> int:
    """Delete the stream's audits whose oldest window left the hot period of ``epoch`` (called
    by ``service.lifecycle.expire`` at every roll, before its AOF rewrite): how many still
    had keys."""
    store = _store(ctx)
    hot_lo = rt.hot_period(epoch)[0]
    return await store.delete(rt.name, await store.indexed(rt.name, before=hot_lo))


class _Stopped(Exception):
    """The job gave up on the computation (its deadline, or the worker shutting down)."""


class _TimedOut(Exception):
    """The run passed ``COMPUTE_SECONDS``."""


class _Gone(Exception):
    """The audit was deleted (a roll, its expiry) while the job ran: it writes nothing more."""


def _retrieve(work: asyncio.Future[Any]) -> None:
    """Collect the outcome of a computation the job gave up on (no "never retrieved" log)."""
    if not work.cancelled():
        work.exception()


def _compute(
    kwargs: dict[str, Any], progress: list[Any], stop: threading.Event, threads: int
) -> dict[str, Any]:
    """One ``pu.audit`` call, in a worker thread; the job has limited BLAS to ``threads``
    threads, and this thread's OpenMP is limited here (``service.core.threads``)."""

    def tick(p: float, stage: str) -> None:
        if stop.is_set():  # a thread cannot be cancelled: it stops at its next progress report
            raise _Stopped
        progress[0], progress[1] = p, stage

    with openmp_limited(threads):
        return pu.audit(**kwargs, config=CONFIG, progress=tick)


class _Progress:
    """The audit's progress as written: never lower than what was written before (a resumed
    draw starts again from its checkpoint, below the fraction shown when it was interrupted,
    and the figure waits until the work catches up)."""

    def __init__(self, store: AuditStore, a: str, shown: float) -> None:
        self.store, self.a, self.shown = store, a, shown

    async def write(self, fraction: float, stage: str) -> None:
        self.shown = max(self.shown, min(fraction, 1.0))
        await self.store.set_progress(self.a, self.shown, stage)


async def _in_thread(
    kwargs: dict[str, Any],
    shown: _Progress,
    *,
    base: float,
    weight: float,
    suffix: str,
    deadline: float,
    threads: int,
) -> dict[str, Any]:
    """``_compute(kwargs)`` in a worker thread while its progress is written (scaled to
    ``base + weight · fraction`` of the whole audit), at most every ``PROGRESS_SECONDS``;
    ``_TimedOut`` past ``deadline``. Cancelled (the worker stops), or timed out, the thread
    stops at its next progress report."""
    progress: list[Any] = [0.0, "starting"]
    stop = threading.Event()
    work = asyncio.ensure_future(asyncio.to_thread(_compute, kwargs, progress, stop, threads))
    written: list[Any] = [0.0, ""]
    try:
        while not work.done():
            await asyncio.wait([work], timeout=PROGRESS_SECONDS)
            if time.monotonic() > deadline and not work.done():
                raise _TimedOut
            if progress != written and not work.done():
                written = list(progress)
                await shown.write(base + weight * float(written[0]), str(written[1]) + suffix)
    except (asyncio.CancelledError, _TimedOut):
        stop.set()
        work.add_done_callback(_retrieve)
        raise
    return work.result()


def _pack_bits(x: np.ndarray, labels: list[str]) -> bytes:
    """0/1 records (one-hot) at one bit a value, for the checkpoint of a stream source."""
    head = orjson.dumps({"n": x.shape[0], "d": x.shape[1], "labels": labels, "bits": True})
    return head + b"\n" + np.packbits(x.astype(bool), axis=1).tobytes()


def _unpack_any(blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    head, _, body = blob.partition(b"\n")
    h = orjson.loads(head)
    if not h.get("bits"):
        return _unpack(blob)
    packed = np.frombuffer(body, dtype=np.uint8).reshape(h["n"], -1)
    x = np.unpackbits(packed, axis=1, count=h["d"]).astype(np.float32)
    return x, np.asarray(h["labels"], dtype=object)


STREAM_FIELDS = (
    "epoch",
    "source",
    "windows",
    "dropped_columns",
    "mechanism",
    "epsilon",
    "count_period",
    "n_hat_p",
    "guarantee",
)


async def _inputs(
    ctx: AppContext, store: AuditStore, spec: dict[str, Any], a: str, meta: dict[str, bytes]
) -> dict[str, Any] | None:
    """The records the audit attacks (None: the inline records expired). A stream source's are
    read once and kept, encoded, in the audit's ``input`` key (with what the job read off the
    tables in ``meta``'s ``inputs``) until it ends, so a resumed audit attacks the same records
    and the same table release; it still ends when the stream rolls past them (``_Rolled``)."""
    blob = await store.input(a)
    if spec["source"] == "inline":
        if blob is None:
            return None
        x, y = _unpack(blob)
        return {"x": x, "y": y}
    if blob is not None and "inputs" in meta:
        name = spec["source"].split(":", 1)[1]
        rt = await streams.runtime(ctx=ctx, name=name)
        if rt.id != spec["stream_id"]:
            raise ValueError(f"source.stream: stream {name!r} was deleted since the audit began")
        saved = orjson.loads(meta["inputs"])
        if not await _still_hot(ctx, rt, saved["windows"][0]):
            raise _Rolled
        x, y = _unpack_any(blob)
        inp = {**saved, "x": x, "y": y, "domain": pu.Domain.one_hot(saved["tables"])}
        if saved.get("released") is not None:
            inp["released"] = np.asarray(saved["released"], dtype=np.float64)
        return inp
    inp = await _stream_input(ctx, spec, a)
    saved = {k: inp.get(k) for k in STREAM_FIELDS}
    saved["tables"] = inp["domain"].tables
    if "released" in inp:
        saved["released"] = np.asarray(inp["released"], dtype=np.float64).tolist()
    packed = await asyncio.to_thread(_pack_bits, inp["x"], [str(v) for v in inp["y"]])
    if not await store.keep_input(
        a, packed, expires_at_ms=int(meta["expires_at"]), inputs=orjson.dumps(saved)
    ):
        raise _Gone
    return inp


async def _attacks(
    ctx: AppContext,
    store: AuditStore,
    a: str,
    spec: dict[str, Any],
    inp: dict[str, Any],
    meta: dict[str, bytes],
    shown: _Progress,
) -> dict[str, Any]:
    """The audit, draw by draw, from its checkpoints in ``meta``: ``release:<i>`` (draw i's
    noisy sum and count, written before its attacks train), ``draw:<i>`` (its attacks'
    figures) and ``final`` (K-means, the prior and the oracle, which read no release). A draw
    with figures is not run again; one with a release is re-trained on that release, never on
    a fresh noise draw; so a resumed audit attacks ``draws`` releases, each once, as an
    uninterrupted one does."""
    release, positive = spec["release"], spec["positive_label"]
    x, y = inp["x"], inp["y"]
    draws = int(spec.get("draws", 1))
    attacks = list(dict.fromkeys(spec["attacks"]))
    pu_attacks = [t for t in attacks if t != "kmeans"]
    is_pos = y == positive
    if x.shape[0] < 2 or not is_pos.any() or is_pos.all():
        raise ValueError("y must contain the positive label and at least one other label")
    n, d = x.shape
    batches = math.ceil(n / CONFIG.batch_size)
    work = {
        "growpu": CONFIG.t_pre + 2 * CONFIG.t_tune,
        "nnpu": CONFIG.pu_epochs * batches,
        "upu": CONFIG.pu_epochs * batches,
    }
    per_draw = sum(work[t] for t in pu_attacks)
    total = draws * per_draw + 1 + CONFIG.oracle_epochs * batches
    mechanism: pu.SumRelease | None = None
    units: np.ndarray | None = None
    fixed: np.ndarray | None = None
    if "released" in inp:
        fixed, epsilon = np.asarray(inp["released"], dtype=np.float64), inp.get("epsilon")
    elif release.get("epsilon") is not None:
        epsilon = release["epsilon"]
        domain = inp.get("domain") or pu.Domain.box(*release["value_range"])
        mechanism = pu.calibrate(domain, dimensions=d, epsilon=epsilon)
        units = await asyncio.to_thread(mechanism.units, x[is_pos])
    else:
        epsilon = None
        fixed = x[is_pos].astype(np.float64).mean(axis=0)
    common = {"x": x, "y": y, "positive": positive, "classifier": spec["classifier"]}
    deadline = time.monotonic() + COMPUTE_SECONDS
    threads = ctx.settings.audit_threads
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in pu_attacks}
    seconds = dict.fromkeys(pu_attacks, 0.0)
    for i in range(draws if pu_attacks else 0):
        done = meta.get(f"draw:{i}")
        if done is None:
            if mechanism is not None:
                assert units is not None
                kept = meta.get(f"release:{i}")
                if kept is None:
                    noisy_sum, noisy_count = await asyncio.to_thread(mechanism.draw, units)
                    kept = orjson.dumps({"sum": noisy_sum.tolist(), "count": noisy_count})
                    if not await store.checkpoint(a, {f"release:{i}": kept}):
                        raise _Gone
                r = orjson.loads(kept)
                mean = mechanism.mean(np.asarray(r["sum"], dtype=np.int64), int(r["count"]))
            else:
                assert fixed is not None
                mean = fixed
            res = await _in_thread(
                {
                    **common,
                    "attacks": pu_attacks,
                    "epsilon": epsilon,
                    "draws": 1,
                    "oracle": False,
                    "released": mean,
                },
                shown,
                base=i * per_draw / total,
                weight=per_draw / total,
                suffix=f" (draw {i + 1}/{draws})" if draws > 1 else "",
                deadline=deadline,
                threads=threads,
            )
            done = orjson.dumps(
                {
                    t: {
                        "scores": {m: res["results"][t][m] for m in pu.METRICS},
                        "seconds": res["results"][t]["seconds"],
                    }
                    for t in pu_attacks
                }
            )
            if not await store.checkpoint(a, {f"draw:{i}": done}):
                raise _Gone
            await shown.write((i + 1) * per_draw / total, f"draw {i + 1}/{draws} done")
        for t, r in orjson.loads(done).items():
            runs[t].append(r["scores"])
            seconds[t] += r["seconds"]
    final_raw = meta.get("final")
    if final_raw is None:
        res = await _in_thread(
            {**common, "attacks": ["kmeans"], "epsilon": None, "draws": 1},
            shown,
            base=draws * per_draw / total,
            weight=1 - draws * per_draw / total,
            suffix="",
            deadline=deadline,
            threads=threads,
        )
        final_raw = orjson.dumps(
            {
                "results": {k: res["results"][k] for k in ("kmeans", "prior", "oracle")},
                "n": res["n"],
                "pi_p": res["pi_p"],
            }
        )
        if not await store.checkpoint(a, {"final": final_raw}):
            raise _Gone
    final = orjson.loads(final_raw)
    results: dict[str, Any] = {}
    for t in attacks:
        if t == "kmeans":
            results[t] = final["results"]["kmeans"]
        else:
            results[t] = {**pu.summarise(runs[t]), "seconds": seconds[t]}
    results["prior"] = final["results"]["prior"]
    results["oracle"] = final["results"]["oracle"]
    guarantee = mechanism.guarantee() if mechanism is not None else None
    if "released" in inp:
        guarantee = inp.get("guarantee")
    if guarantee is not None and "source" not in guarantee:
        guarantee["source"] = inp.get("source", f"the {final['n']} inline rows")
    spent = sum(seconds.values()) + sum(r.get("seconds", 0.0) for r in final["results"].values())
    return {
        "results": results,
        "n": final["n"],
        "pi_p": final["pi_p"],
        "dimensions": int(d),
        "epsilon": epsilon,
        "guarantee": guarantee,
        "draws": draws,
        "noise_scale": None
        if "released" in inp
        else (guarantee["sum_noise_scale"] if mechanism is not None and guarantee else 0.0),
        "count_noise_scale": None
        if "released" in inp
        else (guarantee["count_noise_scale"] if mechanism is not None and guarantee else 0.0),
        "mechanism": inp.get("mechanism"),
        "epoch": inp.get("epoch"),
        "count_period": inp.get("count_period"),
        "n_hat_p": inp.get("n_hat_p"),
        "dropped_columns": inp.get("dropped_columns"),
        "seconds": round(spent, 3),
    }


async def run(*, ctx: AppContext, a: str) -> dict[str, Any]:
    """The job: compute audit ``a`` unless it is done, failed or expired, resuming from its
    checkpoints (``_attacks``) when an earlier run was interrupted."""
    store = _store(ctx)
    meta = await store.meta(a)
    if meta is None or "spec" not in meta:
        return {"status": "expired"}
    if meta["status"] in (b"done", b"failed"):
        return {"status": meta["status"].decode()}
    spec = orjson.loads(meta["spec"])
    expires_at_ms = int(meta["expires_at"])
    stream = spec["source"].split(":", 1)[1] if spec["source"] != "inline" else None

    async def fail(error: str) -> dict[str, Any]:
        await store.finish(a, expires_at_ms=expires_at_ms, summary=None, error=error, stream=None)
        return {"status": "failed"}

    runs = await store.r.hincrby(store.key(a, "meta"), "runs", 1)
    if not await store.r.hexists(store.key(a, "meta"), "spec"):  # deleted in between
        await store.r.delete(store.key(a, "meta"))
        return {"status": "expired"}
    if runs > RESUMES:
        return await fail(f"given up: {RESUMES} runs were interrupted (the worker stopped or died)")
    shown = _Progress(store, a, float(meta.get("progress", b"0")))
    resumed = any(k == "inputs" or k.startswith(("draw:", "release:")) for k in meta)
    await shown.write(0.0, "resuming" if resumed else "reading the records")

    try:
        inp = await _inputs(ctx, store, spec, a, meta)
        if inp is None:
            return {"status": "expired"}
        with blas_limited(ctx.settings.audit_threads):  # the process's limit: core.threads
            summary = await _attacks(ctx, store, a, spec, inp, meta, shown)
    except _Rolled:  # the roll's expiry may have run before the audit was listed
        assert stream is not None
        await store.delete(stream, [a])
        return {"status": "expired"}
    except _Gone:
        await store.r.delete(store.key(a, "input"))
        return {"status": "expired"}
    except _TimedOut:
        return await fail(
            f"the audit ran longer than {COMPUTE_SECONDS} s; audit fewer records, "
            "the linear classifier, or fewer attacks"
        )
    except ValueError as exc:  # the core's and the reader's messages name fields, never values
        return await fail(str(exc))
    except ServiceError as exc:  # e.g. the stream was deleted since
        return await fail(exc.detail)
    except Exception as exc:  # not retried; its type only, no values
        log.error("re-identification audit %s failed: %s", a, type(exc).__name__)
        return await fail(f"internal error ({type(exc).__name__}); see the worker log")
    summary["finished_at"] = _now_iso()
    if not await store.finish(
        a, expires_at_ms=expires_at_ms, summary=summary, error=None, stream=stream
    ):
        return {"status": "expired"}  # deleted by a roll while it ran
    return {"status": "done", "n": summary["n"]}


def _pct(v: float) -> str:
    return f"{100 * v:.1f} %"


def describe(spec: dict[str, Any], summary: dict[str, Any]) -> str:
    """The sentence a privacy officer reads: the best attack run (its mean over the draws,
    their range, its precision against the positive share) against the baselines."""
    res = summary["results"]
    pu_run = [k for k in ("growpu", "nnpu", "upu") if k in res]
    best = max(pu_run or ["kmeans"], key=lambda k: res[k]["accuracy"])
    release = spec["release"]
    if release["kind"] == "count_tables":
        reads = "reads these tables"
    else:
        eps = release.get("epsilon")
        what = "exact" if eps is None else f"ε = {eps:g} for a whole record, add/remove"
        reads = f"reads the mean of class {spec['positive_label']!r} ({what})"
    r = res[best]
    how = [f"with {NAMES[best]}"]
    spread = (r.get("spread") or {}).get("accuracy")
    if spread and r.get("draws", 1) > 1:
        how.append(f"mean of {r['draws']} draws, {_pct(spread['min'])} to {_pct(spread['max'])}")
    if r.get("precision") is not None:
        how.append(
            f"precision {_pct(r['precision'])} against a positive share of "
            f"{_pct(summary['pi_p'])}, recall {_pct(r['recall'])}"
        )
    base = [f"prior {_pct(res['prior']['accuracy'])}"]
    if "kmeans" in res and best != "kmeans":
        base.append(f"K-means {_pct(res['kmeans']['accuracy'])}")
    if "oracle" in res:
        base.append(f"oracle {_pct(res['oracle']['accuracy'])}")
    return (
        f"an attacker who knows these records and {reads} labels "
        f"{_pct(r['accuracy'])} of them correctly {'; '.join(how)} "
        f"({', '.join(base)})"
    )


async def latest(*, ctx: AppContext, stream: str, stream_id: int) -> dict[str, Any] | None:
    """The stream's latest finished audit, as its privacy ledger shows it (null when none
    lives: audits of a stream expire with its hot period)."""
    store = _store(ctx)
    a = await store.latest(stream)
    if a is None:
        return None
    meta = await store.meta(a)
    if meta is None or "summary" not in meta:
        return None
    spec = orjson.loads(meta["spec"])
    if spec.get("stream_id") != stream_id:  # an audit of a deleted stream of the same name
        return None
    summary = orjson.loads(meta["summary"])
    res = summary["results"]
    return {
        "id": a,
        "at": summary.get("finished_at", spec["created_at"]),
        "release": spec["release"]["kind"],
        "epsilon": summary["epsilon"],
        "n": summary["n"],
        "accuracy": {
            k: res[k]["accuracy"]
            for k in ("growpu", "nnpu", "upu", "kmeans", "prior", "oracle")
            if k in res
        },
        "summary": describe(spec, summary),
    }

"""Every kind of release a stream makes, DP or not, in the same words: the ``releases`` section
of its privacy ledger (docs/ARCHITECTURE.md, "Privacy ledger").

Each release kind is one function of ``KINDS``, which reads what the ledger's reader may see
(``LedgerInput``) and returns its entries (usually one); ``collect`` runs them in order, so a new
kind is one function appended to the list. Every entry has the same fields:

* ``kind``; ``dp`` (true or false); ``guarantee``: for a DP kind the mechanism's guarantee
  ("ε-DP", or "ρ-zCDP, reported as (ε, δ)-DP"), for any other "non-DP: " and what it is;
* ``epsilon``, ``delta``, ``neighbour`` (the neighbour relation the ε holds for),
  ``observer`` (whom the figure protects against, as the accounting states it), ``unit``, and
  ``per_user`` (the same per user, with a user key) for DP kinds; all null for non-DP;
* ``reveals``: what the release shows; ``to``: the roles that can read it, ``readers``: who
  among them, in words;
* ``created``: when such releases are made; ``lifetime``: when they are deleted; ``items``:
  the releases of the kind that live now, where there are separate ones (with ``created_at``
  and ``expires_at``), else null.

The non-DP kinds hold exact functions of hot rows, and their exact figures are shown only to
whoever may read the release itself: a k-anonymised release to its creator (its column names,
k and times to every reader of the ledger, its creator's key id to admins and the creator); a
re-identification audit's n, shares and accuracies to admins and the audit's creator, and to
others only that it exists, when, and of which release kind (``reidentification``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from service.anonymize import service as anonymize
from service.audits import service as audits
from service.audits.store import AuditStore
from service.context import AppContext
from service.core.features.runtime import StreamRuntime
from service.db.models import UnlockRequest
from service.privacy import repository
from service.queues import privacy as queues

ALL_ROLES = ["producer", "model", "curator", "annotator", "analyst", "admin"]
OBSERVATION = "add or remove one observation"
USER = "add or remove all of one user's observations"
RECORD = "add or remove one submitted record"
NON_DP = {
    "epsilon": None,
    "delta": None,
    "neighbour": None,
    "observer": None,
    "unit": None,
    "per_user": None,
}


@dataclass(frozen=True)
class Viewer:
    """The key reading the ledger."""

    key_id: str
    role: str

    @property
    def admin(self) -> bool:
        return self.role == "admin"


@dataclass
class LedgerInput:
    """What a release kind may read: the stream, its DP ledger as computed
    (``service.privacy.service.ledger``) and who reads it."""

    ctx: AppContext
    session: AsyncSession
    rt: StreamRuntime
    ledger: dict[str, Any]
    viewer: Viewer
    memo: dict[str, Any] = field(default_factory=dict)  # what several kinds read, read once


ReleaseKind = Callable[[LedgerInput], Awaitable[list[dict[str, Any]]]]


def _iso_ms(ms: int | None) -> str | None:
    if ms is None:
        return None
    return (
        datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    )


def _guarantee(part: dict[str, Any]) -> str:
    if part.get("rho") is not None and part.get("delta", 0) > 0:
        return "ρ-zCDP, reported as (ε, δ)-DP"
    return "(ε, δ)-DP" if part.get("delta", 0) > 0 else "ε-DP"


def _neighbour(part: dict[str, Any], default: str) -> str:
    """The part's own neighbour relation where the accounting states one, else ``default``."""
    return str(part.get("neighbour") or part.get("parameters", {}).get("neighbour") or default)


def _dp(inp: LedgerInput, name: str, *, neighbour: str, user: bool = True) -> dict[str, Any] | None:
    """The DP fields of the ledger's part ``name`` (per observation, and per user when the
    ledger has a per-user part of that name); None when the ledger has no such part."""
    parts = {p["name"]: p for p in inp.ledger["observation"]["parts"]}
    part = parts.get(name)
    if part is None:
        return None
    per_user = None
    if user and inp.ledger.get("user"):
        u = {p["name"]: p for p in inp.ledger["user"]["parts"]}.get(name)
        if u is not None:
            per_user = {
                "epsilon": u["epsilon"],
                "delta": u["delta"],
                "neighbour": _neighbour(u, USER),
                "observer": u.get("observer"),
            }
    return {
        "guarantee": _guarantee(part),
        "epsilon": part["epsilon"],
        "delta": part["delta"],
        "neighbour": _neighbour(part, neighbour),
        "observer": part.get("observer"),
        "unit": "observation",
        "per_user": per_user,
    }


async def count_tables(inp: LedgerInput) -> list[dict[str, Any]]:
    cfg = inp.rt.config
    dp = _dp(inp, "count_tables", neighbour=OBSERVATION)
    if dp is None:
        return []
    if dp["epsilon"] is None or dp["epsilon"] == float("inf"):  # mechanism 'none'
        dp = {**dp, "guarantee": "none: the stream's mechanism is 'none' (no noise)"}
    return [
        {
            "kind": "count tables",
            "dp": cfg.privacy.mechanism != "none",
            **dp,
            "reveals": "every window's noisy counts of each count table by label, summed "
            "over the count period (featurize, the train set), and each window's noisy label "
            "counts (label-rates)",
            "to": ["model", "admin"],
            "readers": "model keys (featurize, train set) and admins",
            "created": "one window's tables at each roll",
            "lifetime": f"a window's tables are deleted {cfg.retention_windows + cfg.hot_windows} "
            "windows (retention + hot) after it opened",
            "items": None,
        }
    ]


async def hot_rows(inp: LedgerInput) -> list[dict[str, Any]]:
    """The train set: the hot period's rows as they are, to model keys (not DP: the exposure
    is bounded in time, by the hot period)."""
    cfg = inp.rt.config
    raw = sorted(f.name for f in cfg.features if f.passthrough)
    return [
        {
            "kind": "hot rows in the train set",
            "dp": False,
            "guarantee": "non-DP: raw rows of the hot period, exposure bounded in time",
            **NON_DP,
            "reveals": "each hot row's id, event time, window and label, its count columns, "
            f"and the raw values of the features passed through ({raw}); never the user key's "
            "value",
            "to": ["model", "admin"],
            "readers": "model keys and admins, at each download (GET /trainset); featurize "
            "returns only the rows its caller sends",
            "created": "read from the hot windows at each download, stored nowhere else",
            "lifetime": f"a row leaves it when its window leaves the hot period ({cfg.hot_windows} "
            "windows after it opened)",
            "items": None,
        }
    ]


async def table_selection(inp: LedgerInput) -> list[dict[str, Any]]:
    dp = _dp(inp, "table_selection", neighbour=OBSERVATION)
    if dp is None:
        return []
    q = inp.rt.config.privacy.selection_rounds
    return [
        {
            "kind": "count-table selection",
            "dp": True,
            **dp,
            "reveals": "each round's outcome: the feature groups that become count tables, or "
            "'add no table'",
            "to": ALL_ROLES,
            "readers": "every key (the stream's tables)",
            "created": f"one round at each of the rolls to epochs 2 … {q + 1 if q else 1}",
            "lifetime": "the stream's life (the tables picked stay)",
            "items": None,
        }
    ]


async def annotation_queues(inp: LedgerInput) -> list[dict[str, Any]]:
    out = []
    for part in inp.ledger["observation"]["parts"]:
        if not str(part["name"]).startswith("annotation_queue:"):
            continue
        params = part.get("parameters", {})
        out.append(
            {
                "kind": f"annotation queue {params.get('queue', part['name'].split(':', 1)[1])}",
                "dp": True,
                "guarantee": _guarantee(part),
                "epsilon": part["epsilon"],
                "delta": part["delta"],
                "neighbour": _neighbour(part, RECORD),
                "observer": part.get("observer"),
                "unit": "submitted record",
                "per_user": None,
                "reveals": "the classes that reached k sampled candidates in a release period, "
                "with their canonical payload, and their labels",
                "to": ["annotator", "curator", "admin"],
                "readers": "annotators (tasks), curators (stats, label exports) and admins",
                "created": f"at the end of each release period ({params.get('release_seconds')} s)",
                "lifetime": "the queue's life",
                "items": None,
            }
        )
    return out


async def annotation_queue_scores(inp: LedgerInput) -> list[dict[str, Any]]:
    """Non-DP: a ``model``-scored queue's released uncertainty (``service.queues.privacy``)."""
    return await queues.model_score_releases(session=inp.session, stream_id=inp.rt.id)


async def k_anonymised(inp: LedgerInput) -> list[dict[str, Any]]:
    cfg = inp.rt.config
    items = []
    for run in await anonymize.of_stream(ctx=inp.ctx, rt=inp.rt):
        mine = run["owner"] == inp.viewer.key_id
        lo = (run["windows"] or [None])[0]
        items.append(
            {
                "id": run["id"],
                "yours": mine,
                **({"created_by": run["owner"]} if mine or inp.viewer.admin else {}),
                "status": run["status"],
                "k": run["k"],
                "quasi_identifiers": run["quasi_identifiers"],
                "keep": run["keep"],
                "windows": run["windows"],
                "created_at": _iso_ms(run["created_at_ms"]),
                "deleted_at_roll_to_epoch": None if lo is None else lo + cfg.hot_windows,
                "expires_at": _iso_ms(run["expires_at_ms"]),
            }
        )
    return [
        {
            "kind": "k-anonymised release",
            "dp": False,
            "guarantee": "non-DP: k-anonymity, syntactic",
            **NON_DP,
            "reveals": "the hot period's rows, one released row each: the quasi-identifiers "
            "generalised over clusters of at least k rows (a range's bounds are raw values), "
            "the kept columns verbatim; only the columns the stream marks releasable "
            f"({sorted(cfg.releasable)}), never the user key",
            "to": ["analyst", "admin"],
            "readers": "the key that created it only",
            "created": "on an analyst's or admin's request (POST /v1/anonymizations)",
            "lifetime": "deleted at the roll that ends its oldest window's hot period, and at "
            f"most {cfg.window_seconds} s (window_seconds) after its creation",
            "items": items,
        }
    ]


async def _audit_meta(inp: LedgerInput, a: str) -> dict[str, bytes] | None:
    return await AuditStore(inp.ctx.redis, inp.ctx.keys).meta(a)


async def _audit_creator(inp: LedgerInput, a: str, meta: dict[str, bytes] | None) -> str | None:
    """The key that created audit ``a``: its spec's ``owner``, or for an audit stored without
    one, the actor of its creation in the audit log."""
    owner = orjson.loads(meta["spec"]).get("owner") if meta and "spec" in meta else None
    if owner is not None:
        return str(owner)
    return await repository.creator(
        inp.session, action="reidentification.create", target=f"reidentification:{a}"
    )


async def reidentification(inp: LedgerInput) -> dict[str, Any] | None:
    """The stream's latest finished re-identification audit (``service.audits.service.latest``)
    as the viewer may see it: whole to admins and its creator; to others only ``at``,
    ``release``, ``epsilon`` and that exact figures are withheld (no id, n, shares, accuracies
    or summary: the prior's accuracy is the exact class share)."""
    if "reidentification" not in inp.memo:
        inp.memo["reidentification"] = await _reidentification(inp)
    return inp.memo["reidentification"]  # type: ignore[no-any-return]


async def _reidentification(inp: LedgerInput) -> dict[str, Any] | None:
    latest = await audits.latest(ctx=inp.ctx, stream=inp.rt.name, stream_id=inp.rt.id)
    if latest is None:
        return None
    meta = await _audit_meta(inp, latest["id"])
    inp.memo["reidentification_meta"] = meta
    if inp.viewer.admin or await _audit_creator(inp, latest["id"], meta) == inp.viewer.key_id:
        return latest
    return {
        "at": latest.get("at"),
        "release": latest.get("release"),
        "epsilon": latest.get("epsilon"),
        "exact_figures": "withheld: only admins and the audit's creator see them",
    }


async def reidentification_audits(inp: LedgerInput) -> list[dict[str, Any]]:
    block = await reidentification(inp)
    items = []
    if block is not None:
        item = dict(block)
        meta = inp.memo.get("reidentification_meta")
        if meta is not None and "spec" in meta:
            item["created_at"] = orjson.loads(meta["spec"]).get("created_at")
            item["expires_at"] = _iso_ms(int(meta["expires_at"]))
        items.append(item)
    return [
        {
            "kind": "re-identification audit",
            "dp": False,
            "guarantee": "non-DP: re-identification audit result, exact statistics",
            **NON_DP,
            "reveals": "exact figures of the hot period's records: their number n, the "
            "positive class's share (the prior's accuracy) and each attack's accuracy",
            "to": ["analyst", "admin"],
            "readers": "the exact figures: admins and the audit's creator; other keys: that "
            "it exists, when, and of which release",
            "created": "on an analyst's or admin's request (POST /v1/audits/reidentification)",
            "lifetime": "deleted at the roll that ends its oldest window's hot period, and at "
            f"most {inp.rt.config.window_seconds} s (window_seconds) after its creation; the "
            "ledger shows the latest finished one",
            "items": items,
        }
    ]


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat(timespec="seconds").replace("+00:00", "Z")


async def cold_store(inp: LedgerInput) -> list[dict[str, Any]]:
    """The cold store: every raw row, sealed, released only by an export under a grant of M of
    N admins (not DP); how long it keeps a window's rows (``cold_retention_windows``,
    ``SELECTIVITY_COLD_RETENTION_DAYS``), and the grants open now: all of them to admins, a
    requester's own to the requester."""
    cfg = inp.rt.config
    limits = []
    if cfg.cold_retention_windows is not None:
        limits.append(f"{cfg.cold_retention_windows} windows old (cold_retention_windows)")
    days = inp.ctx.settings.cold_retention_days
    if days is not None:
        limits.append(f"closed {days:g} days ago (SELECTIVITY_COLD_RETENTION_DAYS)")
    lifetime = (
        "a window's rows are deleted once its hot data is gone and it is "
        + " or ".join(limits)
        + ", whichever comes first"
        if limits
        else "kept for good: neither cold_retention_windows nor SELECTIVITY_COLD_RETENTION_DAYS "
        "is set"
    )
    now = datetime.now(UTC)
    q = select(UnlockRequest).where(
        UnlockRequest.stream_id == inp.rt.id,
        UnlockRequest.status == "granted",
        UnlockRequest.expires_at > now,
    )
    if not inp.viewer.admin:
        q = q.where(UnlockRequest.requested_by == inp.viewer.key_id)
    items = [
        {
            "id": g.id,
            "yours": g.requested_by == inp.viewer.key_id,
            "windows": None if g.from_epoch is None else [g.from_epoch, g.to_epoch],
            "created_at": _iso(g.granted_at),
            "expires_at": _iso(g.expires_at),
        }
        for g in await inp.session.scalars(q.order_by(UnlockRequest.granted_at))
    ]
    return [
        {
            "kind": "cold-store export",
            "dp": False,
            "guarantee": "non-DP: raw rows, under a grant approved by M of N admins",
            **NON_DP,
            "reveals": "the raw rows of the windows (or times) a grant names: every feature, "
            "the label, the row's id and arrival time",
            "to": ["analyst"],
            "readers": "the analyst who filed the request, while its grant is open (approved "
            "by the threshold of distinct admins, never the requester's actor); every request, "
            "approval and export is in the audit log",
            "created": "sealed from the hot windows by the seal job; exported on request "
            "(POST /v1/admin/unlock-requests, then the admins' approvals)",
            "lifetime": lifetime + "; a grant lasts its TTL, at most 86,400 s",
            "items": items,
        }
    ]


KINDS: list[ReleaseKind] = [
    count_tables,
    table_selection,
    hot_rows,
    annotation_queues,
    annotation_queue_scores,
    k_anonymised,
    reidentification_audits,
    cold_store,
]
"""Every release kind of a stream, in the ledger's order: append a kind's function here."""


async def collect(inp: LedgerInput) -> list[dict[str, Any]]:
    """The ``releases`` section: every kind's entries, in ``KINDS``' order."""
    out: list[dict[str, Any]] = []
    for kind in KINDS:
        out += await kind(inp)
    return out

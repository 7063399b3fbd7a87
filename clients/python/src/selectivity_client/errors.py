"""Typed errors, built from the service's error bodies ``{"error": "<Kind>", "detail": "..."}``.

Every error the client raises for an HTTP answer is a :class:`SelectivityError` subclass named
after the service's own ``error`` kind (``NotFound``, ``RetrainRequired``, ...); a kind this
client does not know falls back to the class of its status code.
"""

from __future__ import annotations

from typing import ClassVar

import httpx


class SelectivityError(Exception):
    """An error answer of the service (``status``, ``kind``, ``detail``) or, for
    :class:`Unavailable` after the retries, no answer at all (``status`` 0)."""

    status_code: ClassVar[int] = 0

    def __init__(self, detail: str, *, status: int | None = None, kind: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = self.status_code if status is None else status
        self.kind = kind or type(self).__name__

    def __str__(self) -> str:
        return f"{self.kind} ({self.status}): {self.detail}" if self.status else self.detail


class BadRequest(SelectivityError):
    status_code = 400


class Unauthorized(SelectivityError):
    status_code = 401


class Forbidden(SelectivityError):
    status_code = 403


class NotFound(SelectivityError):
    status_code = 404


class Conflict(SelectivityError):
    status_code = 409


class RetrainRequired(Conflict):
    """The model trained before the current epoch and its grace period is over: train on the
    current train set and report it (``report_trained``)."""


class PayloadTooLarge(SelectivityError):
    status_code = 413


class UnsupportedMediaType(SelectivityError):
    status_code = 415


class ValidationError(SelectivityError):
    status_code = 422


class Unavailable(SelectivityError):
    """503 (the stream exists but is not ready yet), or no connection, after the retries."""

    status_code = 503


KINDS: dict[str, type[SelectivityError]] = {
    c.__name__: c
    for c in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        Conflict,
        RetrainRequired,
        PayloadTooLarge,
        UnsupportedMediaType,
        ValidationError,
        Unavailable,
    )
}
BY_STATUS: dict[int, type[SelectivityError]] = {
    c.status_code: c for c in KINDS.values() if c is not RetrainRequired
}


def from_response(resp: httpx.Response) -> SelectivityError:
    """The typed error of an error answer whose body has been read. FastAPI's own 422 bodies
    (``{"detail": [{"loc": [...], "msg": ...}]}``) are rendered as ``field: message``."""
    kind: str | None = None
    detail: str
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        kind = body.get("error") if isinstance(body.get("error"), str) else None
        raw = body.get("detail")
        if isinstance(raw, list):
            parts = []
            for item in raw:
                if isinstance(item, dict):
                    loc = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
                    parts.append(f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg")))
            detail = "; ".join(parts) or str(raw)
        else:
            detail = str(raw) if raw is not None else resp.reason_phrase
    else:
        detail = resp.text[:300] or resp.reason_phrase
    cls = KINDS.get(kind or "") or BY_STATUS.get(resp.status_code) or SelectivityError
    return cls(detail, status=resp.status_code, kind=kind or cls.__name__)

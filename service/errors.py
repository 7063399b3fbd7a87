"""One error hierarchy, one handler: ``{"error": ClassName, "detail": ...}``."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel


class ErrorBody(BaseModel):
    error: str
    detail: str


class ServiceError(Exception):
    status_code: ClassVar[int] = 400
    headers: dict[str, str] | None = None
    """Response headers the handler adds (e.g. ``Retry-After``)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class BadRequest(ServiceError):
    status_code = 400


class Unauthorized(ServiceError):
    status_code = 401


class Forbidden(ServiceError):
    status_code = 403


class NotFound(ServiceError):
    status_code = 404


class Conflict(ServiceError):
    status_code = 409


class PayloadTooLarge(ServiceError):
    status_code = 413


class UnsupportedMediaType(ServiceError):
    status_code = 415


class ValidationError(ServiceError):
    status_code = 422


class TooManyRequests(ServiceError):
    """429 with ``Retry-After``: a limit on how much one key, or everyone, may ask for at once."""

    status_code = 429

    def __init__(self, detail: str, *, retry_after: int) -> None:
        super().__init__(detail)
        self.retry_after = max(1, int(retry_after))
        self.headers = {"Retry-After": str(self.retry_after)}


class Unavailable(ServiceError):
    status_code = 503


def error_responses(*errors: type[ServiceError]) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route, so OpenAPI shows its errors."""
    return {e.status_code: {"model": ErrorBody, "description": e.__name__} for e in errors}


class RetrainRequired(Conflict):
    """A model trained before the current epoch, past its grace period."""

"""The OpenAPI document, made true to what the service sends (issue 13 item 6).

FastAPI documents every 422 as its own ``{"detail": [...]}`` list, but the one error handler
(``service.app``) sends ``{"error": <kind>, "detail": <string>}`` for every error; and the
answers that come before any route code (401 without a valid key, 403 for a role the route does
not admit, 413 for a body over the limit, 415 for a body that is not JSON) are declared nowhere.
This rewrites the generated document so that every error status an operation can answer is
declared, each with the ``ErrorBody`` schema, and drops FastAPI's unused validation schemas.
``tests/api/test_openapi.py`` checks the document and runs a schema fuzzer (Schemathesis)
against a live server: no response may contradict it."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from service.errors import ErrorBody

ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}

# Status → (error kind, when): added to an operation where it applies.
AUTH_ERRORS = {
    401: "Unauthorized: no 'Authorization: Bearer <api key>' header, or an unknown key",
    403: "Forbidden: the key's role may not call this operation",
}
BODY_ERRORS = {
    413: "PayloadTooLarge: the body (or a batch in it) is over its documented limit",
    415: "UnsupportedMediaType: the body was not sent as 'Content-Type: application/json'",
    429: "TooManyRequests: a large body found no free slot in time (Retry-After)",
}
VALIDATION = "ValidationError: a parameter or the body is invalid; detail names the field"
NOT_FOUND = "NotFound: the resource named in the path does not exist"


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ERROR_REF}}}


def rewrite(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (FastAPI's) with every error response declared as ``ErrorBody``."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas["ErrorBody"] = ErrorBody.model_json_schema()
    for path, item in document.get("paths", {}).items():
        for op in item.values():
            responses: dict[str, Any] = op.setdefault("responses", {})
            for code, response in responses.items():
                if code.startswith(("4", "5")):
                    response["content"] = {"application/json": {"schema": ERROR_REF}}
            wanted: dict[int, str] = {}
            has_params = bool(op.get("parameters")) or "requestBody" in op
            if has_params:
                wanted[422] = VALIDATION
            if op.get("security"):
                wanted.update(AUTH_ERRORS)
            if "requestBody" in op:
                wanted.update(BODY_ERRORS)
            if "{" in path:
                wanted[404] = NOT_FOUND
            for status, description in wanted.items():
                if str(status) not in responses:
                    responses[str(status)] = _error(description)
            if "422" in responses:
                responses["422"]["description"] = VALIDATION
    text = str(document["paths"])
    for unused in ("HTTPValidationError", "ValidationError"):
        if f"#/components/schemas/{unused}'" not in text:
            schemas.pop(unused, None)
    return document


def install(app: FastAPI) -> None:
    """Serve the rewritten document at ``/openapi.json`` (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = rewrite(
                get_openapi(
                    title=app.title,
                    version=app.version,
                    description=app.description,
                    routes=app.routes,
                )
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

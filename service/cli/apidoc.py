"""docs/API.md, rendered from the routes themselves: every operation of ``/openapi.json`` with
the roles its key may have, its body limit, its rate-limit class, what it does (the route's
docstring) and every error it can answer (the OpenAPI document as ``service.api.openapi``
rewrites it). ``tests/api/test_apidoc.py`` fails when docs/API.md differs from what this
renders, so the reference can never leave an operation out or say what the code does not.

Regenerate with ``python -m service.cli.apidoc > docs/API.md``."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, routing
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from service.api.limits import LARGE_BODY_ROUTES
from service.api.ratelimit import CAPS, CLASSES
from service.app import create_app
from service.config import RATE_LIMITS, Settings

HEADER = """# API reference

Every operation of the HTTP API, generated from the routes by `python -m service.cli.apidoc`
(a test fails when this page and the code disagree). The same operations, with their schemas,
are in `/openapi.json` and browsable at `/docs` on a running server.

Every request carries `Authorization: Bearer <api key>`; the key's role decides what it may
call (`admin` may call everything). Errors are `{"error": <kind>, "detail": <text>}` with the
status below; `detail` names the field and the limit. Bodies are JSON
(`Content-Type: application/json`) of at most `SELECTIVITY_MAX_SMALL_BODY_BYTES` ({small} by
default), or `SELECTIVITY_MAX_BODY_BYTES` ({large}) where the operation takes a batch. Rate
limits are per key and class (`SELECTIVITY_RATE_LIMITS`, defaults below); past one, 429 with
`Retry-After`. `/healthz` and `/readyz` need no key; `/metrics` needs the metrics token
(docs/OPERATIONS.md, "Production").

| class | default limit | operations |
|---|---|---|
{classes}
"""


def _walk(dependant: Dependant) -> Iterator[Any]:
    for sub in dependant.dependencies:
        yield sub.call
        yield from _walk(sub)


def roles(route: APIRoute) -> str:
    """The roles the route's key dependency admits, or who may call it when it has none."""
    found = [getattr(call, "roles", None) for call in _walk(route.dependant)]
    sets = [r for r in found if r]
    if sets:
        admitted = frozenset.intersection(*sets)
        if admitted >= {"producer", "model", "curator", "annotator", "analyst"}:
            return "any role"
        return ", ".join(sorted(admitted, key=lambda r: (r == "admin", r)))
    names = {getattr(call, "__name__", "") for call in _walk(route.dependant)}
    if "current_key" in names:
        return "any key"
    return "no key"


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n / 2**10:g} KiB"


def _limit(cls: str) -> str:
    value = RATE_LIMITS[cls]
    if value is None:
        return "off"
    count, seconds = value
    return f"{count} per {seconds:g} s"


def _operations(app: FastAPI) -> list[tuple[str, str, APIRoute]]:
    """(method, full path, route) of every documented operation, in the app's order (a route
    of an included router is seen through its context, which has the prefixed path)."""
    ops = []
    for context in routing.iter_route_contexts(app.routes):
        route, path = context.original_route, context.path
        if isinstance(route, APIRoute) and route.include_in_schema and path:
            for method in sorted(route.methods or ()):
                ops.append((method, path, route))
    return ops


def _errors(op: dict[str, Any]) -> list[str]:
    rows = []
    for code, response in sorted(op.get("responses", {}).items()):
        if code.startswith(("4", "5")):
            text = " ".join(str(response.get("description", "")).split())
            rows.append(f"| {code} | {text.replace('|', '/')} |")
    return rows


def render(app: FastAPI) -> str:
    document = app.openapi()
    ops = _operations(app)
    by_class: dict[str, list[str]] = {}
    for method, path, _ in ops:
        cls = CLASSES.get((method, path))
        if cls:
            by_class.setdefault(cls, []).append(f"`{method} {path}`")
    classes = "\n".join(
        f"| {cls} | {_limit(cls)} | {len(by_class.get(cls, []))} |" for cls in RATE_LIMITS
    )
    defaults = Settings.model_fields
    out = [
        HEADER.replace("{classes}", classes)
        .replace("{small}", _mib(defaults["max_small_body_bytes"].default))
        .replace("{large}", _mib(defaults["max_body_bytes"].default))
    ]
    tags: dict[str, list[tuple[str, str, APIRoute]]] = {}
    for method, path, route in ops:
        tag = (document["paths"][path][method.lower()].get("tags") or ["other"])[0]
        tags.setdefault(str(tag), []).append((method, path, route))
    out.append("## Contents\n")
    for tag, items in tags.items():
        links = ", ".join(f"`{m} {p}`" for m, p, _ in items)
        out.append(f"- **{tag}**: {links}")
    for tag, items in tags.items():
        out.append(f"\n## {tag[:1].upper() + tag[1:]}\n")
        for method, path, route in items:
            op = document["paths"][path][method.lower()]
            out.append(f"### `{method} {path}`\n")
            doc = inspect.cleandoc(route.endpoint.__doc__ or "") or route.summary or route.name
            out.append(doc + "\n")
            facts = [f"role: {roles(route)}"]
            cls = CLASSES.get((method, path))
            facts.append(
                f"rate limit: class `{cls}` ({_limit(cls)})" if cls else "rate limit: none"
            )
            if "requestBody" in op:
                large = (method, path) in LARGE_BODY_ROUTES
                facts.append(
                    "body: up to `SELECTIVITY_MAX_BODY_BYTES`"
                    if large
                    else "body: up to `SELECTIVITY_MAX_SMALL_BODY_BYTES`"
                )
            cap = CAPS.get((method, path))
            if cap:
                facts.append(f"at most `SELECTIVITY_{cap[1].upper()}` {cap[0]} per key")
            ok = sorted(c for c in op.get("responses", {}) if c.startswith("2"))
            facts.append("success: " + ", ".join(ok))
            out.append("- " + "\n- ".join(facts) + "\n")
            errors = _errors(op)
            if errors:
                out.append("| status | when |\n|---|---|\n" + "\n".join(errors) + "\n")
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    sys.stdout.write(render(create_app()))


if __name__ == "__main__":
    main()

"""The annotator page and the curator dashboard (docs/ARCHITECTURE.md, "Annotation queues"):
static HTML and JavaScript
served by the API, no build step. The pages hold no secrets: the user types an API key, kept
in the tab's sessionStorage and sent as a Bearer header to the /v1 endpoints. A strict
Content-Security-Policy allows only this origin's scripts, and the scripts write example text
with ``textContent`` only, so a released example cannot inject markup."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, Path
from fastapi.responses import Response

from service.api.deps import JsonRoute
from service.errors import NotFound

router = APIRouter(tags=["web"], include_in_schema=False, route_class=JsonRoute)

STATIC = files("service.web").joinpath("static")
TYPES = {
    "annotator.js": "text/javascript",
    "curator.js": "text/javascript",
    "common.js": "text/javascript",
    "anonymize.js": "text/javascript",
    "style.css": "text/css",
}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _page(name: str, media_type: str) -> Response:
    return Response(STATIC.joinpath(name).read_bytes(), media_type=media_type, headers=HEADERS)


@router.get("/ui/annotate")
async def annotator_page() -> Response:
    return _page("annotator.html", "text/html; charset=utf-8")


@router.get("/ui/curate")
async def curator_page() -> Response:
    return _page("curator.html", "text/html; charset=utf-8")


@router.get("/ui/anonymize")
async def anonymize_page() -> Response:
    return _page("anonymize.html", "text/html; charset=utf-8")


@router.get("/ui/static/{name}")
async def static(name: str = Path(max_length=40)) -> Response:
    media_type = TYPES.get(name)
    if media_type is None:
        raise NotFound(f"no static file {name!r}")
    return _page(name, media_type)

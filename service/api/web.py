"""The pages (docs/ARCHITECTURE.md, "HTTP API", "Who uses it"): the privacy officer's console
(streams, break glass, audit log), the annotator page and the curator dashboard ("Annotation
queues"), the k-anonymisation page, and Swagger UI at ``/docs``: static HTML and JavaScript
served by the API, no build step (the navigation and the console's sign-in form are written
once, ``static/_*.html``, and filled in when a page is served), nothing loaded from another host
(Swagger UI's assets come from the ``fastapi-offline`` package, not a CDN). The pages hold no
secrets: the user types an API key, kept in the tab's sessionStorage and sent as a Bearer header
to the /v1 endpoints. A strict Content-Security-Policy allows only this origin's scripts, and
the scripts write text from the API with ``textContent`` only, so a released example cannot
inject markup."""

from __future__ import annotations

import functools
import re
from importlib.resources import files

from fastapi import APIRouter, Path
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

from service.api.deps import JsonRoute
from service.errors import NotFound

router = APIRouter(tags=["web"], include_in_schema=False, route_class=JsonRoute)

STATIC = files("service.web").joinpath("static")
TYPES = {
    "annotator.js": "text/javascript",
    "curator.js": "text/javascript",
    "common.js": "text/javascript",
    "anonymize.js": "text/javascript",
    "console.js": "text/javascript",
    "console-home.js": "text/javascript",
    "console-streams.js": "text/javascript",
    "console-breakglass.js": "text/javascript",
    "console-audit.js": "text/javascript",
    "style.css": "text/css",
    "console.css": "text/css",
}
CONSOLE = {
    "streams": "console-streams.html",
    "break-glass": "console-breakglass.html",
    "audit": "console-audit.html",
}
# the pieces every page shares, written once: ``<!--#include NAME-->`` in a page stands for
# ``_NAME.html``; the navigation marks the page's own link with aria-current
INCLUDE = re.compile(r"<!--#include (nav|signin)-->\n")
SWAGGER = files("fastapi_offline").joinpath("static")
SWAGGER_TYPES = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon.png": "image/png",
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


@functools.cache
def _html(name: str, page: str) -> bytes:
    """Page ``name`` with its includes filled in, its own link (``data-page``) marked
    current."""
    text = INCLUDE.sub(
        lambda m: STATIC.joinpath(f"_{m.group(1)}.html").read_text("utf-8"),
        STATIC.joinpath(name).read_text("utf-8"),
    )
    mark = f'data-page="{page}">'
    if text.count(mark) != 1:
        raise RuntimeError(f"{name}: no single navigation link for page {page!r}")
    return text.replace(mark, f'data-page="{page}" aria-current="page">').encode()


def _html_page(name: str, page: str) -> Response:
    return Response(_html(name, page), media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/ui/annotate")
async def annotator_page() -> Response:
    return _html_page("annotator.html", "annotate")


@router.get("/ui/curate")
async def curator_page() -> Response:
    return _html_page("curator.html", "curate")


@router.get("/ui/anonymize")
async def anonymize_page() -> Response:
    return _html_page("anonymize.html", "anonymize")


@router.get("/ui/static/{name}")
async def static(name: str = Path(max_length=40)) -> Response:
    media_type = TYPES.get(name)
    if media_type is None:
        raise NotFound(f"no static file {name!r}")
    return _page(name, media_type)


@router.get("/ui/")
@router.get("/ui")
async def console_home() -> Response:
    return _html_page("console.html", "home")


@router.get("/ui/console/{name}")
async def console_page(name: str = Path(max_length=20)) -> Response:
    page = CONSOLE.get(name)
    if page is None:
        raise NotFound(f"no console page {name!r}; there are {sorted(CONSOLE)}")
    return _html_page(page, name)


@router.get("/docs")
async def swagger_ui() -> HTMLResponse:
    """Swagger UI from this server only: the package's assets, no validator badge (which
    would send the document to validator.swagger.io)."""
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="Selectivity API",
        swagger_js_url="/ui/docs-static/swagger-ui-bundle.js",
        swagger_css_url="/ui/docs-static/swagger-ui.css",
        swagger_favicon_url="/ui/docs-static/favicon.png",
        swagger_ui_parameters={"validatorUrl": None, "persistAuthorization": False},
    )


@router.get("/favicon.ico")
async def favicon() -> Response:
    return await swagger_asset("favicon.png")


@router.get("/ui/docs-static/{name}")
async def swagger_asset(name: str = Path(max_length=40)) -> Response:
    media_type = SWAGGER_TYPES.get(name)
    if media_type is None:
        raise NotFound(f"no Swagger UI asset {name!r}")
    return Response(
        SWAGGER.joinpath(name).read_bytes(),
        media_type=media_type,
        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "max-age=3600"},
    )

"""The pages' shared pieces (the navigation, the console's sign-in form) are written once
(``service/web/static/_*.html``) and filled in by the server: every page is served whole, with
exactly one navigation whose current link is the page itself."""

from __future__ import annotations

import re

import pytest

from tests.conftest import Api

PAGES = {
    "/ui/": "home",
    "/ui/console/streams": "streams",
    "/ui/console/break-glass": "break-glass",
    "/ui/console/audit": "audit",
    "/ui/annotate": "annotate",
    "/ui/curate": "curate",
    "/ui/anonymize": "anonymize",
}
CONSOLE = ("/ui/", "/ui/console/streams", "/ui/console/break-glass", "/ui/console/audit")


@pytest.mark.parametrize("path", sorted(PAGES))
async def test_each_page_is_served_with_its_navigation_and_sign_in(api: Api, path: str) -> None:
    r = await api.client.get(path)
    assert r.status_code == 200, r.text
    html = r.text
    assert "<!--#include" not in html
    assert html.count('<nav class="top"') == 1
    current = re.findall(r'data-page="([a-z-]+)" aria-current="page"', html)
    assert current == [PAGES[path]]
    assert all(f'data-page="{p}"' in html for p in PAGES.values())
    assert html.count('id="signin"') == (1 if path in CONSOLE else 0)
    assert "Content-Security-Policy" in r.headers


async def test_the_shared_pieces_are_not_served_alone(api: Api) -> None:
    for name in ("_nav.html", "_signin.html"):
        assert (await api.client.get(f"/ui/static/{name}")).status_code == 404

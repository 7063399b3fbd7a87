"""The k-anonymisation page in headless Chromium (as ``tests/web/test_pages.py``: Debian's
``chromium`` driven by Playwright; skipped without them unless SELECTIVITY_REQUIRE_BROWSER=1):
inline CSV rows, one iML answer moving the weight sliders, a run to its end through the real
worker, NGIL and the per-attribute loss shown, and a downloaded CSV that is k-anonymous."""

from __future__ import annotations

import csv
import io
import random
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from tests.serving import serving
from tests.web.test_pages import ARGS, CHROMIUM, browser_ok  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory,
    browser_ok: None,  # noqa: F811
) -> Iterator[tuple[str, str]]:
    with serving(tmp_path_factory.mktemp("anon-web")) as srv:
        yield srv.base, srv.admin_key
        srv.stop()


def test_the_page_runs_a_release_and_downloads_it(server: tuple[str, str]) -> None:
    from playwright.sync_api import expect, sync_playwright

    base, admin = server
    r = httpx.post(
        f"{base}/v1/admin/keys",
        headers={"Authorization": f"Bearer {admin}"},
        json={"role": "analyst"},
    )
    assert r.status_code in (200, 201), r.text
    key = r.json()["key"]
    rnd = random.Random(4)
    lines = ["age,sex,income"] + [
        f"{rnd.randint(18, 80)},{rnd.choice('FM')},{rnd.choice(['low', 'high'])}" for _ in range(40)
    ]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{base}/ui/anonymize")
            expect(page.locator("#notice")).to_contain_text(
                "k-anonymity is a syntactic guarantee, not differential privacy"
            )
            expect(page.locator("#notice")).to_contain_text("does not compose with it")
            page.fill("#key", key)
            page.fill("#csv", "\n".join(lines))
            page.click("#load")
            page.select_option("select[data-column='income']", "keep")
            page.fill("#k", "4")
            page.click("#learn")
            expect(page.locator("#answered")).to_have_text("Answered: 0")
            page.click("#pick0")
            expect(page.locator("#answered")).to_have_text("Answered: 1")
            # the answer moved the weights off equal, and the sliders with them
            sliders = page.locator("input.weight").evaluate_all("s => s.map(e => e.value)")
            assert sliders[:2] != ["10", "10"], sliders
            page.click("#run")
            expect(page.locator("#ngil")).to_contain_text("NGIL", timeout=30_000)
            expect(page.locator("#ngil")).to_contain_text("40 rows")
            expect(page.locator("#loss")).to_contain_text("age")
            expect(page.locator("#progress")).to_have_js_property("value", 1)
            with page.expect_download() as info:
                page.click("button[data-format='csv']")
            with open(info.value.path(), encoding="utf-8") as f:
                downloaded = f.read()  # (the file goes with the browser)
            assert errors == []
        finally:
            browser.close()
    table = list(csv.DictReader(io.StringIO(downloaded)))
    assert len(table) == 40 and list(table[0]) == ["cluster", "age", "sex", "income"]
    assert min(Counter((t["age"], t["sex"]) for t in table).values()) >= 4
    assert [t["income"] for t in table] == [line.split(",")[2] for line in lines[1:]]
    headers = httpx.get(f"{base}/ui/anonymize").headers
    assert "default-src 'self'" in headers["content-security-policy"]

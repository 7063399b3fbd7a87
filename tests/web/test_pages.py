"""The annotator page and the curator dashboard in headless Chromium (Debian's ``chromium``,
driven by Playwright; never ``playwright install``). Starts the real service as ``selectivity
serve`` does (uvicorn on a free port, embedded Redis and SQLite), labels examples through the
page with a click and with the number keys, skips one, and finds the labels in the export.

Without Chromium or Playwright the test skips, saying why; CI sets
SELECTIVITY_REQUIRE_BROWSER=1 (``.ci/run``) so that there it fails instead."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import unavailable
from tests.serving import serving

pytestmark = pytest.mark.slow  # `selectivity serve` in a subprocess, and Chromium

CHROMIUM = os.environ.get("SELECTIVITY_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _missing() -> str | None:
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[dev]')"
    return None


@pytest.fixture(scope="module")
def browser_ok() -> None:
    why = _missing()
    if why:
        unavailable(why, required_by="SELECTIVITY_REQUIRE_BROWSER")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, browser_ok: None) -> Iterator[tuple[str, str]]:
    # the worker's crons (the queue's release among them) every second
    with serving(tmp_path_factory.mktemp("web"), SCHEDULER_SECONDS="1") as srv:
        yield srv.base, srv.admin_key
        srv.stop()


def test_annotator_labels_through_the_page_and_the_export_has_them(
    server: tuple[str, str],
) -> None:
    from playwright.sync_api import expect, sync_playwright

    base, admin = server
    h = {"Authorization": f"Bearer {admin}"}
    keys = {}
    for role in ("curator", "annotator"):
        r = httpx.post(f"{base}/v1/admin/keys", headers=h, json={"role": role})
        assert r.status_code in (200, 201), r.text
        keys[role] = r.json()["key"]
    cur = {"Authorization": f"Bearer {keys['curator']}"}
    q = "intents"
    r = httpx.post(
        f"{base}/v1/queues",
        headers=cur,
        json={
            "name": q,
            "beta": 0.99,
            "k": 1,
            "labels": ["no", "yes"],
            "lease_seconds": 30,
            "release_seconds": 1,  # released by the worker's cron within a few seconds
            "accept_delta_above_ceiling": True,  # δ = 0.99: the page must say so
        },
    )
    assert r.status_code == 201, r.text
    texts = {"turn on the lights": 0.9, "play some jazz": 0.6, "what time is it": 0.3}
    # each sent 6 times: with β = 0.99 and k = 1 all three are released (fails with p ≈ 1e-12)
    cands = [{"text": t, "uncertainty": u} for t, u in texts.items() for _ in range(6)]
    r = httpx.post(f"{base}/v1/queues/{q}/candidates", headers=cur, json={"candidates": cands})
    assert r.status_code == 200 and r.json() == {"received": 18}
    deadline = time.monotonic() + 60  # the release job runs every SCHEDULER_SECONDS
    while httpx.get(f"{base}/v1/queues/{q}/stats", headers=cur).json()["released"] < 3:
        assert time.monotonic() < deadline, "the period was not released within 60 s"
        time.sleep(0.5)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{base}/ui/annotate?queue={q}")
            page.fill("#key", keys["annotator"])
            page.click("#start")
            example = page.locator("#example")
            expect(example).to_have_text("turn on the lights")  # most uncertain first
            page.click("button[data-label='yes']")
            expect(example).to_have_text("play some jazz")
            page.keyboard.press("s")  # skip: it goes back, not to me
            expect(example).to_have_text("what time is it")
            page.keyboard.press("1")  # key 1: the first label, 'no'
            expect(example).to_contain_text("No example is waiting")
            expect(page.locator("#progress")).to_contain_text("You labelled 2")
            assert page.locator("#status").text_content() == ""

            dash = browser.new_page()
            dash.on("pageerror", lambda e: errors.append(str(e)))
            dash.goto(f"{base}/ui/curate?queue={q}")
            dash.fill("#key", keys["curator"])
            dash.click("#show")
            expect(dash.locator("#stats")).to_contain_text("labelled")
            expect(dash.locator("#stats")).to_contain_text("no: 1, yes: 1")
            expect(dash.locator("#privacy")).to_contain_text("β = 0.99, k = 1")
            guarantee = dash.locator("#guarantee")
            expect(guarantee).to_contain_text(
                "Warning: δ = 0.99 is above the operator's ceiling of 1e-06 and was accepted "
                "explicitly"
            )
            expect(guarantee).to_contain_text("times more or less likely with that candidate")
            expect(guarantee).to_have_class("warning")
            expect(dash.locator("#stats")).not_to_contain_text("sampled")
            expect(dash.locator("#stats")).to_contain_text("next release")
            expect(dash.locator("#histogram > div")).to_have_count(10)
            assert errors == []
        finally:
            browser.close()

    export = httpx.get(f"{base}/v1/queues/{q}/labels", headers=cur).json()["labels"]
    assert sorted((x["text"], x["label"]) for x in export) == [
        ("turn on the lights", "yes"),
        ("what time is it", "no"),
    ]
    page_headers = httpx.get(f"{base}/ui/annotate").headers
    assert "default-src 'self'" in page_headers["content-security-policy"]

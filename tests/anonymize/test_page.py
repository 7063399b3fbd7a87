"""The k-anonymisation page in headless Chromium (as ``tests/web/test_pages.py``: Debian's
``chromium`` driven by Playwright; skipped without them unless SELECTIVITY_REQUIRE_BROWSER=1):
inline CSV rows, one iML answer moving the weight sliders, a run to its end through the real
worker, NGIL and the per-attribute loss shown, and a downloaded CSV that is k-anonymous; full
generalisation trees (a shipped Adult example and a custom one read from a file) used by a run,
and the example trees served as they are in ``examples/adult/hierarchies``."""

from __future__ import annotations

import csv
import io
import json
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.core.anonymity.hierarchy import lca_by_walk, parse_hierarchy
from tests.serving import serving
from tests.web.test_pages import ARGS, CHROMIUM, browser_ok  # noqa: F401

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "adult" / "hierarchies"


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory,
    browser_ok: None,  # noqa: F811
) -> Iterator[tuple[str, str]]:
    with serving(tmp_path_factory.mktemp("anon-web")) as srv:
        yield srv.base, srv.admin_key
        srv.stop()


@pytest.fixture(scope="module")
def analyst(server: tuple[str, str]) -> str:
    base, admin = server
    r = httpx.post(
        f"{base}/v1/admin/keys",
        headers={"Authorization": f"Bearer {admin}"},
        json={"role": "analyst"},
    )
    assert r.status_code in (200, 201), r.text
    return str(r.json()["key"])


def test_the_page_runs_a_release_and_downloads_it(server: tuple[str, str], analyst: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    base, key = server[0], analyst
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


def test_the_example_trees_are_served_as_shipped(server: tuple[str, str], analyst: str) -> None:
    base = server[0]
    url = f"{base}/v1/anonymizations/example-hierarchies"
    assert httpx.get(url).status_code == 401
    r = httpx.get(url, headers={"Authorization": f"Bearer {analyst}"})
    assert r.status_code == 200, r.text
    shipped = {p.stem: json.loads(p.read_text()) for p in sorted(EXAMPLES.glob("*.json"))}
    assert len(shipped) == 8
    # the package's copy (service/web/static/anonymize-example-hierarchies.json) must be
    # regenerated from examples/adult/hierarchies when a tree there changes
    assert r.json() == {"adult": shipped}


def test_a_run_uses_full_trees_from_the_examples_and_a_file(
    server: tuple[str, str], analyst: str, tmp_path: Path
) -> None:
    """workclass with the shipped Adult tree, colour with a custom tree loaded from a file:
    the released values are the trees' lowest common ancestors of each cluster's values,
    inner nodes that the flat tree does not have."""
    from playwright.sync_api import expect, sync_playwright

    base = server[0]
    colours = {
        "value": "any colour",
        "children": [
            {"value": "warm", "children": [{"value": "red"}, {"value": "orange"}]},
            {"value": "cold", "children": [{"value": "blue"}, {"value": "green"}]},
        ],
    }
    tree_file = tmp_path / "colours.json"
    tree_file.write_text(json.dumps(colours))
    pairs = [("State-gov", "red"), ("Local-gov", "orange")] * 3 + [
        ("Self-emp-inc", "blue"),
        ("Self-emp-not-inc", "green"),
    ] * 3
    rnd = random.Random(5)
    rnd.shuffle(pairs)
    lines = ["workclass,colour,income"] + [
        f"{w},{c},{rnd.choice(['low', 'high'])}" for w, c in pairs
    ]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{base}/ui/anonymize")
            expect(page.locator("#notice")).to_contain_text("data-independent generalisation")
            page.fill("#key", analyst)
            page.fill("#csv", "\n".join(lines))
            page.click("#load")
            page.select_option("select[data-column='income']", "keep")
            expect(page.locator("select.tree[data-column='income']")).to_be_disabled()
            page.select_option("select.tree[data-column='workclass']", "example:adult:workclass")
            page.select_option("select.tree[data-column='colour']", "custom")
            page.set_input_files("input.tree-file[data-column='colour']", str(tree_file))
            expect(page.locator("textarea.tree-json[data-column='colour']")).to_have_value(
                tree_file.read_text()
            )
            page.fill("#k", "6")
            page.click("#run")
            expect(page.locator("#ngil")).to_contain_text("12 rows", timeout=30_000)
            with page.expect_download() as info:
                page.click("button[data-format='csv']")
            with open(info.value.path(), encoding="utf-8") as f:
                downloaded = f.read()
            assert errors == []
        finally:
            browser.close()
    table = list(csv.DictReader(io.StringIO(downloaded)))
    assert [(t["income"]) for t in table] == [line.split(",")[2] for line in lines[1:]]
    trees = {
        "workclass": parse_hierarchy(json.loads((EXAMPLES / "workclass.json").read_text())),
        "colour": parse_hierarchy(colours),
    }
    clusters: dict[str, list[int]] = {}
    for i, t in enumerate(table):
        clusters.setdefault(t["cluster"], []).append(i)
    assert min(len(rows) for rows in clusters.values()) >= 6
    for name, h in trees.items():
        index = h.index()
        inner = {h.names[n] for n in range(1, len(h.names)) if h.subtree_height[n] > 0}
        for rows in clusters.values():
            original = [
                index[lines[1 + i].split(",")[0 if name == "workclass" else 1]] for i in rows
            ]
            released = {table[i][name] for i in rows}
            assert released == {h.names[lca_by_walk(h, original)]}
        # the greedy keeps each cluster inside one branch: inner nodes, not the flat tree's
        assert {t[name] for t in table} <= inner, name

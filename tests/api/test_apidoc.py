"""docs/API.md is the reference of every operation: it is what ``service.cli.apidoc`` renders
from the routes (roles, limits, rate-limit classes, errors), so it can neither leave an
operation out nor say what the code does not."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI

from service.cli import apidoc

DOC = Path(__file__).resolve().parents[2] / "docs" / "API.md"


def test_api_md_is_what_the_routes_render(default_app: FastAPI) -> None:
    rendered = apidoc.render(default_app)
    assert DOC.read_text() == rendered, (
        "docs/API.md is out of date: python -m service.cli.apidoc > docs/API.md"
    )


def test_every_operation_of_the_openapi_document_has_a_section(default_app: FastAPI) -> None:
    text = DOC.read_text()
    ops = [
        f"### `{method.upper()} {path}`"
        for path, item in default_app.openapi()["paths"].items()
        for method in item
    ]
    assert len(ops) >= 49
    missing = [op for op in ops if op not in text]
    assert not missing, missing


def test_each_operation_says_who_may_call_it() -> None:
    sections = DOC.read_text().split("\n### ")[1:]
    for section in sections:
        assert "\n- role: " in section, section.splitlines()[0]
        assert "role: no key" not in section, section.splitlines()[0]

"""Queue tests need curator and annotator keys besides the shared ones."""

from __future__ import annotations

import pytest

from tests.conftest import Api


@pytest.fixture
async def qapi(api: Api) -> Api:
    await api.add_keys(curator="curator", ann1="annotator", ann2="annotator")
    return api

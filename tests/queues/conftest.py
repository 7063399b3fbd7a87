"""Queue tests need curator and annotator keys besides the shared ones."""

from __future__ import annotations

import pytest

from service.admin import service as keys_service
from tests.conftest import Api


@pytest.fixture
async def qapi(api: Api) -> Api:
    async with api.ctx.sessionmaker() as session, session.begin():
        for role, name in (("curator", "curator"), ("annotator", "ann1"), ("annotator", "ann2")):
            api.keys[name] = (await keys_service.create(session=session, role=role)).key
    return api

from __future__ import annotations

from fastapi import APIRouter

from service.admin import service
from service.admin.schemas import KeyCreate, KeyCreated
from service.deps import AdminKey, SessionDep
from service.errors import ValidationError, error_responses

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.post(
    "/keys", status_code=201, response_model=KeyCreated, responses=error_responses(ValidationError)
)
async def create_key(body: KeyCreate, session: SessionDep, _: AdminKey) -> KeyCreated:
    return await service.create(session=session, role=body.role, name=body.name)

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from service.admin import repository, service
from service.admin.schemas import KeyCreate, KeyCreated
from service.api.deps import AdminKey, CtxDep, CurrentKey, JsonRoute, SessionDep
from service.audit import service as audit
from service.errors import ValidationError, error_responses

router = APIRouter(prefix="/v1/admin", tags=["admin"], route_class=JsonRoute)


@router.post(
    "/keys", status_code=201, response_model=KeyCreated, responses=error_responses(ValidationError)
)
async def create_key(
    body: KeyCreate, ctx: CtxDep, session: SessionDep, who: AdminKey
) -> KeyCreated:
    """``{"role": ..., "name"?, "actor"?}`` → a new API key, shown once."""
    created = await service.create(
        session=session, role=body.role, name=body.name, actor=body.actor
    )
    await session.commit()
    await audit.record(
        ctx.sessionmaker,
        actor=who.key_id,
        action="admin.create_key",
        target=f"key:{created.id}",
        detail={"role": created.role, "name": created.name, "actor": created.actor},
    )
    return created


me_router = APIRouter(prefix="/v1", tags=["admin"], route_class=JsonRoute)


class WhoAmI(BaseModel):
    key_id: str
    role: str
    name: str
    actor: str


@me_router.get("/whoami", response_model=WhoAmI)
async def whoami(session: SessionDep, who: CurrentKey) -> WhoAmI:
    """The calling key's id, role, name and actor (the console shows what the role may do)."""
    row = await repository.get(session, who.key_id)
    return WhoAmI(
        key_id=who.key_id,
        role=who.role,
        name=row.name if row else "",
        actor=row.actor if row else who.key_id,
    )

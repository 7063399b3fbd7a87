from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["admin", "producer", "model", "curator", "annotator", "analyst"]
ROLES: tuple[str, ...] = ("admin", "producer", "model", "curator", "annotator", "analyst")


ACTOR_DESCRIPTION = (
    "who holds the key (a person or a system), at most 200 characters; default: the key's own "
    "id. Break glass refuses approvals by any key of the requester's actor and counts one "
    "approval per actor"
)


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Role
    name: str = Field(default="", max_length=200)
    actor: str | None = Field(
        default=None, min_length=1, max_length=200, description=ACTOR_DESCRIPTION
    )


class KeyCreated(BaseModel):
    id: str
    role: Role
    name: str
    actor: str
    key: str = Field(description="shown once; only its SHA-256 is stored")
    created_at: datetime

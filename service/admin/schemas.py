from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["admin", "producer", "model", "curator", "annotator", "analyst"]
ROLES: tuple[str, ...] = ("admin", "producer", "model", "curator", "annotator", "analyst")


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Role
    name: str = Field(default="", max_length=200)


class KeyCreated(BaseModel):
    id: str
    role: Role
    name: str
    key: str = Field(description="shown once; only its SHA-256 is stored")
    created_at: datetime

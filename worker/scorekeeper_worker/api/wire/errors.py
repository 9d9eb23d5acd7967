"""The one error shape on the wire (score-api.md, "Every error has one shape")."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class ErrorResponse(BaseModel):
    object: Literal["error"] = "error"
    message: str
    type: str
    code: int

"""``GET /v1/models``: the served model."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from agentmem.serve.routes import calls

router = APIRouter()


@router.get("/models")
async def models(request: Request) -> dict[str, Any]:
    name = calls(request).settings.model_name
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "agentmem"}]}

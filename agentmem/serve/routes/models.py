"""``GET /v1/models``: the served model, with its context length (vLLM's ``max_model_len``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from agentmem.serve.routes import calls

router = APIRouter()


@router.get("/models")
async def models(request: Request) -> dict[str, Any]:
    settings = calls(request).settings
    return {"object": "list", "data": [{"id": settings.model_name, "object": "model", "created": 0,
                                        "owned_by": "agentmem", "max_model_len": settings.context_length}]}

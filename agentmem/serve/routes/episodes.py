"""agentmem's own episode routes: ``POST /agentmem/episodes/{episode}/reward`` (the episode's outcome; a
second reward gets 409 unless its body says ``"replace": true``) and ``.../privileged`` (its privileged
context); reading traces back: ``GET /agentmem/episodes/{episode}`` (this run's episode, by the client's
name or its row id: outcome and calls) and ``GET /agentmem/runs/{run}/episodes`` (a run's episodes)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request

from agentmem.serve.bounds import EPISODE, RUN_ID, check_id
from agentmem.serve.calls import read_request
from agentmem.serve.protocol import ApiError, PrivilegedRequest, RewardRequest
from agentmem.serve.routes import calls
from store.errors import NotFound

router = APIRouter(prefix="/agentmem")


@router.post("/episodes/{episode}/reward")
async def reward(request: Request, episode: str) -> dict[str, Any]:
    check_id(episode, EPISODE, "episode")
    req = await read_request(request, RewardRequest, openai=False)
    ep = await asyncio.to_thread(calls(request).recorder.reward, episode, req.reward, req.metrics, req.prediction,
                                 replace=req.replace)
    return {"episode_id": ep.id, "reward": ep.reward, "f1": ep.f1, "status": ep.status.value}


@router.post("/episodes/{episode}/privileged")
async def privileged(request: Request, episode: str) -> dict[str, Any]:
    check_id(episode, EPISODE, "episode")
    req = await read_request(request, PrivilegedRequest, openai=False)
    ep = await asyncio.to_thread(calls(request).recorder.privileged, episode, req.text, req.answers, req.task)
    return {"episode_id": ep.id, "answers": ep.gold_answers, "evidence": ep.evidence}


@router.get("/episodes/{episode}")
async def trace(request: Request, episode: str) -> dict[str, Any]:
    check_id(episode, EPISODE, "episode")
    return await asyncio.to_thread(calls(request).recorder.trace, episode)


@router.get("/runs/{run}/episodes")
async def run_episodes(request: Request, run: str) -> dict[str, Any]:
    check_id(run, RUN_ID, "run_id")
    try:
        return await asyncio.to_thread(calls(request).recorder.episodes, run)
    except NotFound as err:
        raise ApiError(404, str(err), type="not_found_error", param="run_id", code="run_not_found") from None

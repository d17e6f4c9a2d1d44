"""The routers of ``agentmem serve``, one per API; ``app.create_app`` mounts them. Each OpenAI router
(``chat``, ``completions``, ``responses``, ``models``) is mounted twice: under ``/v1`` and under ``/episodes/{episode}/v1``
(its routes read the episode from ``request.path_params``). ``episodes`` holds agentmem's own episode
routes (reward, privileged). Every route reaches the shared request handling through ``calls(request)``."""

from __future__ import annotations

from fastapi import Request

from agentmem.serve.calls import Calls


def calls(request: Request) -> Calls:
    return request.app.state.calls


def episode(request: Request) -> str | None:
    """The episode the URL path names (``/episodes/{episode}/v1/...``), else None."""
    return request.path_params.get("episode")

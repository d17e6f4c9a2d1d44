"""``POST /v1/completions``: a text prompt (tokenised with the tokenizer's special tokens, as vLLM does) or
token ids, used exactly; or a list of prompts."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request

from agentmem.serve.calls import read_request
from agentmem.serve.protocol import CompletionRequest, bad_request
from agentmem.serve.recorder import Sent
from agentmem.serve.routes import calls, episode

router = APIRouter()


@router.post("/completions")
async def completions(request: Request) -> Any:
    shared = calls(request)
    req = await read_request(request, CompletionRequest)
    shared.check_request(req)
    ids, sent = await asyncio.to_thread(tokenize, shared.tokenizer, req)  # off the event loop: may be long
    prep = await shared.prepare(request, req, episode(request), ids, sent, "completion")
    return await shared.respond(request, req, prep, chat=False, logprobs=req.logprobs is not None)


def tokenize(tokenizer, req: CompletionRequest) -> tuple[list[list[int]], Sent]:
    """Each prompt's ids (text tokenised with special tokens, ids as given) and what the client sent."""
    prompts = _prompts(req.prompt)
    vocab = len(tokenizer)
    if any(not 0 <= t < vocab for p in prompts if not isinstance(p, str) for t in p):
        raise bad_request(f"prompt token ids must be in [0, {vocab})", "prompt")
    ids = [list(tokenizer(p, add_special_tokens=True)["input_ids"]) if isinstance(p, str) else p for p in prompts]
    texts = [p if isinstance(p, str) else tokenizer.decode(p) for p in prompts]
    return ids, Sent(texts, texts, None, None, req.options())


def _prompts(prompt: Any) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(x, int) for x in prompt):
        return [list(prompt)]
    if not prompt:
        raise bad_request("empty prompt", "prompt")
    return list(prompt)

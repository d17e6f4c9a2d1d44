"""A fake vLLM OpenAI server for gateway tests: ``/v1/models`` and ``/v1/completions`` over token-id prompts,
answering as vLLM (>= 0.10) does with ``return_token_ids`` (``token_ids`` and ``prompt_token_ids`` per
choice) and ``logprobs`` (``token_logprobs``), streamed with ``stream: true``. It generates with a real
backend and keeps every answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import torch
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from agentmem.backends.types import SamplingParams


def fake_vllm(backend, model_id: str = "fake/model", max_model_len: int = 4096) -> FastAPI:
    app = FastAPI()
    app.state.answers = []

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_id, "object": "model", "max_model_len": max_model_len}]}

    @app.post("/v1/completions")
    def completions(body: dict) -> Any:
        prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
        n = body.get("n", 1)
        rows = [p for p in prompts for _ in range(n)]
        params = SamplingParams(temperature=body.get("temperature", 1.0), top_p=body.get("top_p", 1.0),
                                max_new_tokens=body.get("max_tokens", 16), seed=body.get("seed"))
        gens = backend.generate(rows, params)
        prompt_lps = [_prompt_logprobs(backend.model, row) for row in rows] if body.get("prompt_logprobs") is not None \
            else [None] * len(rows)
        choices = [{"index": i, "text": backend.tokenizer.decode(g.output_ids, skip_special_tokens=True),
                    "logprobs": {"tokens": [backend.tokenizer.decode([t]) for t in g.output_ids],
                                 "token_logprobs": g.logprobs, "top_logprobs": None, "text_offset": []},
                    "finish_reason": g.finish_reason.value, "token_ids": g.output_ids, "prompt_token_ids": row, "prompt_logprobs": plp}
                   for i, (row, g, plp) in enumerate(zip(rows, gens, prompt_lps, strict=True))]
        app.state.answers.append(choices)
        if body.get("stream"):
            return StreamingResponse(_chunks(backend.tokenizer, model_id, choices), media_type="text/event-stream")
        return {"id": "cmpl-fake", "object": "text_completion", "model": model_id, "choices": choices}

    return app


def _chunks(tokenizer, model_id: str, choices: list[dict]) -> Iterator[str]:
    """vLLM's stream with ``return_token_ids``: per choice, one chunk per token (its ``token_ids`` and log-prob;
    the first also ``prompt_token_ids``), the last with the finish reason; no prompt log-probs."""
    for c in choices:
        ids, lps = c["token_ids"], c["logprobs"]["token_logprobs"]
        for k, (t, lp) in enumerate(zip(ids, lps, strict=True)):
            piece = {"index": c["index"], "text": tokenizer.decode([t]), "token_ids": [t],
                     "logprobs": {"tokens": [tokenizer.decode([t])], "token_logprobs": [lp]},
                     "finish_reason": c["finish_reason"] if k == len(ids) - 1 else None}
            if k == 0:
                piece["prompt_token_ids"] = c["prompt_token_ids"]
            yield f"data: {json.dumps({'id': 'cmpl-fake', 'model': model_id, 'choices': [piece]})}\n\n"
    yield "data: [DONE]\n\n"


def _prompt_logprobs(model, prompt: list[int]) -> list:
    """vLLM's shape: None for the first token, then {token id: {logprob, rank, decoded_token}} per position."""
    with torch.inference_mode():
        logp = torch.log_softmax(model(input_ids=torch.tensor([prompt])).logits[0].float(), -1)
    return [None] + [{str(t): {"logprob": logp[i - 1, t].item(), "rank": 1, "decoded_token": ""}}
                     for i, t in enumerate(prompt) if i > 0]

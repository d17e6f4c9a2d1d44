"""A backend that samples through an OpenAI-compatible server that returns token ids (``agentmem serve``,
or vLLM's OpenAI server): the agent loop becomes a plain client of the server.

Each ``generate`` call is ONE ``POST {base_url}/completions`` whose ``prompt`` is the batch of token-id
lists (the server consumes them exactly, no re-tokenisation) with ``"return_token_ids": true``, so the
server's batch is the caller's batch and the stored output ids are the sampled ids, never re-tokenised
text. ``logprobs: 0`` asks for each sampled token's log-prob (the server's sampler's, under the
temperature-scaled distribution; ``backends.types``). Only the standard library is used (urllib).
"""

from __future__ import annotations

import time

from transformers import PreTrainedTokenizerBase

from agentmem.backends.http import HttpError, request_json
from agentmem.backends.types import Generation, SamplingParams
from agentmem.errors import BackendError
from agentmem.records import FinishReason


class ServerUnavailable(BackendError):
    """The server could not be reached, dropped the connection, or answered 5xx: another server may answer the
    same call (``backends.server_pool``). A 4xx is the request's fault and is a plain ``BackendError``."""


class OpenAIBackend:
    name = "openai"

    def __init__(self, base_url: str, model: str, tokenizer: PreTrainedTokenizerBase, *, api_key: str | None = None,
                 timeout_s: float = 600.0):
        self.base_url, self.model, self.tokenizer = base_url.rstrip("/"), model, tokenizer
        self.api_key, self.timeout_s = api_key, timeout_s

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if not prompts:
            return []
        start = time.perf_counter()
        body = {"model": self.model, "prompt": [list(map(int, p)) for p in prompts], "max_tokens": params.max_new_tokens,
                "temperature": params.temperature, "top_p": params.top_p, "logprobs": 0, "return_token_ids": True}
        if params.seed is not None:
            body["seed"] = params.seed
        body.update({k: {str(t): b for t, b in v.items()} if k == "logit_bias" else v
                     for k, v in params.shaping.items()})  # the server's names (agentmem serve's and vLLM's)
        answer = self._post("/completions", body)
        latency = time.perf_counter() - start
        choices = sorted(answer["choices"], key=lambda c: c["index"])
        if len(choices) != len(prompts):
            raise BackendError(f"{self.base_url} answered {len(choices)} choices for {len(prompts)} prompts")
        out = []
        for c in choices:
            ids = c.get("token_ids")
            if ids is None:
                raise BackendError(f"{self.base_url} returned no token ids: it must support \"return_token_ids\" "
                                   "(agentmem serve, or vLLM >= 0.10)")
            lps = (c.get("logprobs") or {}).get("token_logprobs")
            reason = FinishReason.length if c.get("finish_reason") == "length" else FinishReason.stop
            out.append(Generation(list(ids), None if lps is None else [float(x) for x in lps], reason, latency))
        return out

    def _post(self, path: str, body: dict) -> dict:
        try:
            return request_json(self.base_url + path, body, self.api_key, self.timeout_s)
        except HttpError as err:
            if err.status is None:
                raise ServerUnavailable(f"cannot reach {self.base_url}{path}: {err.detail}") from None
            if err.status >= 500:
                raise ServerUnavailable(f"{self.base_url}{path} answered {err.status}: {err.detail}") from None
            raise BackendError(f"{self.base_url}{path} answered {err.status}: {err.detail}") from None

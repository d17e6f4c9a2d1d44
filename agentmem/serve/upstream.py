"""Gateway mode (``agentmem serve --upstream URL``): generation by a running vLLM OpenAI server.

The gateway renders each chat with the served model's own tokenizer and chat template (``--model`` names
it; no weights load), sends the token ids to the upstream's ``/v1/completions`` with
``"return_token_ids": true``, ``logprobs: 0`` and ``prompt_logprobs: 0``, and records what comes back: the
ids the upstream consumed (checked equal to the ids sent), the ids it sampled and their log-probs, and the
prompt tokens' log-probs (``serve_calls.prompt_logprobs``). The shaping options (``logit_bias``,
penalties, ``top_k``, ``min_p``) go upstream under vLLM's names. Requests go upstream
concurrently (vLLM batches them continuously). Start vLLM with ``--logprobs-mode processed_logprobs`` so
its log-probs are the temperature-scaled ones every agentmem backend stores (``policy.types``).

``UpstreamSampler`` has the ``submit(job) -> Future[list[Choice]]`` interface of ``sampler.Sampler``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from concurrent.futures import Future, ThreadPoolExecutor

from agentmem.policy.http import HttpError, request_json
from agentmem.records import FinishReason
from agentmem.serve.protocol import ApiError
from agentmem.serve.sampler import Choice, Job, cut_at_stop, whole


def _call(url: str, body: dict | None, api_key: str | None, timeout_s: float) -> dict:
    try:
        return request_json(url, body, api_key, timeout_s)
    except HttpError as err:
        if err.status is None:
            raise ApiError(502, f"cannot reach upstream {url}: {err.detail}", type="upstream_error") from None
        raise ApiError(err.status if 400 <= err.status < 500 else 502, f"upstream {url}: {err.detail}",
                       type="upstream_error") from None


def upstream_model(base_url: str, api_key: str | None = None) -> tuple[str, int | None]:
    """(model id, max model length when the upstream says) of the first model the upstream serves."""
    data = _call(f"{base_url.rstrip('/')}/models", None, api_key, 30)["data"]
    if not data:
        raise ApiError(502, f"upstream {base_url} serves no model", type="upstream_error")
    return data[0]["id"], data[0].get("max_model_len")


class UpstreamSampler:
    def __init__(self, base_url: str, model: str, tokenizer, *, api_key: str | None = None, workers: int = 64,
                 timeout_s: float = 600.0):
        self.base_url, self.model, self.tokenizer = base_url.rstrip("/"), model, tokenizer
        self.api_key, self.timeout_s = api_key, timeout_s
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agentmem-upstream")
        self.batches = 0

    def submit(self, job: Job) -> Future:
        return self._pool.submit(self._generate, job)

    def stream(self, job: Job) -> AsyncIterator[list[Choice]]:
        return whole(self.submit(job))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _generate(self, job: Job) -> list[Choice]:
        p = job.params
        body = {"model": self.model, "prompt": job.prompts, "n": job.n, "max_tokens": p.max_new_tokens,
                "temperature": p.temperature, "top_p": p.top_p, "logprobs": 0, "prompt_logprobs": 0, "return_token_ids": True}
        if p.seed is not None:
            body["seed"] = p.seed
        if job.stops:
            body["stop"] = list(job.stops)
        body.update({k: {str(t): b for t, b in v.items()} if k == "logit_bias" else v for k, v in p.shaping.items()})
        start = time.perf_counter()
        answer = _call(f"{self.base_url}/completions", body, self.api_key, self.timeout_s)
        latency = time.perf_counter() - start
        self.batches += 1
        choices = sorted(answer.get("choices", []), key=lambda c: c["index"])
        rows = job.rows
        if len(choices) != len(rows):
            raise ApiError(502, f"upstream answered {len(choices)} choices for {len(rows)}", type="upstream_error")
        return [self._choice(row, c, job, latency) for row, c in zip(rows, choices, strict=True)]

    def _choice(self, prompt: list[int], c: dict, job: Job, latency: float) -> Choice:
        ids, consumed = c.get("token_ids"), c.get("prompt_token_ids")
        lps = (c.get("logprobs") or {}).get("token_logprobs")
        if ids is None or lps is None:
            raise ApiError(502, "the upstream returned no token ids or log-probs: it must be a vLLM (>= 0.10) "
                                "OpenAI server, which honours return_token_ids and logprobs", type="upstream_error")
        if consumed is not None and list(consumed) != list(prompt):
            raise ApiError(502, "the upstream consumed other prompt ids than were sent", type="upstream_error")
        ids, lps = [int(x) for x in ids], [float(x) for x in lps]
        reason = FinishReason.length if c.get("finish_reason") == "length" else FinishReason.stop
        cut = cut_at_stop(self.tokenizer, ids, job.stops)
        if cut is not None:
            keep, text = cut
            ids, lps, reason = ids[:keep], lps[:keep], FinishReason.stop
        else:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Choice(list(prompt), ids, lps, reason, text, latency,
                      prompt_logprobs=_prompt_logprobs(prompt, c.get("prompt_logprobs")))


def _prompt_logprobs(prompt: list[int], entries: list | None) -> list[float] | None:
    """vLLM's ``prompt_logprobs`` (None for the first token, then ``{token id: {"logprob": ..}}`` per position,
    the prompt's own token among them) as one log-prob per prompt token, NaN where there is none."""
    if entries is None or len(entries) != len(prompt):
        return None
    out = []
    for tid, entry in zip(prompt, entries, strict=True):
        found = (entry or {}).get(str(tid))
        out.append(float(found["logprob"]) if isinstance(found, dict) else float("nan"))
    return out

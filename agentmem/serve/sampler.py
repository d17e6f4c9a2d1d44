"""Batch the generation requests of concurrent clients into backend calls.

One worker thread owns the backend (a transformers model is not thread-safe). A request waits at most
``window_s`` after the first pending request arrived, then every pending request with the same sampling
parameters (temperature, top_p, max tokens) goes to the backend in one ``generate`` call; requests that
arrive while a batch runs form the next one. A request with a ``seed`` is generated alone, so that the same
request with the same seed gives the same output whatever else the server is doing.

What a request gets back (``Choice``) is exactly what the backend sampled, cut at the first stop string:
``output_ids`` are the sampled ids up to and including the token that completed the stop string (the
sampler chose them; nothing after it was returned), ``logprobs`` the backend's log-probs of those ids
(``policy.types``: full-vocabulary, temperature-scaled), ``text`` the decoded ids without special tokens,
cut before the stop string, as OpenAI returns it. ``top`` holds, when asked, the ``k`` most likely tokens at
each output position under the same distribution, from one extra forward pass over prompt + output.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from agentmem.policy.types import Backend, Generation, SamplingParams
from agentmem.records import FinishReason


@dataclass(frozen=True)
class Job:
    """One request's generation: ``prompts`` (each sampled ``n`` times), its sampling, stops and top-k."""

    prompts: list[list[int]]
    n: int
    params: SamplingParams
    stops: tuple[str, ...] = ()
    top_k: int = 0

    @property
    def rows(self) -> list[list[int]]:
        return [p for p in self.prompts for _ in range(self.n)]


@dataclass(frozen=True)
class Choice:
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float] | None
    finish_reason: FinishReason
    text: str
    latency_s: float
    top: list[list[tuple[int, float]]] | None = None  # per output token: (id, log-prob), most likely first
    prompt_logprobs: list[float | None] | None = None  # gateway mode: the upstream's prompt log-probs


@dataclass(frozen=True)
class Tokens:
    """What completion ``index`` of a request sampled since the previous event, from a sampler that streams
    (``engine_sampler``): ids, their log-probs, and when asked their top alternatives."""

    index: int
    ids: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]] | None = None


async def whole(future: Future) -> AsyncIterator[list[Choice]]:
    """``stream`` of a sampler that only answers whole requests: its choices, once."""
    yield await asyncio.wrap_future(future)


@dataclass
class _Pending:
    job: Job
    future: Future = field(default_factory=Future)
    arrived: float = field(default_factory=time.monotonic)


def cut_at_stop(tokenizer, ids: list[int], stops: Sequence[str]) -> tuple[int, str] | None:
    """(tokens kept, text before the stop) at the earliest stop string in the decoded output, else None.
    The kept tokens end with the token that completed the stop string."""
    if not stops:
        return None
    text = tokenizer.decode(ids, skip_special_tokens=True)
    found = [(text.find(s), s) for s in stops if s in text]
    if not found:
        return None
    pos, stop = min(found)
    need = pos + len(stop)
    for k in range(1, len(ids) + 1):
        if len(tokenizer.decode(ids[:k], skip_special_tokens=True)) >= need:
            return k, text[:pos]
    return len(ids), text[:pos]


def to_choice(tokenizer, prompt: list[int], gen: Generation, stops: Sequence[str]) -> Choice:
    ids, lps, reason = list(gen.output_ids), gen.logprobs, gen.finish_reason
    cut = cut_at_stop(tokenizer, ids, stops)
    if cut is not None:
        keep, text = cut
        ids, lps, reason = ids[:keep], (lps[:keep] if lps is not None else None), FinishReason.stop
    else:
        text = tokenizer.decode(ids, skip_special_tokens=True)
    return Choice(list(prompt), ids, None if lps is None else list(lps), reason, text, gen.latency_s)


def top_logprobs(model, prompt: list[int], output: list[int], temperature: float, k: int) -> list[list[tuple[int, float]]]:
    """The ``k`` most likely tokens at each output position of ``prompt + output`` under
    ``log_softmax(logits / T)`` (T = 1 for greedy), the distribution the backend stores log-probs from."""
    import torch

    ids = torch.tensor([prompt + output], device=model.device)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) + len(output) - 1].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    values, index = logp.topk(k, dim=-1)
    return [list(zip(i.tolist(), v.tolist(), strict=True)) for i, v in zip(index, values, strict=True)]


class Sampler:
    """Serves ``submit(job)`` futures from one worker thread that batches pending jobs."""

    def __init__(self, backend: Backend, *, window_s: float = 0.005, max_batch: int = 64):
        self.backend, self.window_s, self.max_batch = backend, window_s, max_batch
        self._pending: list[_Pending] = []
        self._cv = threading.Condition()
        self._closed = False
        self.batches = 0  # backend calls made (a test checks that concurrent requests shared one)
        self._thread = threading.Thread(target=self._work, name="agentmem-serve-sampler", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> Future:
        item = _Pending(job)
        with self._cv:
            if self._closed:
                raise RuntimeError("the sampler is closed")
            self._pending.append(item)
            self._cv.notify()
        return item.future

    def stream(self, job: Job) -> AsyncIterator[list[Choice]]:
        """The request's choices once generated (this sampler answers whole batches)."""
        return whole(self.submit(job))

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=30)

    def _take(self) -> list[_Pending] | None:
        with self._cv:
            while not self._pending and not self._closed:
                self._cv.wait()
            if self._closed and not self._pending:
                return None
            wait = self._pending[0].arrived + self.window_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        with self._cv:
            first = self._pending[0]
            key = _batch_key(first.job)
            taken, rows = [], 0
            for item in self._pending:
                if _batch_key(item.job) == key and (not taken or rows + len(item.job.rows) <= self.max_batch):
                    taken.append(item)
                    rows += len(item.job.rows)
                    if key[-1] is not None:  # a seeded job runs alone
                        break
            self._pending = [p for p in self._pending if p not in taken]
            return taken

    def _work(self) -> None:
        while (taken := self._take()) is not None:
            try:
                self._run(taken)
            except BaseException as exc:  # noqa: BLE001  every waiting request gets the error, the server lives on
                for item in taken:
                    if not item.future.done():
                        item.future.set_exception(exc)

    def _run(self, taken: list[_Pending]) -> None:
        rows = [r for item in taken for r in item.job.rows]
        gens = self.backend.generate(rows, taken[0].job.params)
        self.batches += 1
        at = 0
        for item in taken:
            job, mine = item.job, gens[at : at + len(item.job.rows)]
            at += len(job.rows)
            choices = [to_choice(self.backend.tokenizer, row, gen, job.stops) for row, gen in zip(job.rows, mine, strict=True)]
            if job.top_k:
                model = self.backend.model  # type: ignore[attr-defined]  # checked by the app before submitting
                choices = [_with_top(model, c, job) for c in choices]
            item.future.set_result(choices)


def _with_top(model, choice: Choice, job: Job) -> Choice:
    if not choice.output_ids:
        return choice
    top = top_logprobs(model, choice.prompt_ids, choice.output_ids, job.params.temperature, job.top_k)
    return Choice(choice.prompt_ids, choice.output_ids, choice.logprobs, choice.finish_reason, choice.text,
                  choice.latency_s, top)


def _batch_key(job: Job) -> tuple:
    p = job.params
    return p.temperature, p.top_p, p.max_new_tokens, p.seed

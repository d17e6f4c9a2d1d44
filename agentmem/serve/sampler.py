"""Batch the generation requests of concurrent clients into backend calls.

One worker thread owns the backend (a transformers model is not thread-safe). A request waits at most
``window_s`` after the first pending request arrived, then every pending request with the same sampling
parameters (``SamplingParams``: temperature, top_p, max tokens, the shaping options) goes to the backend in
one ``generate`` call; requests that arrive while a batch runs form the next one. A request with a ``seed`` is generated alone, so that the same
request with the same seed gives the same output whatever else the server is doing.

On a backend with a step hook (``TransformersBackend.generate(..., on_step=...)``), ``stream(job)`` yields each
sampled token (``Tokens``) as the backend samples it, then the request's choices; and a row whose output has
completed one of its request's stop strings ends at that step instead of decoding on to ``max_tokens``.

What a request gets back (``Choice``) is exactly what the backend sampled, cut at the first stop string:
``output_ids`` are the sampled ids up to and including the token that completed the stop string (the
sampler chose them; nothing after it was returned), ``logprobs`` the backend's log-probs of those ids
(``policy.types``: full-vocabulary, temperature-scaled; with shaping options, of the shaped distribution),
``text`` the decoded ids without special tokens, cut before the stop string, as OpenAI returns it. ``top``
holds, when asked, the ``k`` most likely tokens at each output position, taken by the backend from the same
tensor as the sampled token's log-prob (``TransformersBackend.generate(..., top_logprobs=k)``).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

from agentmem.policy.transformers_backend import Step
from agentmem.policy.types import Backend, Generation, SamplingParams
from agentmem.records import FinishReason
from agentmem.serve.gateway import prompt_logprobs as score_prompt


@dataclass(frozen=True)
class Job:
    """One request's generation: ``prompts`` (each sampled ``n`` times), its sampling, stops, and how many
    alternatives each output token lists (``top_logprobs``, 0: none)."""

    prompts: list[list[int]]
    n: int
    params: SamplingParams
    stops: tuple[str, ...] = ()
    top_logprobs: int = 0
    prompt_logprobs: bool = False  # also each prompt token's log-prob (vLLM's prompt_logprobs; a gateway asks)
    route: str | None = None  # the episode: a gateway sends an episode's calls to one upstream
    messages: list[dict] | None = None  # the chat as sent, and its tools: a text-only upstream takes these
    tools: list[dict] | None = None

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
    prompt_logprobs: list[float | None] | None = None  # when asked: the model's (the upstream's) prompt log-probs
    replayable: bool = True  # False: ids tokenized locally from a provider's text, no log-probs


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
    emit: Callable[[Tokens], None] | None = None  # a streaming request's: each token as it is sampled


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


def to_choice(tokenizer, prompt: list[int], gen: Generation, stops: Sequence[str], top_logprobs: int = 0) -> Choice:
    ids, lps, reason = list(gen.output_ids), gen.logprobs, gen.finish_reason
    cut = cut_at_stop(tokenizer, ids, stops)
    if cut is not None:
        keep, text = cut
        ids, lps, reason = ids[:keep], (lps[:keep] if lps is not None else None), FinishReason.stop
    else:
        text = tokenizer.decode(ids, skip_special_tokens=True)
    top = [row[:top_logprobs] for row in gen.top[: len(ids)]] if top_logprobs and gen.top is not None else None
    return Choice(list(prompt), ids, None if lps is None else list(lps), reason, text, gen.latency_s, top)


class Sampler:
    """Serves ``submit(job)`` futures from one worker thread that batches pending jobs."""

    def __init__(self, backend: Backend, *, window_s: float = 0.005, max_batch: int = 64):
        self.backend, self.window_s, self.max_batch = backend, window_s, max_batch
        self._pending: list[_Pending] = []
        self._cv = threading.Condition()
        self._closed = False
        self.batches = 0  # backend calls made (a test checks that concurrent requests shared one)
        # whether the backend reports each decoding step (TransformersBackend's on_step): tokens then stream as
        # sampled, and a row ends as soon as a stop string completes
        self.steps = "on_step" in inspect.signature(backend.generate).parameters
        self._thread = threading.Thread(target=self._work, name="agentmem-serve-sampler", daemon=True)
        self._thread.start()

    def submit(self, job: Job, emit: Callable[[Tokens], None] | None = None) -> Future:
        item = _Pending(job, emit=emit)
        with self._cv:
            if self._closed:
                raise RuntimeError("the sampler is closed")
            self._pending.append(item)
            self._cv.notify()
        return item.future

    async def stream(self, job: Job) -> AsyncIterator[Tokens | list[Choice]]:
        """For the app's loop: ``Tokens`` as the backend samples them (a backend with a step hook,
        ``TransformersBackend``; one per token and completion), then the request's choices."""
        if not self.steps:
            async for choices in whole(self.submit(job)):
                yield choices
            return
        here = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        done = self.submit(job, lambda event: here.call_soon_threadsafe(queue.put_nowait, event))
        done.add_done_callback(lambda f: here.call_soon_threadsafe(queue.put_nowait, f))
        async for event in drain(queue):
            yield event

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
                    if key.seed is not None:  # a seeded job runs alone
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
        k = max(item.job.top_logprobs for item in taken)
        params = taken[0].job.params
        # only a backend that lists alternatives is asked for them (the app checks before submitting)
        extra: dict = {"top_logprobs": k} if k else {}
        if self.steps and any(item.emit is not None or item.job.stops for item in taken):
            extra["on_step"] = _Steps(self.backend.tokenizer, taken)
        gens = self.backend.generate(rows, params, **extra)
        self.batches += 1
        at = 0
        for item in taken:
            job, mine = item.job, gens[at : at + len(item.job.rows)]
            at += len(job.rows)
            choices = [to_choice(self.backend.tokenizer, row, gen, job.stops, job.top_logprobs)
                       for row, gen in zip(job.rows, mine, strict=True)]
            model = getattr(self.backend, "model", None)
            if job.prompt_logprobs and model is not None:
                choices = [replace(c, prompt_logprobs=score_prompt(model, c.prompt_ids)) for c in choices]
            item.future.set_result(choices)


class _Steps:
    """The step hook of one batch: sends each streaming request its tokens, and ends a row whose output has
    completed one of its request's stop strings."""

    def __init__(self, tokenizer, taken: list[_Pending]):
        self.tokenizer = tokenizer
        self.owner = [(item, i) for item in taken for i in range(len(item.job.rows))]  # batch row -> (request, index)
        self.ids: dict[int, list[int]] = {}

    def __call__(self, steps: list[Step]) -> set[int]:
        ended = set()
        for step in steps:
            item, index = self.owner[step.row]
            if item.emit is not None:
                top = [step.top[: item.job.top_logprobs]] if item.job.top_logprobs and step.top is not None else None
                item.emit(Tokens(index, [step.token], [step.logprob], top))
            if item.job.stops:
                ids = self.ids.setdefault(step.row, [])
                ids.append(step.token)
                if cut_at_stop(self.tokenizer, ids, item.job.stops) is not None:
                    ended.add(step.row)
        return ended


def _batch_key(job: Job) -> SamplingParams:
    return job.params  # frozen: jobs that sample alike share a batch


async def drain(queue: asyncio.Queue) -> AsyncIterator:
    """The events a sampler puts on ``queue`` as they come, then the result of the ``Future`` that ends the
    request: its choices, or its error raised here."""
    while True:
        event = await queue.get()
        if isinstance(event, Future):
            yield event.result()
            return
        yield event

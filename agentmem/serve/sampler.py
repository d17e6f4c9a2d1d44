"""Batch the generation requests of concurrent clients into backend calls (``BatchSampler``), and what every
sampler ``calls.Calls`` drives shares: ``Job`` in, ``Tokens`` and ``Choice`` out, the ``Sampler`` protocol.

One worker thread owns the backend (a transformers model is not thread-safe). When nothing runs, the first
request waits until no other has arrived for ``window_s`` (at most ``WINDOWS`` windows), then every pending
request that samples alike starts one batch.

- **Continuous** (plain sampling on a model with the static decode step: ``backends.decode_batch``): requests that
  arrive while the batch runs join it at the next decoding step, whatever their ``max_tokens``, and each leaves
  as soon as its rows finish. A waiting request of another kind stops the joining, so the batch drains and that
  request runs next.
- **Static** (shaping options, a grammar, a ``seed``, or a model without the static step): every pending request
  with the same ``SamplingParams`` goes to the backend in one ``generate`` call; requests that arrive while it runs
  form the next one. A request with a ``seed`` is generated alone, so that the same request with the same seed
  gives the same output whatever else the server is doing.

On a backend with a step hook (``TransformersBackend.generate(..., on_step=...)``), ``stream(job)`` yields each
sampled token (``Tokens``) as the backend samples it, then the request's choices; and a row whose output has
completed one of its request's stop strings ends at that step instead of decoding on to ``max_tokens``.

What a request gets back (``Choice``) is exactly what the backend sampled, cut at the first stop string:
``output_ids`` are the sampled ids up to and including the token that completed the stop string (the
sampler chose them; nothing after it was returned), ``logprobs`` the backend's log-probs of those ids
(``backends.types``: full-vocabulary, temperature-scaled; with shaping options, of the shaped distribution),
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
from typing import Protocol

from agentmem.backends.decode_batch import DecodeBatch, batch_params, joinable
from agentmem.backends.transformers_backend import Step
from agentmem.backends.types import Backend, Generation, SamplingParams
from agentmem.records import FinishReason
from agentmem.serve.behind_gateway import prompt_logprobs as score_prompt


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
    messages: list[dict] | None = None  # the chat as sent, its tools and tool_choice: a text-only upstream takes these
    tools: list[dict] | None = None
    tool_choice: str | None = None

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
    gens: list[Generation | None] = field(default_factory=list)  # continuous batching: its rows' outputs so far
    left: int = 0  # continuous batching: its rows still decoding


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


# the longest a first request waits for others, in batch windows: clients that call together reach the server
# spread out by their own HTTP handling and by the previous calls' recording (8 clients: about 75 ms)
WINDOWS = 10


class Sampler(Protocol):
    """What ``calls.Calls`` drives: ``BatchSampler`` (a local backend), ``engine_sampler.EngineSampler`` (an async
    engine, vLLM's) and ``gateway.UpstreamSampler`` (upstream servers). ``submit`` answers a job with its choices
    (a future, resolved on another thread); ``stream`` yields, on the app's loop, ``Tokens`` as they are sampled
    (or none, for a sampler that cannot stream) and then the choices; ``close`` stops the sampler."""

    def submit(self, job: Job) -> Future[list[Choice]]: ...

    def stream(self, job: Job) -> AsyncIterator[Tokens | list[Choice]]: ...

    def close(self) -> None: ...


class BatchSampler:
    """Serves ``submit(job)`` futures from one worker thread that batches pending jobs; with ``continuous`` (a
    backend with the static decode step, ``backends.decode_batch``), jobs of plain sampling join the running batch
    between decoding steps instead of waiting for it to end."""

    def __init__(self, backend: Backend, *, window_s: float = 0.005, max_batch: int = 64, continuous: bool = True):
        self.backend, self.window_s, self.max_batch = backend, window_s, max_batch
        self.continuous = continuous
        self._pending: list[_Pending] = []
        self._cv = threading.Condition()
        self._closed = False
        self.batches = 0  # backend batches started (a test checks that concurrent requests shared one)
        self._batch: DecodeBatch | None = None  # the running continuous batch
        self._owners: dict[int, tuple[_Pending, int]] = {}  # its row ids -> (request, index of the row in it)
        self._hook = _Steps(getattr(backend, "tokenizer", None), self._owners)  # its step hook
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
        while True:  # the window: until none has arrived for window_s, at most WINDOWS x window_s after the first
            with self._cv:
                until = min(self._pending[-1].arrived + self.window_s,
                            self._pending[0].arrived + WINDOWS * self.window_s)
            if (wait := until - time.monotonic()) <= 0:
                break
            time.sleep(wait)
        with self._cv:
            first = self._pending[0]
            key = self._key(first.job)
            taken, rows = [], 0
            for item in self._pending:
                if self._key(item.job) == key and (not taken or rows + len(item.job.rows) <= self.max_batch):
                    taken.append(item)
                    rows += len(item.job.rows)
                    if first.job.params.seed is not None:  # a seeded job runs alone
                        break
            self._pending = [p for p in self._pending if p not in taken]
            return taken

    def _key(self, job: Job) -> tuple:
        """Jobs with the same key share a batch: a static one samples alike (the same ``SamplingParams``); a
        continuous one differs at most in each row's budget of new tokens."""
        if self.continuous and joinable(self.backend, job.params):
            return ("continuous", batch_params(job.params))
        return ("static", job.params)  # frozen: jobs that sample alike share a batch

    def _joining(self, key: tuple, live: int) -> list[_Pending]:
        """Pending jobs that join the running batch now (no wait): those of its key, in order, while the batch
        holds at most ``max_batch`` rows. None once an older job of another kind waits, so the batch drains and
        that job runs next."""
        with self._cv:
            taken, rows = [], live
            for item in self._pending:
                if self._key(item.job) != key:
                    break
                if rows + len(item.job.rows) > self.max_batch:
                    break
                taken.append(item)
                rows += len(item.job.rows)
            self._pending = self._pending[len(taken):]
            return taken

    def _work(self) -> None:
        while True:
            if self._batch is not None:
                self._continue(self._batch)
                continue
            if (taken := self._take()) is None:
                return
            if self._key(taken[0].job)[0] == "continuous":
                self.batches += 1
                try:
                    self._batch = DecodeBatch(self.backend, taken[0].job.params)  # type: ignore[arg-type]
                except BaseException as exc:  # noqa: BLE001
                    _fail(taken, exc)
                    continue
                self._continue(self._batch, taken)
                continue
            try:
                self._run(taken)
            except BaseException as exc:  # noqa: BLE001  every waiting request gets the error, the server lives on
                _fail(taken, exc)

    def _continue(self, batch: DecodeBatch, joining: list[_Pending] | None = None) -> None:
        """One step of the running batch, after the pending jobs that may join it have joined."""
        try:
            joining = joining if joining is not None else self._joining(("continuous", batch.params), len(batch))
            if joining:
                self._join(batch, joining)
            owners = self._owners
            tops = {row: item.job.top_logprobs for row, (item, _) in owners.items() if item.job.top_logprobs}
            hook = self._hook if any(item.emit is not None or item.job.stops for item, _ in owners.values()) else None
            for row, gen in batch.step(tops, hook).items():
                item, index = owners.pop(row)
                self._hook.ids.pop(row, None)
                item.gens[index] = gen
                item.left -= 1
                if item.left == 0:  # every row has finished; an error here is this request's alone
                    try:
                        self._answer(item, item.gens)  # type: ignore[arg-type]
                    except BaseException as exc:  # noqa: BLE001
                        _fail([item], exc)
        except BaseException as exc:  # noqa: BLE001  every request of the batch gets the error, the server lives on
            _fail([item for item, _ in self._owners.values()] + (joining or []), exc)
            self._owners.clear()
            self._hook.ids.clear()
            self._batch = None
            return
        if not len(batch):
            self._batch = None

    def _join(self, batch: DecodeBatch, items: list[_Pending]) -> None:
        prompts = [row for item in items for row in item.job.rows]
        budgets = [item.job.params.max_new_tokens for item in items for _ in item.job.rows]
        ids = iter(batch.join(prompts, budgets))
        for item in items:
            item.gens, item.left = [None] * len(item.job.rows), len(item.job.rows)
            for index in range(len(item.job.rows)):
                self._owners[next(ids)] = (item, index)

    def _answer(self, item: _Pending, gens: Sequence[Generation]) -> None:
        """A finished job's choices, cut at its stop strings (and its prompt's log-probs when asked)."""
        job = item.job
        choices = [to_choice(self.backend.tokenizer, row, gen, job.stops, job.top_logprobs)
                   for row, gen in zip(job.rows, gens, strict=True)]
        model = getattr(self.backend, "model", None)
        if job.prompt_logprobs and model is not None:
            choices = [replace(c, prompt_logprobs=score_prompt(model, c.prompt_ids)) for c in choices]
        item.future.set_result(choices)

    def _run(self, taken: list[_Pending]) -> None:
        rows = [r for item in taken for r in item.job.rows]
        k = max(item.job.top_logprobs for item in taken)
        params = taken[0].job.params
        # only a backend that lists alternatives is asked for them (the app checks before submitting)
        extra: dict = {"top_logprobs": k} if k else {}
        if self.steps and any(item.emit is not None or item.job.stops for item in taken):
            owner = dict(enumerate((item, i) for item in taken for i in range(len(item.job.rows))))
            extra["on_step"] = _Steps(self.backend.tokenizer, owner)
        gens = self.backend.generate(rows, params, **extra)
        self.batches += 1
        at = 0
        for item in taken:
            self._answer(item, gens[at : at + len(item.job.rows)])
            at += len(item.job.rows)


def _fail(items: list[_Pending], exc: BaseException) -> None:
    for item in items:
        if not item.future.done():
            item.future.set_exception(exc)


class _Steps:
    """The step hook of a batch: sends each streaming request its tokens, and ends a row whose output has
    completed one of its request's stop strings. ``owner``: batch row -> (request, index of the row in it)."""

    def __init__(self, tokenizer, owner: dict[int, tuple[_Pending, int]]):
        self.tokenizer = tokenizer
        self.owner = owner
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


async def drain(queue: asyncio.Queue) -> AsyncIterator:
    """The events a sampler puts on ``queue`` as they come, then the result of the ``Future`` that ends the
    request: its choices, or its error raised here."""
    while True:
        event = await queue.get()
        if isinstance(event, Future):
            yield event.result()
            return
        yield event

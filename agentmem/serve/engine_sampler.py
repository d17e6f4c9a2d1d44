"""Serve requests on an engine that batches continuously (``backends.types.AsyncEngine``: vLLM's async engine).

There is no collection window: each completion of each request (``n`` per prompt) goes to the engine the
moment the request arrives, as its own engine request, and the engine schedules every live one together.
The engine lives in an event loop of its own, on a thread this sampler owns (it is built there, so that
vLLM's output handler and sockets belong to that loop), and the app's loop talks to it through thread-safe
futures and queues:

- ``submit(job)``: a ``concurrent.futures.Future`` of the request's ``Choice`` list (the interface of
  ``sampler.Sampler``);
- ``stream(job)``: an async iterator, for the app's loop, of ``Tokens`` (what completion ``index`` sampled
  since the last event) as the engine produces them, then the ``Choice`` list. Leaving it early cancels
  the request's engine requests (vLLM aborts them).

A ``Choice`` holds exactly the ids and log-probs the engine returned, cut at the first stop string as
everywhere in ``serve`` (``sampler.to_choice``); once a stop string has completed, the engine request is
closed (aborted) instead of decoding on to ``max_tokens``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import replace

from agentmem.backends.types import AsyncEngine, Generation
from agentmem.records import FinishReason
from agentmem.serve.sampler import Choice, Job, Tokens, cut_at_stop, drain, to_choice


class EngineSampler:
    def __init__(self, make_engine: Callable[[], AsyncEngine]):
        """``make_engine`` is called once, on the engine thread, inside its event loop."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agentmem-serve-engine", daemon=True)
        self._thread.start()
        try:
            self.engine: AsyncEngine = self._call(_build(make_engine)).result()
        except BaseException:
            self._stop()
            raise
        self.tokenizer = self.engine.tokenizer

    def _call(self, coro) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def submit(self, job: Job) -> Future:
        return self._call(self._run(job, None))

    async def stream(self, job: Job) -> AsyncIterator[Tokens | list[Choice]]:
        here = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def emit(event: Tokens) -> None:
            here.call_soon_threadsafe(queue.put_nowait, event)

        done = self._call(self._run(job, emit))
        done.add_done_callback(lambda f: here.call_soon_threadsafe(queue.put_nowait, f))
        try:
            async for event in drain(queue):
                yield event
        finally:
            if not done.done():
                done.cancel()  # the engine requests end (vLLM aborts them)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._call(_shutdown(self.engine)).result(timeout=60)
        self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    async def _run(self, job: Job, emit: Callable[[Tokens], None] | None) -> list[Choice]:
        rows = job.rows
        return list(await asyncio.gather(*[self._one(job, i, row, emit) for i, row in enumerate(rows)]))

    async def _one(self, job: Job, index: int, prompt: list[int], emit: Callable[[Tokens], None] | None) -> Choice:
        start = time.perf_counter()
        ids: list[int] = []
        logprobs: list[float] = []
        top: list[list[tuple[int, float]]] = []
        reason = FinishReason.error
        steps = self.engine.stream(prompt, job.params, index=index, top_k=job.top_logprobs,
                                   request_id=f"agentmem-{uuid.uuid4().hex}")
        async with contextlib.aclosing(steps):
            async for step in steps:
                ids += step.ids
                logprobs += step.logprobs
                top += step.top or []
                if emit is not None and step.ids:
                    emit(Tokens(index, list(step.ids), list(step.logprobs), step.top))
                if step.finish_reason is not None:
                    reason = step.finish_reason
                    break
                if job.stops and cut_at_stop(self.tokenizer, ids, job.stops) is not None:
                    reason = FinishReason.stop
                    break  # closing the stream aborts the engine request
        choice = to_choice(self.tokenizer, prompt, Generation(ids, logprobs, reason, time.perf_counter() - start),
                           job.stops)
        return replace(choice, top=top[: len(choice.output_ids)]) if job.top_logprobs else choice


async def _build(make_engine: Callable[[], AsyncEngine]) -> AsyncEngine:
    return make_engine()


async def _shutdown(engine: AsyncEngine) -> None:
    engine.shutdown()

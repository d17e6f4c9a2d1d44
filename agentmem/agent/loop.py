"""The one agent loop, shared by rollout and evaluation.

For each task: one ``memory_update`` call per chunk with (question, memory, chunk), whose output becomes
the new memory through the memory policy; then one ``answer`` call with (question, memory). Calls are
batched across episodes: at every round, the next call of every live episode goes to the backend
together (in slices of ``max_batch``).

Invariants:
- the ``prompt_ids`` of every emitted Invocation are exactly the ids passed to the backend, and
  ``output_ids``/``output_logprobs`` exactly what it returned;
- an episode's state is its memory and next step only, so it can be rebuilt from its stored calls
  (``resume_state``) and a resumed episode continues exactly where the store says it stopped;
- a failing call is data, not a crash: its episode ends ``failed`` with the error, siblings go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from agentmem.agent.memory import MEMORY_POLICIES, MemoryPolicy
from agentmem.agent.prompts import Prompt, answer_prompt, update_prompt
from agentmem.policy.types import Backend, Generation, SamplingParams
from agentmem.records import (
    Episode,
    EpisodeStatus,
    FinishReason,
    Invocation,
    InvocationKind,
    Task,
    utcnow,
)
from envs.metrics import Scores


class AgentConfig(BaseModel):
    """How the agent reads: memory budget, generation limits, sampling."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory_tokens: int = 256
    answer_max_new_tokens: int = 32
    max_chunks: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    memory_policy: str = "overwrite"
    max_batch: int = 8
    seed: int = 0


@dataclass
class EpisodeState:
    episode: Episode
    task: Task
    memory: str = ""
    next_step: int = 0
    calls: int = 0
    tokens: int = 0

    def n_updates(self, max_chunks: int | None) -> int:
        n = len(self.task.chunks)
        return n if max_chunks is None else min(n, max_chunks)


def resume_state(episode: Episode, task: Task, stored: Sequence[Invocation]) -> EpisodeState:
    """The state after the stored calls of ``episode`` (in step order)."""
    state = EpisodeState(episode=episode, task=task)
    if stored:
        last = stored[-1]
        if [i.step for i in stored] != list(range(len(stored))):
            raise ValueError(f"episode {episode.id}: stored steps are not 0..{len(stored) - 1}")
        state.memory, state.next_step = last.memory_after, last.step + 1
        state.calls = len(stored)
        state.tokens = sum(i.prompt_tokens + i.output_tokens for i in stored)
    return state


class Sink(Protocol):
    """Where finished work goes, as it completes (the rollout job writes it to the store)."""

    def invocations(self, invocations: list[Invocation]) -> None: ...

    def episodes_finished(self, episodes: list[Episode]) -> None: ...


@dataclass
class ListSink:
    """Keeps everything in memory (tests, evaluation without a store)."""

    all_invocations: list[Invocation] = field(default_factory=list)
    finished: list[Episode] = field(default_factory=list)

    def invocations(self, invocations: list[Invocation]) -> None:
        self.all_invocations.extend(invocations)

    def episodes_finished(self, episodes: list[Episode]) -> None:
        self.finished.extend(episodes)


@dataclass(frozen=True)
class RoundStats:
    calls: int
    prompt_tokens: int
    output_tokens: int
    finished: int
    seconds: float


class AgentLoop:
    def __init__(
        self,
        backend: Backend,
        config: AgentConfig,
        score: Callable[[str, Task], Scores],
        policy_version: str | None = None,
    ):
        self.backend = backend
        self.config = config
        self.score = score
        self.policy_version = policy_version
        self.tokenizer = backend.tokenizer
        self.memory: MemoryPolicy = MEMORY_POLICIES[config.memory_policy](self.tokenizer, config.memory_tokens)
        self._round = 0

    def _prompt(self, s: EpisodeState) -> tuple[InvocationKind, Prompt, str | None, int | None]:
        n = s.n_updates(self.config.max_chunks)
        if s.next_step < n:
            chunk = s.task.chunks[s.next_step]
            return InvocationKind.memory_update, update_prompt(self.tokenizer, s.task.question, s.memory, chunk), \
                chunk, s.next_step
        return InvocationKind.answer, answer_prompt(self.tokenizer, s.task.question, s.memory), None, None

    def _params(self, kind: InvocationKind) -> SamplingParams:
        limit = self.config.memory_tokens if kind is InvocationKind.memory_update else self.config.answer_max_new_tokens
        return SamplingParams(temperature=self.config.temperature, top_p=self.config.top_p, max_new_tokens=limit,
                              seed=self.config.seed * 1_000_003 + self._round)

    def _generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation | Exception]:
        try:
            return list(self.backend.generate(prompts, params))
        except Exception:  # noqa: BLE001 - isolate the failing call; its siblings must go on
            out: list[Generation | Exception] = []
            for p in prompts:
                try:
                    out.extend(self.backend.generate([p], params))
                except Exception as exc:  # noqa: BLE001
                    out.append(exc)
            return out

    def step(self, live: list[EpisodeState], sink: Sink) -> tuple[list[EpisodeState], RoundStats]:
        """Advance every live episode by one call (in backend batches); return those still live."""
        t0 = time.perf_counter()
        still, invocations, finished = [], [], []
        stats = [0, 0, 0]
        for lo in range(0, len(live), self.config.max_batch):
            batch = live[lo : lo + self.config.max_batch]
            planned = [self._prompt(s) for s in batch]
            by_kind: dict[InvocationKind, list[int]] = {}
            for i, (kind, *_rest) in enumerate(planned):
                by_kind.setdefault(kind, []).append(i)
            results: dict[int, Generation | Exception] = {}
            for kind, idx in by_kind.items():
                gens = self._generate([planned[i][1].ids for i in idx], self._params(kind))
                results.update(zip(idx, gens, strict=True))
            for i, s in enumerate(batch):
                kind, prompt, chunk, chunk_index = planned[i]
                gen = results[i]
                if isinstance(gen, Exception):
                    finished.append(self._end(s, EpisodeStatus.failed, "backend error",
                                              error=f"{type(gen).__name__}: {gen}"))
                    continue
                inv = self._invocation(s, kind, prompt, chunk, chunk_index, gen)
                invocations.append(inv)
                stats[0] += 1
                stats[1] += inv.prompt_tokens
                stats[2] += inv.output_tokens
                s.memory, s.next_step = inv.memory_after, s.next_step + 1
                s.calls += 1
                s.tokens += inv.prompt_tokens + inv.output_tokens
                if kind is InvocationKind.answer:
                    finished.append(self._finish(s, inv))
                else:
                    still.append(s)
        self._round += 1
        sink.invocations(invocations)
        if finished:
            sink.episodes_finished(finished)
        return still, RoundStats(stats[0], stats[1], stats[2], len(finished), time.perf_counter() - t0)

    def _invocation(self, s: EpisodeState, kind: InvocationKind, prompt: Prompt, chunk: str | None,
                    chunk_index: int | None, gen: Generation) -> Invocation:
        output_text = self.tokenizer.decode(gen.output_ids, skip_special_tokens=True)
        memory_after = self.memory.update(s.memory, gen.output_ids) if kind is InvocationKind.memory_update \
            else s.memory
        return Invocation(
            episode_id=s.episode.id, step=s.next_step, kind=kind, policy_version=self.policy_version,
            prompt_ids=prompt.ids, output_ids=gen.output_ids, output_logprobs=gen.logprobs,
            prompt_text=prompt.text, output_text=output_text, memory_before=s.memory, memory_after=memory_after,
            chunk_text=chunk, chunk_index=chunk_index, finish_reason=gen.finish_reason,
            temperature=self.config.temperature, latency_s=gen.latency_s,
        )

    def _finish(self, s: EpisodeState, answer: Invocation) -> Episode:
        prediction = answer.output_text.strip()
        scores = self.score(prediction, s.task)
        n, total = s.n_updates(self.config.max_chunks), len(s.task.chunks)
        if n < total:
            status, reason = EpisodeStatus.truncated, f"read {n} of {total} chunks (max_chunks)"
        elif answer.finish_reason is FinishReason.length:
            status, reason = EpisodeStatus.truncated, "answer hit answer_max_new_tokens"
        else:
            status, reason = EpisodeStatus.answered, "answered"
        return s.episode.model_copy(update={
            "prediction": prediction, "f1": scores.f1, "em": scores.em, "sub_em": scores.sub_em,
            "reward": scores.f1, "status": status, "stop_reason": reason, "finished_at": utcnow(),
        })

    def _end(self, s: EpisodeState, status: EpisodeStatus, reason: str, error: str | None = None) -> Episode:
        return s.episode.model_copy(update={"status": status, "stop_reason": reason, "error": error,
                                            "reward": 0.0, "finished_at": utcnow()})

    def run(self, states: list[EpisodeState], sink: Sink,
            on_round: Callable[[RoundStats], None] | None = None) -> None:
        live = list(states)
        while live:
            live, stats = self.step(live, sink)
            if on_round:
                on_round(stats)

"""The one agent loop, shared by rollout and evaluation: it drives any memory policy.

The memory policy (``agentmem.agent.memory``) says which call each episode wants next and how its output
changes the episode's state; the loop batches those calls across episodes, routes each call kind to a
backend (or every call, with its task, to the oracle writer: ``agentmem.agent.oracle``, no model), stores
every call as an Invocation and decides each episode's outcome. At every round, the next
call of every live episode goes to the backends together: in slices of ``max_batch`` episodes, each slice
grouped by (call kind, max_new_tokens) -- the kind picks the backend -- with the round's sampling seed
``seed * 1_000_003 + round``.

Invariants:
- the ``prompt_ids`` of every emitted Invocation are exactly the ids passed to the backend, and
  ``output_ids``/``output_logprobs`` exactly what it returned (the oracle returns no log-probs: None);
  ``kind`` is the call's kind, ``memory_policy`` the policy's name and ``role`` ``model`` or ``oracle``; ``memory_before``/``memory_after`` are the policy's memory text;
- with ``privileged`` (a privileged rollout, PSD's off-policy samples) the backend is passed
  ``privileged(episode) + prompt ids``; the Invocation stores the spliced ids apart (``privileged_ids``,
  ``sampled_context`` ``privileged``) and ``prompt_ids`` stays the student-visible prompt; the memory
  carried on is the privileged sampler's output;
- a policy sees only the chunks ``max_chunks`` lets it read; the outcome is ``truncated`` when chunks
  were left unread or the answer hit its token limit, ``answered`` otherwise;
- an episode's state is rebuilt from its stored calls (``AgentLoop.start``), so a resumed episode
  continues exactly where the store says it stopped (an answer stored without its outcome is scored,
  not asked again);
- a ``KeyedBackend`` (several servers: ``backends.server_pool``) gets each call's episode id with its prompt, so
  an episode's calls go to one server;
- a failing call is data, not a crash: its episode ends ``failed`` with the error, siblings go on;
- an episode whose calls the sink refuses (``Sink.invocations`` returns its id: a rollout worker lost its
  lease to another worker) is dropped at once, in-memory state and all: it is neither continued nor finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentmem.agent.memory import Call, MemoryPolicy, consume
from agentmem.agent.oracle import OracleWriter
from agentmem.agent.registry import memory_policy, register_memory_policy
from agentmem.backends.types import Backend, Generation, KeyedBackend, SamplingParams
from agentmem.config import AgentConfig
from agentmem.errors import AgentError
from agentmem.records import Episode, EpisodeStatus, FinishReason, Invocation, SamplingContext, Task, utcnow
from envs.metrics import Scores

__all__ = [
    "AgentConfig", "AgentLoop", "Call", "EpisodeState", "ListSink", "MemoryPolicy", "RoundStats", "Sink",
    "memory_policy", "register_memory_policy",
]

DEFAULT_ROUTE = "*"


@dataclass
class EpisodeState:
    """One live episode: the policy's state (``memory``; ``None`` until the loop starts the episode from
    ``stored``), the chunks the policy may read (``readable``), the next step and running totals."""

    episode: Episode
    task: Task
    memory: Any = None
    next_step: int = 0
    calls: int = 0
    tokens: int = 0
    stored: Sequence[Invocation] = ()
    readable: Task | None = None
    answered: Invocation | None = None  # a stored final call whose outcome was never written
    privileged_ids: list[int] | None = None  # spliced before every prompt of a privileged rollout

    def n_updates(self, max_chunks: int | None) -> int:
        n = len(self.task.chunks)
        return n if max_chunks is None else min(n, max_chunks)


def _check_steps(episode: Episode, stored: Sequence[Invocation]) -> None:
    if [i.step for i in stored] != list(range(len(stored))):
        raise AgentError(f"episode {episode.id}: stored steps are not 0..{len(stored) - 1}")


class Sink(Protocol):
    """Where finished work goes, as it completes (the rollout job writes it to the store).

    ``invocations`` may return the ids of episodes whose calls it refused (none stored): the loop drops
    those episodes. ``None`` or an empty collection: everything was taken."""

    def invocations(self, invocations: list[Invocation]) -> Collection[str] | None: ...

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
    dropped: int = 0  # episodes the sink refused (lost leases), dropped by the loop


def _routes(backend: Backend | Mapping[str, Backend] | None, oracle: OracleWriter | None) -> dict[str, Backend]:
    if (backend is None) == (oracle is None):
        raise AgentError("give a backend (or a mapping {call kind: Backend}) or an oracle writer, not both")
    if backend is None:
        return {}
    routes = dict(backend) if isinstance(backend, Mapping) else {DEFAULT_ROUTE: backend}
    if not routes:
        raise AgentError("no backend: give a Backend or a mapping {call kind: Backend}")
    return routes


def _call(backend: Backend, keys: list[str], prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
    """``backend``'s generations; a ``KeyedBackend`` (several servers) also gets each call's episode id."""
    if isinstance(backend, KeyedBackend):
        return backend.generate_keyed(keys, prompts, params)
    return backend.generate(prompts, params)


class AgentLoop:
    """Drives ``memory`` (default: the registered ``config.memory_policy``) over many episodes.

    ``backend`` is one Backend for every call, or a mapping from call kind to Backend with an optional
    ``"*"`` default. Every routed backend must consume the same token ids (one tokenizer: the default's,
    else the first's); the policy renders prompts with it. With ``oracle`` instead (``backend`` None), the
    oracle writes every call's output from the (call, task) pair, with no model; the policy renders
    prompts with the oracle's tokenizer, and the calls are stored with role ``oracle``. ``privileged``:
    the ids to splice before every prompt of an episode (``agent.prompts.privileged_ids``), for a
    privileged rollout (module docstring)."""

    def __init__(
        self,
        backend: Backend | Mapping[str, Backend] | None,
        config: AgentConfig,
        score: Callable[[str, Task], Scores],
        policy_version: str | None = None,
        *,
        memory: MemoryPolicy | None = None,
        oracle: OracleWriter | None = None,
        privileged: Callable[[Episode], Sequence[int]] | None = None,
        hint: Callable[[Task, Call], Sequence[int]] | None = None,
    ):
        self.backends = _routes(backend, oracle)
        if oracle is not None and (privileged is not None or hint is not None):
            raise AgentError("the oracle reads no prompt: a privileged or hint rollout needs a backend")
        if privileged is not None and hint is not None:
            raise AgentError("one splice per rollout: privileged or hint, not both")
        self.oracle = oracle
        self.privileged = privileged
        self.hint = hint
        self.role = "model" if oracle is None else oracle.name
        self.config = config
        self.score = score
        self.policy_version = policy_version
        if oracle is not None:
            self.tokenizer = oracle.tokenizer
        else:
            self.tokenizer = self.backends.get(DEFAULT_ROUTE, next(iter(self.backends.values()))).tokenizer
        if memory is None:
            memory = memory_policy(self.tokenizer, config)
        elif memory.name != config.memory_policy:
            raise AgentError(f"memory policy {memory.name!r} given, but config.memory_policy is "
                             f"{config.memory_policy!r}")
        self.memory: MemoryPolicy = memory
        if oracle is not None:
            self.oracle = oracle.for_policy(memory)
        self._round = 0

    # -- starting episodes ------------------------------------------------------------------------------

    def _readable(self, task: Task) -> Task:
        limit = self.config.max_chunks
        if limit is None or len(task.chunks) <= limit:
            return task
        return task.model_copy(update={"chunks": task.chunks[:limit]})

    def start(self, episode: Episode, task: Task, stored: Sequence[Invocation] = ()) -> EpisodeState:
        """The state of ``episode`` after its stored calls (in step order; none for a new episode)."""
        stored = tuple(stored)
        _check_steps(episode, stored)
        for inv in stored:
            if inv.memory_policy != self.memory.name:
                raise AgentError(f"episode {episode.id}: invocation {inv.id} was made by memory policy "
                                 f"{inv.memory_policy!r}, not {self.memory.name!r}")
        readable = self._readable(task)
        answered = None
        if stored:
            before = self.memory.resume(readable, stored[:-1])
            last = self.memory.next_call(before, readable)
            if last.kind != stored[-1].kind:
                raise AgentError(f"episode {episode.id}: stored step {stored[-1].step} is a {stored[-1].kind!r} "
                                 f"call, but memory policy {self.memory.name!r} would make a {last.kind!r} call")
            answered = stored[-1] if last.final else None
        return EpisodeState(
            episode, task, memory=self.memory.resume(readable, stored), next_step=len(stored), calls=len(stored),
            tokens=sum(i.prompt_tokens + i.output_tokens for i in stored), readable=readable,
            answered=answered, privileged_ids=list(self.privileged(episode)) if self.privileged else None,
        )

    def _started(self, s: EpisodeState) -> EpisodeState:
        return s if s.memory is not None else self.start(s.episode, s.task, s.stored)

    # -- one round --------------------------------------------------------------------------------------

    def _backend(self, kind: str) -> Backend:
        backend = self.backends.get(kind, self.backends.get(DEFAULT_ROUTE))
        if backend is None:
            raise AgentError(f"no backend for call kind {kind!r}; routed kinds: {', '.join(sorted(self.backends))}")
        return backend

    def _params(self, max_new_tokens: int) -> SamplingParams:
        return SamplingParams(temperature=self.config.temperature, top_p=self.config.top_p,
                              max_new_tokens=max_new_tokens, seed=self.config.seed * 1_000_003 + self._round)

    def _generate(self, backend: Backend, prompts: list[list[int]], params: SamplingParams, keys: list[str]
                  ) -> list[Generation | Exception]:
        try:
            return list(_call(backend, keys, prompts, params))
        except Exception:  # noqa: BLE001 - isolate the failing call; its siblings must go on
            out: list[Generation | Exception] = []
            for k, p in zip(keys, prompts, strict=True):
                try:
                    out.extend(_call(backend, [k], [p], params))
                except Exception as exc:  # noqa: BLE001
                    out.append(exc)
            return out

    def _plan(self, s: EpisodeState) -> Call | AgentError:
        try:
            return self.memory.next_call(s.memory, s.readable or s.task)
        except AgentError as exc:
            return exc

    def _write(self, oracle: OracleWriter, pairs: list[tuple[Call, Task]]) -> list[Generation | Exception]:
        out: list[Generation | Exception] = []
        for pair in pairs:  # one at a time: a call the oracle cannot write fails its episode only
            try:
                out.extend(oracle.generate([pair]))
            except AgentError as exc:
                out.append(exc)
        return out

    def _run_calls(self, calls: list[Call | AgentError], states: list[EpisodeState]
                   ) -> dict[int, Generation | Exception]:
        """Every planned call's generation (or error), by position; one backend (or oracle) call per
        (kind, limit). A privileged episode's prompt is its privileged ids, then the call's ids."""
        tasks = [s.readable or s.task for s in states]
        groups: dict[tuple[str, int], list[int]] = {}
        for i, call in enumerate(calls):
            if isinstance(call, Call):
                groups.setdefault((call.kind, call.max_new_tokens), []).append(i)
        results: dict[int, Generation | Exception] = {}
        for (kind, max_new_tokens), idx in groups.items():
            if self.oracle is not None:
                gens = self._write(self.oracle, [(calls[i], tasks[i]) for i in idx])  # type: ignore[misc]
            else:
                prompts = [(self._splice(states[i], calls[i]) or []) + calls[i].prompt.ids  # type: ignore[arg-type,union-attr]
                           for i in idx]
                gens = self._generate(self._backend(kind), prompts, self._params(max_new_tokens),
                                      [states[i].episode.id for i in idx])
            results.update(zip(idx, gens, strict=True))
        return results

    def step(self, live: list[EpisodeState], sink: Sink) -> tuple[list[EpisodeState], RoundStats]:
        """Advance every live episode by one call (in backend batches); return those still live."""
        t0 = time.perf_counter()
        live = [self._started(s) for s in live]
        finished = [self._finish(s, s.answered) for s in live if s.answered is not None]
        live = [s for s in live if s.answered is None]
        still, invocations = [], []
        for lo in range(0, len(live), self.config.max_batch):
            batch = live[lo : lo + self.config.max_batch]
            calls = [self._plan(s) for s in batch]
            results = self._run_calls(calls, batch)
            for i, (s, call) in enumerate(zip(batch, calls, strict=True)):
                if isinstance(call, AgentError):
                    finished.append(self._end(s, "memory policy error", f"AgentError: {call}"))
                    continue
                gen = results[i]
                if isinstance(gen, Exception):
                    reason = "backend error" if self.oracle is None else "oracle error"
                    finished.append(self._end(s, reason, f"{type(gen).__name__}: {gen}"))
                    continue
                try:
                    inv = self._advance(s, call, gen)
                except AgentError as exc:
                    finished.append(self._end(s, "memory policy error", f"AgentError: {exc}"))
                    continue
                invocations.append(inv)
                if call.final:
                    finished.append(self._finish(s, inv))
                else:
                    still.append(s)
        self._round += 1
        refused = set(sink.invocations(invocations) or ())
        if refused:
            invocations = [i for i in invocations if i.episode_id not in refused]
            still = [s for s in still if s.episode.id not in refused]
            finished = [e for e in finished if e.id not in refused]
        if finished:
            sink.episodes_finished(finished)
        stats = RoundStats(len(invocations), sum(i.prompt_tokens for i in invocations),
                           sum(i.output_tokens for i in invocations), len(finished), time.perf_counter() - t0,
                           dropped=len(refused))
        return still, stats

    def _splice(self, s: EpisodeState, call: Call) -> list[int] | None:
        """The ids spliced before ``call``'s prompt: its hint line in a hint rollout (``hint(task, call)``),
        the episode's privileged ids in a privileged rollout, None otherwise."""
        if self.hint is not None:
            return list(self.hint(s.readable or s.task, call))
        return s.privileged_ids

    def _advance(self, s: EpisodeState, call: Call, gen: Generation) -> Invocation:
        """Consume ``gen`` into ``s`` and return its Invocation (``s`` is unchanged if the policy raises)."""
        output_text = self.tokenizer.decode(gen.output_ids, skip_special_tokens=True)
        splice = self._splice(s, call)
        sampled = (SamplingContext.aligned if splice is None else
                   SamplingContext.hint if self.hint is not None else SamplingContext.privileged)
        after = consume(self.memory, s.memory, call, gen.output_ids, output_text, gen.logprobs)
        inv = Invocation(
            episode_id=s.episode.id, step=s.next_step, kind=call.kind, memory_policy=self.memory.name,
            policy_version=self.policy_version, prompt_ids=call.prompt.ids, output_ids=gen.output_ids,
            output_logprobs=gen.logprobs, role=self.role, prompt_text=call.prompt.text, output_text=output_text,
            memory_before=self.memory.memory_text(s.memory), memory_after=self.memory.memory_text(after),
            chunk_text=call.chunk_text, chunk_index=call.chunk_index, finish_reason=gen.finish_reason,
            temperature=self.config.temperature, latency_s=gen.latency_s,
            sampled_context=sampled, privileged_ids=splice,
        )
        s.memory, s.next_step = after, s.next_step + 1
        s.calls += 1
        s.tokens += inv.prompt_tokens + inv.output_tokens
        return inv

    # -- outcomes ---------------------------------------------------------------------------------------

    def _finish(self, s: EpisodeState, answer: Invocation) -> Episode:
        prediction = answer.output_text.strip()
        scores = self.score(prediction, s.task)
        n, total = s.n_updates(self.config.max_chunks), len(s.task.chunks)
        if n < total:
            status, reason = EpisodeStatus.truncated, f"read {n} of {total} chunks (--max-chunks)"
        elif answer.finish_reason is FinishReason.length:
            status, reason = EpisodeStatus.truncated, "the answer hit its token limit (--answer-tokens)"
        else:
            status, reason = EpisodeStatus.answered, "answered"
        return s.episode.model_copy(update={
            "prediction": prediction, "f1": scores.f1, "em": scores.em, "sub_em": scores.sub_em,
            "reward": scores.f1, "status": status, "stop_reason": reason, "finished_at": utcnow(),
        })

    def _end(self, s: EpisodeState, reason: str, error: str | None) -> Episode:
        return s.episode.model_copy(update={"status": EpisodeStatus.failed, "stop_reason": reason, "error": error,
                                            "reward": 0.0, "finished_at": utcnow()})

    def run(self, states: list[EpisodeState], sink: Sink,
            on_round: Callable[[RoundStats], None] | None = None) -> None:
        live = list(states)
        while live:
            live, stats = self.step(live, sink)
            if on_round:
                on_round(stats)

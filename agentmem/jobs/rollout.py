"""The rollout job: run the agent over an environment's tasks and stream every call to the store.

Order of work: the config and any resumed run are checked, the model reference is resolved and the
environment built from the tokenizer alone, so a bad flag, id or data file fails before weights load.
Then the run (with its full config) and every episode are written, each round's calls in one short
transaction, and each episode's outcome as it finishes. Episode ids are derived from (run, task, sample),
so a killed job loses at most the calls in flight and ``resume`` finishes the run without duplicating a row.

A run's episodes are work items under leases (``store.repository.leases``): ``run_rollout`` writes the run and its
episodes, then works them as one worker that claims every claimable episode (``work_run``); more workers
(``agentmem.jobs.worker``, on this machine or others) may share the run, each claiming a batch at a time.
The sink checks and renews the worker's leases in the transaction of each round's calls (and their
memory-log rows), so a worker whose episode was taken over stores nothing more for it and drops it. The
run is finished when no episode is left running, by whichever process ends last.

With ``policy: oracle`` no weights load at all: the model reference gives only the tokenizer and its chat
template, ``agentmem.agent.oracle`` writes every output from the task's facts and gold answer, and the
calls are stored with role ``oracle``, no log-probs and no policy version (no checkpoint sampled them).

With ``context: privileged`` (PSD's off-policy samples) every call is sampled with the episode's privileged
message (``agent.prompts.privileged_ids``: gold answer and evidence, the privileged teacher's splice)
before its prompt; the calls store those ids apart from the student-visible prompt (``agent.loop``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentmem import model_refs
from agentmem.agent.loop import AgentLoop, EpisodeState, RoundStats, Sink
from agentmem.agent.memory import Call, MemoryPolicy
from agentmem.agent.oracle import OracleWriter
from agentmem.backends.types import Backend
from agentmem.config import PolicySource, RolloutConfig
from agentmem.errors import ConfigError, RunError
from agentmem.jobs.memory_setup import memory_for
from agentmem.jobs.runs import RunHandle, error_line, load_run, tracked_run
from agentmem.records import Checkpoint, Episode, Invocation, Run, RunKind, SamplingContext, Task
from agentmem.replay.privileged import hint_ids, privileged_ids
from agentmem.runtime import CPU, Runtime
from envs import load_env
from envs.files import require_file
from envs.types import Env
from store import repository as repo
from store.engine import Store
from store.errors import LeaseLost
from store.repository import leases, memory_log
from store.retry import retrying


def episode_id(run_id: str, task_id: str, sample_index: int) -> str:
    return uuid.uuid5(uuid.UUID(run_id), f"{task_id}\x00{sample_index}").hex


def build_env(config: RolloutConfig, tokenizer) -> Env:
    return load_env(config.env, data_path=config.data, seed=config.seed, chunk_tokens=config.chunk_tokens,
                    count_tokens=lambda s: len(tokenizer(s, add_special_tokens=False)["input_ids"]),
                    **config.env_knobs)


@dataclass(frozen=True)
class LeaseTerms:
    """How one process holds a run's episodes (``store.repository.leases``): its owner name (unique to the process),
    how long a lease lasts without renewal, and how many claims an episode gets before it is marked failed."""

    owner: str = field(default_factory=leases.new_owner)
    seconds: float = 120.0
    max_attempts: int = 3

    def __post_init__(self) -> None:
        if self.seconds <= 0:
            raise ConfigError(f"--lease-seconds must be > 0, got {self.seconds}")
        if self.max_attempts < 1:
            raise ConfigError(f"--max-attempts must be >= 1, got {self.max_attempts}")


class StoreSink:
    """Writes each round's calls and each finished episode in its own short transaction, and keeps the
    run's heartbeat. The ``memory`` policy's episode-log entries of each round's calls (``log_entries``; most
    policies keep no log) go to ``memory_log`` in the transaction of the calls.

    With ``lease`` (a worker's terms), that same transaction first checks and renews the worker's lease of
    every episode it writes (``store.repository.leases.insert_invocations``); when some were taken over (``LeaseLost``)
    it is rolled back and redone without them, and their ids are returned (the loop drops those episodes)
    and kept in ``lost``. Their calls and log entries are never stored. Outcomes are written the same way."""

    def __init__(self, store: Store, run: RunHandle | None = None, memory: MemoryPolicy | None = None,
                 lease: LeaseTerms | None = None):
        self.store, self.run, self.lease = store, run, lease
        self.memory = memory
        self.lost: set[str] = set()

    def invocations(self, invocations: list[Invocation]) -> set[str]:
        refused: set[str] = set()

        def write() -> None:
            while True:
                kept = [i for i in invocations if i.episode_id not in refused]
                try:
                    with self.store.session() as s:
                        if self.lease is None:
                            repo.insert_invocations(s, kept)
                        else:
                            leases.insert_invocations(s, self.lease.owner, kept, self.lease.seconds)
                        entries = [] if self.memory is None else [e for i in kept for e in self.memory.log_entries(i)]
                        if entries:
                            memory_log.insert_log_entries(s, entries)
                        s.commit()
                    return
                except LeaseLost as lost:
                    refused.update(lost.episode_ids)

        retrying(write, "storing a round's calls")
        self.lost |= refused
        if self.run:
            retrying(self.run.beat, "the run's heartbeat")
        return refused

    def episodes_finished(self, episodes: list[Episode]) -> None:
        refused: set[str] = set()

        def write() -> None:
            while True:
                kept = [e for e in episodes if e.id not in refused]
                try:
                    with self.store.session() as s:
                        if self.lease is None:
                            for ep in kept:
                                repo.update_episode(s, ep)
                        else:
                            leases.finish_episodes(s, self.lease.owner, kept)
                        s.commit()
                    return
                except LeaseLost as lost:
                    refused.update(lost.episode_ids)

        retrying(write, "storing finished episodes")
        self.lost |= refused


@dataclass(frozen=True)
class RolloutResult:
    run_id: str
    episodes: list[Episode]
    resumed_episodes: int
    policy: Checkpoint | None  # the checkpoint that sampled; None for an oracle rollout
    config: RolloutConfig  # what the run ran under: a resumed run's stored config


def load_rollout_config(store: Store, run_id: str) -> tuple[str, RolloutConfig]:
    """(full run id, stored config) of a rollout run named by its id or an abbreviation of it."""
    run = load_run(store, run_id, RunKind.rollout)
    return run.id, RolloutConfig.stored(run.config)


@dataclass(frozen=True)
class RolloutSetup:
    """What every process working a rollout run shares, built from its config before any weights load: the
    tokenizer, the environment, its tasks (in the environment's order) and the model reference to load
    (None when a backend was injected)."""

    config: RolloutConfig
    tokenizer: Any
    env: Env
    tasks: list[Task]
    model: model_refs.ModelRef | None
    memory: MemoryPolicy  # built (its options checked) before any run row is written

    @property
    def oracle(self) -> bool:
        return self.config.policy is PolicySource.oracle

    def episodes(self, run_id: str) -> list[Episode]:
        """The run's episodes, one per (task, sample), with ids derived from them (so re-offering is safe)."""
        return [
            Episode(id=episode_id(run_id, t.task_id, g), run_id=run_id, env=self.env.name, task_id=t.task_id,
                    sample_index=g, question=t.question, gold_answers=t.answers, evidence=t.evidence,
                    category=t.category, n_chunks=len(t.chunks))
            for t in self.tasks for g in range(self.config.group_size)
        ]


def rollout_setup(store: Store, config: RolloutConfig, kind: RunKind = RunKind.rollout,
                  backend: Backend | Mapping[str, Backend] | None = None) -> RolloutSetup:
    """Check ``config``, resolve its model (no weights), build its memory policy (a bad ``--memory-option``
    fails here, before any row is written), its environment and tasks."""
    if config.policy is PolicySource.oracle:
        _check_oracle(config, kind, backend)
    if config.data is not None:
        require_file(config.data)  # a missing --data file fails before the tokenizer (and transformers) loads
    ref = None
    if backend is None:
        ref = model_refs.resolve(store, config.model)
        tokenizer = model_refs.load_tokenizer(ref.path)
    else:
        tokenizer = _main_backend(backend).tokenizer
    memory = memory_for(store, tokenizer, config.agent)
    if config.policy is PolicySource.oracle and not memory.oracle:
        raise ConfigError(f"policy 'oracle' writes the calls of memory policies that declare ``oracle`` (their "
                          f"oracle_text), not those of {memory.name!r}")
    env = build_env(config, tokenizer)
    tasks = env.tasks(config.episodes)
    if not tasks:
        raise ConfigError(f"environment {config.env!r} produced no tasks")
    return RolloutSetup(config, tokenizer, env, tasks, ref, memory)


def rollout_loop(store: Store, setup: RolloutSetup, backend: Backend | Mapping[str, Backend] | None,
                 policy: Checkpoint | None) -> AgentLoop:
    """The agent loop of a rollout: the sampling backend (none for an oracle rollout), the memory policy,
    and the splice of a privileged rollout (per episode) or a hint rollout (per call)."""
    config, tokenizer = setup.config, setup.tokenizer
    privileged = hint = None
    if config.context is SamplingContext.privileged:
        def privileged(episode: Episode) -> list[int]:
            return privileged_ids(tokenizer, episode)
    elif config.context is SamplingContext.hint:
        def hint(task: Task, call: Call) -> list[int]:
            return hint_ids(tokenizer, task.evidence, call.chunk_text)
    return AgentLoop(backend, config.agent, setup.env.score, policy_version=policy.id if policy else None,
                     memory=setup.memory,
                     oracle=OracleWriter(tokenizer) if setup.oracle else None, privileged=privileged, hint=hint)


@dataclass
class WorkStats:
    """What one process did on a run: episodes claimed (and of those, resumed from stored calls), calls
    stored, episodes dropped because their lease was lost."""

    claimed: int = 0
    resumed: int = 0
    calls: int = 0
    lost: int = 0


def work_run(store: Store, run_id: str, loop: AgentLoop, setup: RolloutSetup, lease: LeaseTerms, sink: Sink, *,
             batch: int | None = None, on_start: Callable[[int, int], None] | None = None,
             on_round: Callable[[RoundStats], None] | None = None) -> WorkStats:
    """Work run ``run_id``'s episodes until none is claimable: claim up to ``batch`` (None: all claimable,
    then more only once those are done), start each from its stored calls, and step them through ``loop``
    into ``sink``, topping the batch up as episodes end. Leases of this host's dead processes are released
    first (a resumed job does not wait for them to expire). On an error or an interrupt the episodes still
    held are released (with the error, which then counts as their attempt's)."""
    order = {(t.task_id, g): i for i, t in enumerate(setup.tasks) for g in range(setup.config.group_size)}
    tasks = {t.task_id: t for t in setup.tasks}
    stats = WorkStats()
    def release_dead() -> None:
        with store.session() as s:
            leases.release_dead(s, run_id)
            s.commit()

    retrying(release_dead, "releasing the leases of dead processes")
    live: list[EpisodeState] = []
    dry = False  # the last claim found less than it asked for: claim again only once the batch is empty
    try:
        while True:
            if not live or (batch is not None and len(live) < batch and not dry):
                room = None if batch is None else batch - len(live)
                new = _claim(store, run_id, loop, tasks, lease, room)
                new.sort(key=lambda st: order.get((st.episode.task_id, st.episode.sample_index), len(order)))
                dry = room is None or len(new) < room
                stats.claimed += len(new)
                stats.resumed += sum(1 for st in new if st.next_step > 0)
                if on_start is not None:
                    _announce(store, run_id, on_start)
                    on_start = None
                live += new
            if not live:
                return stats
            live, round_stats = loop.step(live, sink)
            stats.calls += round_stats.calls
            stats.lost += round_stats.dropped
            if on_round:
                on_round(round_stats)
    except BaseException as exc:
        error = None if isinstance(exc, KeyboardInterrupt) else error_line(exc)
        with contextlib.suppress(Exception), store.session() as s:  # the store may be what failed
            leases.release(s, lease.owner, [st.episode.id for st in live], error=error)
            s.commit()
        raise


def _claim(store: Store, run_id: str, loop: AgentLoop, tasks: Mapping[str, Task], lease: LeaseTerms,
           n: int | None) -> list[EpisodeState]:
    claimed = retrying(lambda: _claim_now(store, run_id, lease, n), "claiming episodes")
    stored: dict[str, list[Invocation]] = {e.id: [] for e in claimed}

    def read() -> list[Invocation]:  # its own session: a retried read never meets a failed transaction
        with store.session() as s:
            return list(repo.stream_invocations(s, episode_ids=list(stored)))

    if claimed:
        for inv in retrying(read, "reading stored calls"):
            stored[inv.episode_id].append(inv)
    try:
        missing = sorted({e.task_id for e in claimed} - set(tasks))
        if missing:
            raise RunError(f"run {run_id}: episodes of task(s) {', '.join(missing[:3])} are not among the tasks "
                           "its config builds here (is the data file the same on this machine?)")
        return [loop.start(ep, tasks[ep.task_id], stored[ep.id]) for ep in claimed]
    except Exception as exc:
        with contextlib.suppress(Exception), store.session() as s:
            leases.release(s, lease.owner, list(stored), error=error_line(exc))
            s.commit()
        raise


def _claim_now(store: Store, run_id: str, lease: LeaseTerms, n: int | None) -> list[Episode]:
    with store.session() as s:
        claimed = leases.claim(s, run_id, lease.owner, n, lease.seconds, lease.max_attempts)
        s.commit()
        return claimed


def _announce(store: Store, run_id: str, on_start: Callable[[int, int], None]) -> None:
    with store.session() as s:
        total = len(repo.list_episodes(s, run_id))
        running = leases.running_episodes(s, run_id)
    on_start(total, total - running)


def run_rollout(
    store: Store,
    config: RolloutConfig | None,
    runtime: Runtime = CPU,
    *,
    resume: str | None = None,
    kind: RunKind = RunKind.rollout,
    backend: Backend | Mapping[str, Backend] | None = None,
    policy: Checkpoint | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_round: Callable[[RoundStats], None] | None = None,
    sink: Sink | None = None,
    lease: LeaseTerms | None = None,
) -> RolloutResult:
    """Run a rollout, or with ``resume`` (a rollout run id; ``config`` may be None) finish a stored one.

    ``backend`` and ``policy`` inject a ready backend (or a ``{call kind: backend}`` mapping with an optional
    ``"*"`` default, as ``AgentLoop`` takes) and its checkpoint row (tests, benchmarks, the train loop);
    otherwise the model named by ``config.model`` is resolved, registered and loaded. An oracle rollout
    (``config.policy``) takes neither and loads only the tokenizer of ``config.model``.
    ``on_start(episodes_total, episodes_done)`` is called once the work is known, ``on_round`` after every
    batched round of calls. ``kind`` is the kind of a new run (evaluation runs this as ``RunKind.eval``).

    The process writes the run and its episodes, then works them as one worker (``work_run``) that
    claims every claimable episode at once; other workers (``agentmem worker``) may share the run. The run
    is marked finished when no episode is left running, by whichever process ends last."""
    resumed = None
    if resume is not None:
        run_row = load_run(store, resume, kind)
        resumed = run_row.id
        config = type(config or RolloutConfig()).stored(run_row.config)  # the stored config rules
    if config is None:
        raise ConfigError("run_rollout needs a config or a run to resume")
    if (backend is None) != (policy is None):
        raise ConfigError("give both backend and policy, or neither")
    # a resumed run is checked before it is taken over; a new run's row comes first, so its id is the
    # first line even when the default model is prepared (about 30 s) for the tokenizer that builds the tasks
    setup = rollout_setup(store, config, kind, backend) if resumed is not None else None
    lease = lease or LeaseTerms()
    with tracked_run(store, kind, config, resume=resumed, shared=True) as run:
        rid = run.id
        if setup is None:
            with run.provisional():
                setup = rollout_setup(store, config, kind, backend)
        if backend is None and not setup.oracle:  # after the run row: its id is known while weights load
            policy, backend = model_refs.sampler(store, setup.model, config.backend, config.dtype, runtime,
                                             base_url=config.base_url)
        with store.session() as s:
            repo.insert_episodes(s, setup.episodes(rid))
            if resumed is not None:  # the user resumes: killed attempts are not the episodes' fault
                leases.release_dead(s, rid)
                leases.reset_attempts(s, rid)
            s.commit()
        loop = rollout_loop(store, setup, backend, policy)
        work = work_run(store, rid, loop, setup, lease, sink or StoreSink(store, run, memory=loop.memory, lease=lease),
                        on_start=on_start, on_round=on_round)
    with store.session() as s:
        final = repo.list_episodes(s, rid)
    return RolloutResult(run_id=rid, episodes=final, resumed_episodes=work.resumed, policy=policy, config=config)


def create_rollout(store: Store, config: RolloutConfig | None, *, resume: str | None = None,
                   backend: Backend | Mapping[str, Backend] | None = None) -> str:
    """Write a rollout run and its episodes (or, with ``resume``, take a stored run over) without loading
    any weights, and return its id: workers (``agentmem.jobs.worker``) then do the calls. ``backend``: an
    injected backend whose tokenizer builds the tasks (tests, benchmarks), instead of ``config.model``'s."""
    if resume is not None:
        config = RolloutConfig.stored(load_run(store, resume, RunKind.rollout).config)
    if config is None:
        raise ConfigError("create_rollout needs a config or a run to resume")
    setup = rollout_setup(store, config, backend=backend)
    with store.session() as s:
        if resume is None:
            run = repo.start_run(s, Run(kind=RunKind.rollout, config=config.model_dump(mode="json")))
        else:
            run = repo.claim_run(s, resume)
        repo.insert_episodes(s, setup.episodes(run.id))
        s.commit()
    return run.id


def _check_oracle(config: RolloutConfig, kind: RunKind, backend: object) -> None:
    if backend is not None:
        raise ConfigError("an oracle rollout runs no model: give no backend (config.model names the tokenizer)")
    if kind is not RunKind.rollout:
        raise ConfigError(f"policy 'oracle' is for rollouts; a {kind.value} run measures a model")


def _main_backend(backend: Backend | Mapping[str, Backend]) -> Backend:
    if isinstance(backend, Mapping):
        return backend.get("*") or next(iter(backend.values()))
    return backend

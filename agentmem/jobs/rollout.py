"""The rollout job: run the agent over an environment's tasks and stream every call to the store.

Order of work: the config and any resumed run are checked, the model reference is resolved and the
environment built from the tokenizer alone, so a bad flag, id or data file fails before weights load.
Then the run (with its full config) and every episode are written, each round's calls in one short
transaction, and each episode's outcome as it finishes. Episode ids are derived from (run, task, sample),
so a killed job loses at most the calls in flight and ``resume`` finishes the run without duplicating a row.

With ``policy: oracle`` no weights load at all: the model reference gives only the tokenizer and its chat
template, ``agentmem.agent.oracle`` writes every output from the task's facts and gold answer, and the
calls are stored with role ``oracle``, no log-probs and no policy version (no checkpoint sampled them).

With ``context: privileged`` (PSD's off-policy samples) every call is sampled with the episode's privileged
message (``agent.prompts.privileged_ids``: gold answer and evidence, the privileged teacher's splice)
before its prompt; the calls store those ids apart from the student-visible prompt (``agent.loop``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from agentmem import models
from agentmem.agent.loop import AgentLoop, EpisodeState, RoundStats, Sink
from agentmem.agent.oracle import OracleWriter
from agentmem.agent.overwrite import OverwritePolicy
from agentmem.agent.prompts import privileged_ids
from agentmem.agent.registry import memory_policy_factory
from agentmem.config import PolicySource, RolloutConfig
from agentmem.errors import ConfigError
from agentmem.jobs.memory_setup import memory_for
from agentmem.jobs.runs import RunHandle, load_run, tracked_run
from agentmem.policy.types import Backend
from agentmem.records import Checkpoint, Episode, EpisodeStatus, Invocation, RunKind, TeacherContext
from agentmem.runtime import CPU, Runtime
from envs import load_env
from envs.types import Env
from store import repository as repo
from store.engine import Store


def episode_id(run_id: str, task_id: str, sample_index: int) -> str:
    return uuid.uuid5(uuid.UUID(run_id), f"{task_id}\x00{sample_index}").hex


def build_env(config: RolloutConfig, tokenizer) -> Env:
    return load_env(config.env, data_path=config.data, seed=config.seed, chunk_tokens=config.chunk_tokens,
                    count_tokens=lambda s: len(tokenizer(s, add_special_tokens=False)["input_ids"]),
                    **config.env_knobs)


class StoreSink:
    """Writes each round's calls and each finished episode in its own short transaction, and keeps the
    run's heartbeat."""

    def __init__(self, store: Store, run: RunHandle | None = None):
        self.store, self.run = store, run

    def invocations(self, invocations: list[Invocation]) -> None:
        with self.store.session() as s:
            repo.insert_invocations(s, invocations)
            s.commit()
        if self.run:
            self.run.beat()

    def episodes_finished(self, episodes: list[Episode]) -> None:
        with self.store.session() as s:
            for ep in episodes:
                repo.update_episode(s, ep)
            s.commit()


@dataclass(frozen=True)
class RolloutResult:
    run_id: str
    episodes: list[Episode]
    resumed_episodes: int
    policy: Checkpoint | None  # the checkpoint that sampled; None for an oracle rollout


def load_rollout_config(store: Store, run_id: str) -> tuple[str, RolloutConfig]:
    """(full run id, stored config) of a rollout run named by its id or an abbreviation of it."""
    run = load_run(store, run_id, RunKind.rollout)
    return run.id, RolloutConfig.stored(run.config)


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
) -> RolloutResult:
    """Run a rollout, or with ``resume`` (a rollout run id; ``config`` may be None) finish a stored one.

    ``backend`` and ``policy`` inject a ready backend (or a ``{call kind: backend}`` mapping with an optional
    ``"*"`` default, as ``AgentLoop`` takes) and its checkpoint row (tests, benchmarks, the train loop);
    otherwise the model named by ``config.model`` is resolved, registered and loaded. An oracle rollout
    (``config.policy``) takes neither and loads only the tokenizer of ``config.model``.
    ``on_start(episodes_total, episodes_done)`` is called once the work is known, ``on_round`` after every
    batched round of calls. ``kind`` is the kind of a new run (evaluation runs this as ``RunKind.eval``)."""
    resumed = None
    if resume is not None:
        run_row = load_run(store, resume, kind)
        resumed = run_row.id
        config = type(config or RolloutConfig()).stored(run_row.config)  # the stored config rules
    if config is None:
        raise ConfigError("run_rollout needs a config or a run to resume")
    if (backend is None) != (policy is None):
        raise ConfigError("give both backend and policy, or neither")
    oracle = config.policy is PolicySource.oracle
    if oracle:
        _check_oracle(config, kind, backend)
    if backend is None:
        ref = models.resolve(store, config.model)
        tokenizer = models.load_tokenizer(ref.path)
    else:
        tokenizer = _main_backend(backend).tokenizer
    env = build_env(config, tokenizer)
    tasks = env.tasks(config.episodes)
    if not tasks:
        raise ConfigError(f"environment {config.env!r} produced no tasks")
    writer = OracleWriter(tokenizer) if oracle else None
    if backend is None and not oracle:
        policy, backend = models.sampler(store, ref, config.backend, config.dtype, runtime)
    with tracked_run(store, kind, config, resume=resumed) as run:
        rid = run.id
        episodes = [
            Episode(id=episode_id(rid, t.task_id, g), run_id=rid, env=env.name, task_id=t.task_id, sample_index=g,
                    question=t.question, gold_answers=t.answers, evidence=t.evidence, category=t.category,
                    n_chunks=len(t.chunks))
            for t in tasks for g in range(config.group_size)
        ]
        by_task = {t.task_id: t for t in tasks}
        privileged = None
        if config.context is TeacherContext.privileged:
            def privileged(episode: Episode) -> list[int]:
                return privileged_ids(tokenizer, episode)
        loop = AgentLoop(backend, config.agent, env.score, policy_version=policy.id if policy else None,
                         memory=memory_for(store, tokenizer, config.agent), oracle=writer, privileged=privileged)
        with store.session() as s:
            repo.insert_episodes(s, episodes)
            s.commit()
            stored = {e.id: e for e in repo.list_episodes(s, rid)}
            states: list[EpisodeState] = []
            for ep in episodes:
                current = stored[ep.id]
                if current.status is EpisodeStatus.running:
                    states.append(loop.start(current, by_task[ep.task_id], repo.episode_invocations(s, ep.id)))
        resumed = sum(1 for st in states if st.next_step > 0)
        if on_start:
            on_start(len(episodes), len(episodes) - len(states))
        loop.run(states, sink or StoreSink(store, run), on_round=on_round)
    with store.session() as s:
        final = repo.list_episodes(s, rid)
    return RolloutResult(run_id=rid, episodes=final, resumed_episodes=resumed, policy=policy)


def _check_oracle(config: RolloutConfig, kind: RunKind, backend: object) -> None:
    if backend is not None:
        raise ConfigError("an oracle rollout runs no model: give no backend (config.model names the tokenizer)")
    if kind is not RunKind.rollout:
        raise ConfigError(f"policy 'oracle' is for rollouts; a {kind.value} run measures a model")
    if config.agent.memory_policy != OverwritePolicy.name and not _oracle_aware(config.agent.memory_policy):
        raise ConfigError(f"policy 'oracle' writes the {OverwritePolicy.name!r} memory policy's calls and those of "
                          f"policies with oracle_text, not {config.agent.memory_policy!r}'s")


def _oracle_aware(name: str) -> bool:
    factory = memory_policy_factory(name)
    return factory is not None and hasattr(getattr(factory, "__self__", factory), "oracle_text")


def _main_backend(backend: Backend | Mapping[str, Backend]) -> Backend:
    if isinstance(backend, Mapping):
        return backend.get("*") or next(iter(backend.values()))
    return backend

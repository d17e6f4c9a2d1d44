"""The rollout job: run the agent over an environment's tasks and stream every call to the store.

Writes happen as work completes: the run (with its full config) and every episode first, then each
round's calls in one short transaction, and each episode's outcome as it finishes. Episode ids are
derived from (run, task, sample), so a killed job loses at most the calls in flight and ``resume``
finishes the run from the store without duplicating any row.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentmem.agent.loop import AgentConfig, AgentLoop, EpisodeState, RoundStats, Sink, resume_state
from agentmem.policy.types import Backend
from agentmem.records import Checkpoint, Episode, EpisodeStatus, Invocation, Run, RunKind
from envs import load_env
from envs.types import Env
from store import repository as repo
from store.engine import Store


class RolloutConfig(BaseModel):
    """Everything a rollout depends on; stored with the run so ``--resume`` needs only the run id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    env: str = "synthetic"
    data: str | None = None
    env_knobs: dict[str, Any] = Field(default_factory=dict)
    model: str = "default"
    backend: Literal["transformers", "vllm"] = "transformers"
    # fp32 by default: on CPU it is faster end to end for long prompts (prefill dominates), and the stored
    # sampler log-probs then match the fp32 training recompute (bf16 differs by ~0.03 on average).
    dtype: Literal["bfloat16", "float32"] = "float32"
    episodes: int = Field(8, ge=1)
    group_size: int = Field(1, ge=1)
    seed: int = Field(0, ge=0)
    chunk_tokens: int = Field(512, ge=16)
    agent: AgentConfig = Field(default_factory=AgentConfig)


def episode_id(run_id: str, task_id: str, sample_index: int) -> str:
    return uuid.uuid5(uuid.UUID(run_id), f"{task_id}\x00{sample_index}").hex


def build_env(config: RolloutConfig, backend: Backend) -> Env:
    tok = backend.tokenizer
    return load_env(config.env, data_path=config.data, seed=config.seed, chunk_tokens=config.chunk_tokens,
                    count_tokens=lambda s: len(tok(s, add_special_tokens=False)["input_ids"]), **config.env_knobs)


def register_policy(store: Store, model_path: str, base_model: str) -> Checkpoint:
    """The checkpoint row for the model that samples (reused when that path is registered already)."""
    with store.session() as s:
        found = repo.find_checkpoint_by_path(s, model_path)
        if found:
            return found
        ckpt = Checkpoint(path=model_path, base_model=base_model)
        repo.insert_checkpoint(s, ckpt)
        s.commit()
        return ckpt


class StoreSink:
    """Writes each round's calls and each finished episode in its own short transaction."""

    def __init__(self, store: Store):
        self.store = store

    def invocations(self, invocations: list[Invocation]) -> None:
        with self.store.session() as s:
            repo.insert_invocations(s, invocations)
            s.commit()

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


def start_run(store: Store, config: RolloutConfig, kind: RunKind = RunKind.rollout) -> Run:
    run = Run(kind=kind, config=config.model_dump(mode="json"))
    with store.session() as s:
        repo.insert_run(s, run)
        s.commit()
    return run


def load_run_config(store: Store, run_id: str) -> tuple[str, RolloutConfig]:
    """(full run id, stored config) of a rollout run named by its id or an abbreviation of it."""
    with store.session() as s:
        run = repo.get_run(s, run_id)
    if run.kind is not RunKind.rollout:
        raise ValueError(f"run {run.id} is a {run.kind.value} run, not a rollout")
    return run.id, RolloutConfig.model_validate(run.config)


def run_rollout(
    store: Store,
    config: RolloutConfig,
    backend: Backend,
    policy: Checkpoint,
    *,
    run_id: str | None = None,
    kind: RunKind = RunKind.rollout,
    on_start: Callable[[int, int], None] | None = None,
    on_round: Callable[[RoundStats], None] | None = None,
    sink: Sink | None = None,
) -> RolloutResult:
    """Run (or, with ``run_id``, resume) a rollout. ``on_start(episodes_total, episodes_done)`` is called
    once the work is known; ``on_round`` after every batched round of calls. ``kind`` is the kind of a
    new run (evaluation runs the same machinery as ``RunKind.eval``)."""
    env = build_env(config, backend)
    tasks = env.tasks(config.episodes)
    if not tasks:
        raise ValueError(f"environment {config.env!r} produced no tasks")
    run = start_run(store, config, kind) if run_id is None else None
    rid = run.id if run else run_id
    assert rid is not None
    episodes = [
        Episode(id=episode_id(rid, t.task_id, g), run_id=rid, env=env.name, task_id=t.task_id, sample_index=g,
                question=t.question, gold_answers=t.answers, evidence=t.evidence, category=t.category,
                n_chunks=len(t.chunks))
        for t in tasks for g in range(config.group_size)
    ]
    by_task = {t.task_id: t for t in tasks}
    with store.session() as s:
        repo.insert_episodes(s, episodes)
        s.commit()
        stored = {e.id: e for e in repo.list_episodes(s, rid)}
        states: list[EpisodeState] = []
        for ep in episodes:
            current = stored[ep.id]
            if current.status is EpisodeStatus.running:
                states.append(resume_state(current, by_task[ep.task_id], repo.episode_invocations(s, ep.id)))
    resumed = sum(1 for st in states if st.next_step > 0)
    if on_start:
        on_start(len(episodes), len(episodes) - len(states))
    loop = AgentLoop(backend, config.agent, env.score, policy_version=policy.id)
    loop.run(states, sink or StoreSink(store), on_round=on_round)
    with store.session() as s:
        repo.finish_run(s, rid)
        s.commit()
        final = repo.list_episodes(s, rid)
    return RolloutResult(run_id=rid, episodes=final, resumed_episodes=resumed)

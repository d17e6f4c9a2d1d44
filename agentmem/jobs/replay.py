"""The replay job (ReOPD, ``agentmem rollout --replay-from RUN``): the student samples single calls
branched from a stored teacher (or oracle) run; and the state-coverage audit (``agentmem replay-audit``).

Order of work: the config, the teacher run (a rollout of a memory policy that declares ``replayable``, e.g.
overwrite, with stored calls)
and the student's model reference are checked and the branch steps drawn before any weights load. For
every teacher episode, in (task, sample) order, one step ``t`` is drawn with ``P(t) ∝ kappa**t``
(``replay.reopd.draw_branch_steps``, seeded by ``config.seed``); the student samples that call
``group_size`` times from exactly its stored ``prompt_ids`` (the teacher's prompt, holding the teacher's
memory), with the teacher run's token limit for the call's kind. No environment is built or stepped and
no document is re-read. Batches of ``max_batch`` calls use the sampling seed ``seed * 1_000_003 + batch``.

Stored as a run of kind ``replay``: one episode per (teacher episode, sample ``g``), with the teacher
episode's task, question, gold answers and evidence and ``sample_index = teacher sample * group_size + g``,
holding one invocation at the teacher call's step whose ``parent_invocation_id`` is that call. Episodes end
``truncated`` (the stop reason names the branch) with no prediction and no reward, even when the drawn
call is the answer: a replay call is scored by the teacher, never by the task (RL on a replay run is
refused: ``jobs.distill.check_rl_runs``); ``failed`` with the error when the backend fails the call. Each
call and its episode's outcome are written in one transaction, episode ids derive from (run, teacher
episode, g), so ``resume`` finishes a killed run without duplicating a row.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentmem import model_refs
from agentmem.agent.registry import memory_policy, policy_class, replayable_policies
from agentmem.backends.types import Backend, Generation, SamplingParams
from agentmem.config import AgentConfig, ReplayConfig, RolloutConfig
from agentmem.errors import ConfigError
from agentmem.jobs.runs import load_run, tracked_run
from agentmem.records import (
    Checkpoint,
    Episode,
    EpisodeStatus,
    Invocation,
    InvocationKind,
    RunKind,
    utcnow,
)
from agentmem.replay.reopd import Coverage, draw_branch_steps, state_coverage
from agentmem.runtime import CPU, Runtime
from store import repository as repo
from store.engine import Store


@dataclass(frozen=True)
class Branch:
    """One replay episode to sample: the teacher episode and call it branches from, and sample ``g``."""

    teacher_episode: Episode
    parent: Invocation
    g: int


@dataclass(frozen=True)
class ReplayResult:
    run_id: str
    episodes: list[Episode]
    calls: int  # calls sampled by this invocation of the job (a resume counts only its own)
    policy: Checkpoint


def replay_episode_id(run_id: str, teacher_episode_id: str, g: int) -> str:
    return uuid.uuid5(uuid.UUID(run_id), f"{teacher_episode_id}\x00{g}").hex


def teacher_calls(store: Store, teacher_run: str) -> tuple[str, AgentConfig, list[tuple[Episode, list[Invocation]]]]:
    """(full run id, its agent config, its episodes with their stored calls in step order, in (task,
    sample) order, episodes without calls left out). Raises ConfigError for a run ReOPD cannot branch from."""
    run = load_run(store, teacher_run, RunKind.rollout)
    agent = RolloutConfig.stored(run.config).agent
    if not policy_class(agent.memory_policy).replayable:
        raise ConfigError(f"run {run.id} used memory policy {agent.memory_policy!r}, which does not declare "
                          f"``replayable``: replay branches from the calls of {', '.join(replayable_policies())}")
    with store.session() as s:
        episodes = repo.list_episodes(s, run.id)
        calls: dict[str, list[Invocation]] = {}
        for inv in repo.stream_invocations(s, run_ids=[run.id]):
            calls.setdefault(inv.episode_id, []).append(inv)
    out = [(ep, calls[ep.id]) for ep in episodes if ep.id in calls]
    if not out:
        raise ConfigError(f"run {run.id} has no stored calls to branch from")
    return run.id, agent, out


def plan_branches(episodes: list[tuple[Episode, list[Invocation]]], config: ReplayConfig) -> list[Branch]:
    """The branches of a replay run: one drawn step per teacher episode, ``group_size`` samples of it."""
    steps = draw_branch_steps([len(calls) for _, calls in episodes], config.kappa, config.seed)
    return [Branch(ep, calls[t], g) for (ep, calls), t in zip(episodes, steps, strict=True)
            for g in range(config.group_size)]


def run_replay(
    store: Store,
    config: ReplayConfig | None,
    runtime: Runtime = CPU,
    *,
    resume: str | None = None,
    backend: Backend | None = None,
    policy: Checkpoint | None = None,
) -> ReplayResult:
    """Sample the branches of ``config`` (or, with ``resume``, finish the stored replay run of that id;
    ``config`` may be None). ``backend`` and ``policy`` inject a ready backend and its checkpoint row
    (tests); otherwise ``config.model`` is resolved, registered and loaded."""
    resumed = None
    if resume is not None:
        run_row = load_run(store, resume, RunKind.replay)
        resumed, config = run_row.id, ReplayConfig.model_validate(run_row.config)
    if config is None:
        raise ConfigError("run_replay needs a config or a run to resume")
    if (backend is None) != (policy is None):
        raise ConfigError("give both backend and policy, or neither")
    teacher_id, agent, episodes = teacher_calls(store, config.teacher_run)
    config = config.model_copy(update={"teacher_run": teacher_id})
    branches = plan_branches(episodes, config)
    if backend is None:
        ref = model_refs.resolve(store, config.model)
        tokenizer = model_refs.load_tokenizer(ref.path)
    else:
        tokenizer = backend.tokenizer
    _check_vocab(branches, len(tokenizer))
    memory: Any = memory_policy(tokenizer, agent)  # replayable: it has ``update``
    with tracked_run(store, RunKind.replay, config, resume=resumed) as run:
        if backend is None:  # after the run row: its id is known while weights load
            policy, backend = model_refs.sampler(store, ref, config.backend, config.dtype, runtime)
        assert policy is not None
        rows = [_episode(run.id, b, config.group_size) for b in branches]
        with store.session() as s:
            repo.insert_episodes(s, rows)
            s.commit()
            done = {e.id for e in repo.list_episodes(s, run.id) if e.status is not EpisodeStatus.running}
        todo = [(b, ep) for b, ep in zip(branches, rows, strict=True) if ep.id not in done]
        for n, lo in enumerate(range(0, len(todo), config.max_batch)):
            batch = todo[lo : lo + config.max_batch]
            gens = _sample(backend, [b for b, _ in batch], agent, config, n)
            with store.session() as s:
                for (b, ep), gen in zip(batch, gens, strict=True):
                    _store(s, ep, b, gen, memory, policy, config)
                s.commit()
            run.beat()
    with store.session() as s:
        final = repo.list_episodes(s, run.id)
    return ReplayResult(run.id, final, len(todo), policy)


def _episode(run_id: str, b: Branch, group_size: int) -> Episode:
    t = b.teacher_episode
    return Episode(id=replay_episode_id(run_id, t.id, b.g), run_id=run_id, env=t.env, task_id=t.task_id,
                   sample_index=t.sample_index * group_size + b.g, question=t.question, gold_answers=t.gold_answers,
                   evidence=t.evidence, category=t.category, n_chunks=t.n_chunks)


def _check_vocab(branches: list[Branch], vocab: int) -> None:
    for b in branches:
        top = int(b.parent.prompt_ids.max(initial=0))
        if top >= vocab:
            raise ConfigError(f"teacher call {b.parent.id} holds token id {top}, outside the student's "
                              f"{vocab}-token vocabulary: replay needs the teacher's tokenizer")


def _max_new_tokens(inv: Invocation, agent: AgentConfig) -> int:
    return agent.answer_max_new_tokens if inv.kind == InvocationKind.answer.value else agent.memory_tokens


def _sample(backend: Backend, batch: list[Branch], agent: AgentConfig, config: ReplayConfig, n: int
            ) -> list[Generation | Exception]:
    """The batch's generations, one backend call per token limit; a failing call fails its branch only."""
    out: dict[int, Generation | Exception] = {}
    groups: dict[int, list[int]] = {}
    for i, b in enumerate(batch):
        groups.setdefault(_max_new_tokens(b.parent, agent), []).append(i)
    for limit, idx in groups.items():
        params = SamplingParams(temperature=config.temperature, top_p=config.top_p, max_new_tokens=limit,
                                seed=config.seed * 1_000_003 + n)
        prompts = [batch[i].parent.prompt_ids.tolist() for i in idx]
        try:
            out.update(zip(idx, backend.generate(prompts, params), strict=True))
        except Exception as exc:  # noqa: BLE001 - the failing batch's branches end failed, the run goes on
            out.update((i, exc) for i in idx)
    return [out[i] for i in range(len(batch))]


def _store(s, episode: Episode, b: Branch, gen: Generation | Exception, memory: Any,
           policy: Checkpoint, config: ReplayConfig) -> None:
    parent = b.parent
    if isinstance(gen, Exception):
        repo.update_episode(s, episode.model_copy(update={
            "status": EpisodeStatus.failed, "stop_reason": "backend error", "error": f"{type(gen).__name__}: {gen}",
            "finished_at": utcnow()}))
        return
    final = parent.kind == InvocationKind.answer.value
    inv = Invocation(
        episode_id=episode.id, step=parent.step, kind=parent.kind, memory_policy=parent.memory_policy,
        policy_version=policy.id, prompt_ids=parent.prompt_ids, output_ids=gen.output_ids,
        output_logprobs=gen.logprobs, prompt_text=parent.prompt_text,
        output_text=memory.tokenizer.decode(gen.output_ids, skip_special_tokens=True),
        memory_before=parent.memory_before,
        memory_after=parent.memory_before if final else memory.update(parent.memory_before, gen.output_ids),
        chunk_text=parent.chunk_text, chunk_index=parent.chunk_index, finish_reason=gen.finish_reason,
        temperature=config.temperature, latency_s=gen.latency_s, parent_invocation_id=parent.id,
    )
    repo.insert_invocations(s, [inv])
    repo.update_episode(s, episode.model_copy(update={
        "status": EpisodeStatus.truncated, "finished_at": utcnow(),
        "stop_reason": f"replay: step {parent.step} of teacher episode {b.teacher_episode.id}"}))


# ---- the state-coverage audit -----------------------------------------------------------------------


def audit_coverage(store: Store, student_run: str, teacher_run: str) -> Coverage:
    """The share of the student run's calls whose state (task, step, kind, memory read) the teacher run
    visited (``replay.reopd.state_coverage``). Both are rollout runs (the student's a normal rollout of
    the same tasks)."""
    student = load_run(store, student_run, RunKind.rollout)
    teacher = load_run(store, teacher_run, RunKind.rollout)
    with store.session() as s:
        task_of: Mapping[str, str] = {e.id: e.task_id for e in repo.list_episodes(s, [student.id, teacher.id])}
        student_calls = list(repo.stream_invocations(s, run_ids=[student.id]))
        teacher_calls_ = list(repo.stream_invocations(s, run_ids=[teacher.id]))
    if not student_calls:
        raise ConfigError(f"run {student.id} has no stored calls to audit")
    return state_coverage(student_calls, teacher_calls_, task_of)


__all__ = ["Branch", "ReplayResult", "audit_coverage", "plan_branches", "replay_episode_id", "run_replay",
           "teacher_calls"]

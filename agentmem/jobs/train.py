"""The train job (``agentmem train``): the loop. Each round rolls out the round's tasks (with the current
checkpoint; or, as ``round_data`` says, with the teacher or the oracle), distills on that rollout and registers
the new checkpoint, which samples the next round.
Every stored invocation carries the id of the checkpoint that sampled it (its policy version); every
distill checkpoint names its parent.

The config is one ``TrainConfig``: a ``RolloutConfig`` and a ``DistillConfig`` used for every round (each
round sets the sampling model, the student, the run ids and the seeds). The default is sized for a CPU:
the default model as the student and, as the teacher, the same base model under the ``privileged``
context, so one small model runs the whole loop. A stored call longer than the row budget is left out
and counted (``train_steps.metrics.skipped_calls``), never cut.

Rounds in the store: round ``n`` (1-based) of train run ``T`` distills with ``out`` set to
``<distill.out>/T/round-n`` (``round_out``), so its checkpoints land in that folder and the distill run's
stored config names its train run and round; that run's ``run_ids`` name the round's rollout, and its last
checkpoint is the round's result. Nothing else is recorded: ``load_train_state`` rebuilds the finished
rounds from the store alone. ``--resume T`` (``run_train(resume=T)``) then continues at the first
unfinished round from the last finished round's checkpoint:

- a round whose distill run exists but did not finish is resumed: its rollout is kept and the distill run
  continues from its last checkpoint (from its first step when it saved none);
- a round whose distill run never started is redone from its rollout: a rollout it had begun or finished
  stays in the store, unlinked (no distill run names it), and a new one is made with the same config and
  seed, which samples the same calls.

Where the work runs: by default all in this process. ``rollout_with`` does a round's calls elsewhere (``agentmem
train --ray``: Ray actors working the written run, ``ray_rollout.round_rollout``), and ``launch`` runs each training
job (the rounds' distills, the warm start's SFT) elsewhere (a Ray Train group, ``ray_train.launcher``); the store
and the loop's decisions stay here, so rounds, resume and the stored records are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agentmem import model_refs
from agentmem.agent.loop import RoundStats
from agentmem.agent.registry import check_kinds
from agentmem.config import (
    HELD_OUT_SEED,
    DistillConfig,
    EvalConfig,
    RolloutConfig,
    RoundData,
    SftConfig,
    TrainConfig,
)
from agentmem.errors import RunError
from agentmem.jobs.distill import DistillResult, run_distill
from agentmem.jobs.rollout import RolloutResult, run_rollout
from agentmem.jobs.runs import RunHandle, load_run, tracked_run
from agentmem.jobs.sft import run_sft
from agentmem.jobs.teacher_check import TeacherReport, check_teacher
from agentmem.records import Checkpoint, Episode, Run, RunKind, TrainStep
from agentmem.runtime import CPU, Runtime
from agentmem.tracking import TrackerKind, check_installed
from agentmem.training.checkpoints import drop_optimizer_state
from agentmem.training.dynamics import round_warnings
from agentmem.training.term_registry import check_loss_terms
from store import repository as repo
from store.engine import Store


class Launch(Protocol):
    """Runs a training job (``run_distill``, ``run_sft``) as ``job(store, config, runtime, ...)`` would, maybe in
    other processes; returns its result."""

    def __call__(self, job: Callable[..., Any], store: Store, config: Any, runtime: Runtime, *,
                 resume: str | None = None, on_step: Callable[[TrainStep], None] | None = None,
                 report_to: Sequence[TrackerKind] = ()) -> DistillResult: ...


# a round's rollout done elsewhere: (store, the round's config, the checkpoint that samples, None for the oracle)
RolloutWith = Callable[[Store, RolloutConfig, Checkpoint | None], RolloutResult]


def in_process(job: Callable[..., Any], store: Store, config: Any, runtime: Runtime, *, resume: str | None = None,
               on_step: Callable[[TrainStep], None] | None = None,
               report_to: Sequence[TrackerKind] = ()) -> DistillResult:
    """``Launch`` in this process (the default)."""
    return job(store, config, runtime, resume=resume, on_step=on_step, report_to=report_to)


@dataclass(frozen=True)
class RoundResult:
    round: int
    policy: Checkpoint
    rollout_run_id: str
    distill_run_id: str
    mean_f1: float
    checkpoint: Checkpoint
    rl_live_fraction: float | None = None  # groups with a non-zero advantage over the round's steps (RL on)
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class TrainState:
    """What the store holds of a train run: its config, its finished rounds in order, and the distill run
    of the first unfinished round when that one had started distilling (else None)."""

    run: Run
    config: TrainConfig
    finished: list[RoundResult]
    pending_distill: str | None


def warm_out(base_out: str, train_run_id: str) -> str:
    """The checkpoint folder of a train run's warm-start SFT (the sft run's ``out``, by which it is found)."""
    return str(Path(base_out) / train_run_id / "warm-start")


def round_out(base_out: str, train_run_id: str, round_index: int) -> str:
    """The checkpoint folder of round ``round_index`` (0-based) of a train run: the distill run's ``out``,
    by which the round is found again."""
    return str(Path(base_out) / train_run_id / f"round-{round_index + 1}")


def load_train_config(run: Run) -> TrainConfig:
    data = dict(run.config)
    data["rollout"] = RolloutConfig.stored(data.get("rollout") or {})
    return TrainConfig.model_validate(data)


def load_train_state(store: Store, run_id: str) -> TrainState:
    """The train run named by ``run_id`` (abbreviations allowed) and its rounds, found in the store."""
    run = load_run(store, run_id, RunKind.train)
    config = load_train_config(run)
    start = model_refs.register(store, model_refs.resolve(store, config.distill.student))
    if config.warm_start is not None:
        warm = warm_start_checkpoint(store, run.id, config)
        if warm is None:
            return TrainState(run, config, [], None)
        start = warm
    with store.session() as s:
        distills: dict[str, Run] = {}
        for summary in sorted(repo.list_runs(s), key=lambda x: x.run.created_at):
            if summary.run.kind is RunKind.distill and "out" in summary.run.config:
                distills[summary.run.config["out"]] = summary.run  # the latest of one out folder wins
        finished, policy = [], start
        for r in range(config.rounds):
            distill = distills.get(round_out(config.distill.out, run.id, r))
            if distill is None:
                return TrainState(run, config, finished, None)
            stored = DistillConfig.model_validate(distill.config)
            if stored.student != policy.id:
                raise RunError(f"train run {run.id}: round {r + 1}'s distill run {distill.id} trained "
                               f"{stored.student}, not the previous round's checkpoint {policy.id}")
            ckpts = repo.list_checkpoints(s, distill.id)
            if distill.status != "finished" or not ckpts or ckpts[-1].step != stored.optim.steps:
                return TrainState(run, config, finished, distill.id)
            mean_f1 = _mean_f1(repo.list_episodes(s, stored.run_ids[0]))
            steps = repo.list_train_steps(s, distill.id)
            finished.append(RoundResult(r, policy, stored.run_ids[0], distill.id, mean_f1, ckpts[-1],
                                        _live(steps, stored), tuple(round_warnings(steps, bool(stored.effective_rl_weight)))))
            policy = ckpts[-1]
    return TrainState(run, config, finished, None)


def run_train(
    store: Store,
    config: TrainConfig | None,
    runtime: Runtime = CPU,
    *,
    resume: str | None = None,
    on_phase: Callable[[str], None] | None = None,
    on_step: Callable[[TrainStep], None] | None = None,
    on_round: Callable[[RoundStats], None] | None = None,
    report_to: Sequence[TrackerKind] = (),
    rollout_with: RolloutWith | None = None,
    launch: Launch = in_process,
) -> tuple[str, list[RoundResult]]:
    """Run ``config.rounds`` rounds, or with ``resume`` (a train run id; ``config`` may be None) continue
    a stored run at its first unfinished round (see the module docstring). Return the train run id and
    one result per round, the earlier finished ones included. ``report_to``: trackers that log each round's
    distill steps (each distill run its own tracker run, under its round's folder). ``rollout_with`` and
    ``launch``: where the rounds' calls and training jobs run (the module docstring)."""
    say = on_phase or (lambda _msg: None)
    state = None
    if resume is not None:
        state = _resumable(load_train_state(store, resume))
        config = state.config
    if config is None:
        raise RunError("run_train needs a config or a train run to resume")
    check_installed(report_to)
    for kinds in (config.distill.kinds, config.distill.teacher.aligned_kinds, config.warm_start and config.warm_start.kinds):
        check_kinds(kinds or None)
    check_loss_terms(config.distill.loss.terms)
    start = model_refs.resolve(store, config.distill.student)
    if config.distill.teacher.model:
        model_refs.resolve(store, config.distill.teacher.model)  # a bad teacher fails before the first rollout
    with tracked_run(store, RunKind.train, config, resume=state.run.id if state else None) as run:
        rounds = list(state.finished) if state else []
        pending = state.pending_distill if state else None
        fresh = not rounds and pending is None
        policy = rounds[-1].checkpoint if rounds else model_refs.register(store, start)
        if config.warm_start is not None and not rounds:
            policy = warm_start(store, config, run, runtime, say, on_step, launch)
        if fresh and config.teacher_check_episodes and config.distill.teacher.model and config.distill.effective_kd_weight:
            say(validate_teacher(store, config, runtime).line())
        for r in range(len(rounds), config.rounds):
            result = _round(store, config, r, policy, run, runtime, say, on_step, on_round, pending, report_to,
                            rollout_with, launch)
            rounds.append(result)
            if (r > 0 or config.warm_start is not None) and runtime.is_main:
                # the round's start was this run's own checkpoint: the round's last checkpoint now keeps the
                # AdamW state a resume or the next round needs, so the earlier copy (twice the model) goes
                drop_optimizer_state(Path(policy.path))
            policy, pending = result.checkpoint, None
            run.beat(force=True)
    return run.id, rounds


def _warm_run(store: Store, out: str) -> Run | None:
    """The latest sft run writing into ``out`` (a train run's warm start), or None."""
    with store.session() as s:
        runs = [r.run for r in repo.list_runs(s) if r.run.kind is RunKind.sft and r.run.config.get("out") == out]
    return max(runs, key=lambda r: r.created_at) if runs else None


def warm_start_checkpoint(store: Store, train_run_id: str, config: TrainConfig) -> Checkpoint | None:
    """The last checkpoint of the train run's finished warm-start SFT, or None when it has not finished."""
    run = _warm_run(store, warm_out(config.distill.out, train_run_id))
    if run is None:
        return None
    with store.session() as s:
        ckpts = repo.list_checkpoints(s, run.id)
    if run.status != "finished" or not ckpts or config.warm_start is None or ckpts[-1].step != config.warm_start.optim.steps:
        return None
    return ckpts[-1]


def warm_start(store: Store, config: TrainConfig, run: RunHandle, runtime: Runtime, say: Callable[[str], None],
               on_step: Callable[[TrainStep], None] | None, launch: Launch = in_process) -> Checkpoint:
    """Run (or resume, or reuse) the warm-start SFT of ``config`` from ``distill.student``; its last
    checkpoint starts round 1."""
    assert config.warm_start is not None
    done = warm_start_checkpoint(store, run.id, config)
    if done is not None:
        return done
    out = warm_out(config.distill.out, run.id)
    partial = _warm_run(store, out)
    # its last checkpoint keeps the optimizer state: round 1 goes on with it (distill's carry_optimizer)
    sft: SftConfig = config.warm_start.model_copy(update={"student": config.distill.student, "out": out,
                                                          "keep_optimizer": True})
    if partial is not None:
        say(f"warm start: resuming SFT run {partial.id}")
        result = launch(run_sft, store, None, runtime, resume=partial.id, on_step=on_step)
    else:
        say(f"warm start: SFT on {', '.join(sft.run_ids)} for {sft.optim.steps} steps")
        result = launch(run_sft, store, sft, runtime, on_step=on_step)
    run.beat(force=True)
    assert result.last_checkpoint is not None
    return result.last_checkpoint


def teacher_eval_config(config: TrainConfig) -> EvalConfig:
    """The teacher check's evaluation: the rollout's environment and limits, greedy, on held-out tasks."""
    r = config.rollout
    agent = r.agent.model_copy(update={"temperature": 0.0, "seed": HELD_OUT_SEED})
    return EvalConfig(env=r.env, data=r.data, env_knobs=r.env_knobs, chunk_tokens=r.chunk_tokens,
                      episodes=config.teacher_check_episodes, backend=r.backend, dtype=r.dtype, agent=agent)


def validate_teacher(store: Store, config: TrainConfig, runtime: Runtime) -> TeacherReport:
    """Refuse (ConfigError) a teacher that stops at once on more than ``max_teacher_empty`` of a call kind, or
    writes ``(empty)`` after evidence on more than ``max_teacher_forgot`` of its updates."""
    assert config.distill.teacher.model is not None
    teacher = model_refs.register(store, model_refs.resolve(store, config.distill.teacher.model))
    return check_teacher(store, teacher, teacher_eval_config(config), runtime, config.max_teacher_empty,
                         config.max_teacher_forgot)


def _live(steps: Sequence[TrainStep], config: DistillConfig) -> float | None:
    if not config.effective_rl_weight:
        return None
    groups = sum(s.metrics.get("rl_groups", 0.0) for s in steps)
    return sum(s.metrics.get("rl_groups_live", 0.0) for s in steps) / groups if groups else 0.0


def _resumable(state: TrainState) -> TrainState:
    run = state.run
    if len(state.finished) == state.config.rounds:
        raise RunError(f"train run {run.id} ({run.status}) has finished all {state.config.rounds} rounds: nothing "
                       f"to resume (final checkpoint {state.finished[-1].checkpoint.id})")
    if run.status == "running" and repo.run_liveness(run) == "live":
        raise RunError(f"train run {run.id} is still running (pid {run.pid} on {run.host}): stop it first")
    return state


def _round(store: Store, config: TrainConfig, r: int, policy: Checkpoint, run: RunHandle, runtime: Runtime,
           say: Callable[[str], None], on_step: Callable[[TrainStep], None] | None,
           on_round: Callable[[RoundStats], None] | None, pending_distill: str | None,
           report_to: Sequence[TrackerKind] = (), rollout_with: RolloutWith | None = None,
           launch: Launch = in_process) -> RoundResult:
    """One round: rollout with ``policy``, then distill on it; with ``pending_distill``, only resume that
    distill run (its rollout is done)."""
    label = f"round {r + 1}/{config.rounds}"
    rollout_cfg, distill_cfg = config.round_configs(r, policy.id)
    if pending_distill is None:
        rolled = _round_rollout(store, config, rollout_cfg, policy, runtime, say, label, on_round, rollout_with)
        run.beat(force=True)
        rollout_id, mean_f1 = rolled.run_id, _mean_f1(rolled.episodes)
        say(f"{label}: rollout F1 {mean_f1:.3f}; distill {distill_cfg.optim.steps} steps")
        distill_cfg = distill_cfg.model_copy(update={"run_ids": [rollout_id],
                                                     "out": round_out(config.distill.out, run.id, r)})
        distilled: DistillResult = launch(run_distill, store, distill_cfg, runtime, on_step=on_step,
                                          report_to=report_to)
    else:
        with store.session() as s:
            rollout_id = DistillConfig.model_validate(repo.get_run(s, pending_distill).config).run_ids[0]
            mean_f1 = _mean_f1(repo.list_episodes(s, rollout_id))
        say(f"{label}: rollout {rollout_id} done (F1 {mean_f1:.3f}); resuming distill run {pending_distill}")
        distilled = launch(run_distill, store, None, runtime, resume=pending_distill, on_step=on_step,
                           report_to=report_to)
    assert distilled.last_checkpoint is not None
    with store.session() as s:  # every step of the round, those before a resume too
        steps = repo.list_train_steps(s, distilled.run_id)
    warnings = round_warnings(steps, bool(distill_cfg.effective_rl_weight))
    for w in warnings:
        say(f"{label}: warning: {w}")
    return RoundResult(r, policy, rollout_id, distilled.run_id, mean_f1, distilled.last_checkpoint,
                       _live(steps, distill_cfg), tuple(warnings))


def _round_rollout(store: Store, config: TrainConfig, rollout_cfg: RolloutConfig, policy: Checkpoint,
                   runtime: Runtime, say: Callable[[str], None], label: str,
                   on_round: Callable[[RoundStats], None] | None,
                   rollout_with: RolloutWith | None = None) -> RolloutResult:
    """The round's calls, written as ``config.round_data`` says: sampled by ``policy``, by the teacher under
    its context, or scripted by the oracle (no model loads); here, or by ``rollout_with``."""
    if config.round_data is RoundData.oracle:
        say(f"{label}: oracle calls on the round's tasks")
        if rollout_with is not None:
            return rollout_with(store, rollout_cfg, None)
        return run_rollout(store, rollout_cfg, runtime, on_round=on_round)
    writer = policy
    if config.round_data is RoundData.teacher:
        assert config.distill.teacher.model is not None
        writer = model_refs.register(store, model_refs.resolve(store, config.distill.teacher.model))
        rollout_cfg = rollout_cfg.model_copy(update={"model": writer.path})
        say(f"{label}: rollout with the teacher {writer.id} ({writer.path}), {rollout_cfg.context.value} context")
    else:
        say(f"{label}: rollout with {policy.id} ({policy.path})")
    if rollout_with is not None:
        return rollout_with(store, rollout_cfg, writer)
    backend = model_refs.backend(rollout_cfg.backend, writer.path, rollout_cfg.dtype, runtime)
    try:
        return run_rollout(store, rollout_cfg, runtime, backend=backend, policy=writer, on_round=on_round)
    finally:
        del backend


def _mean_f1(episodes: list[Episode]) -> float:
    return sum(e.f1 or 0.0 for e in episodes) / max(1, len(episodes))

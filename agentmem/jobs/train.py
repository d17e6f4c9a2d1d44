"""The train job (``agentmem train``): the on-policy loop. Each round rolls out with the current
checkpoint, distills on that rollout and registers the new checkpoint, which samples the next round.
Every stored invocation carries the id of the checkpoint that sampled it (its policy version); every
distill checkpoint names its parent.

The config is one ``TrainConfig``: a ``RolloutConfig`` and a ``DistillConfig`` used for every round (each
round sets the sampling model, the student, the run ids and the seeds). The default is sized for a CPU:
the default model as the student and, as the teacher, the same base model under the ``privileged``
context, so one small model runs the whole loop. A stored call longer than the row budget is left out
and counted (``train_steps.metrics.skipped_calls``), never cut.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agentmem import models
from agentmem.agent.loop import RoundStats
from agentmem.config import TrainConfig
from agentmem.jobs.distill import run_distill
from agentmem.jobs.rollout import run_rollout
from agentmem.jobs.runs import tracked_run
from agentmem.records import Checkpoint, RunKind, TrainStep
from agentmem.runtime import CPU, Runtime
from store.engine import Store


@dataclass(frozen=True)
class RoundResult:
    round: int
    policy: Checkpoint
    rollout_run_id: str
    distill_run_id: str
    mean_f1: float
    checkpoint: Checkpoint


def run_train(
    store: Store,
    config: TrainConfig,
    runtime: Runtime = CPU,
    *,
    on_phase: Callable[[str], None] | None = None,
    on_step: Callable[[TrainStep], None] | None = None,
    on_round: Callable[[RoundStats], None] | None = None,
) -> tuple[str, list[RoundResult]]:
    """Run ``config.rounds`` rounds; return the train run id and one result per round."""
    say = on_phase or (lambda _msg: None)
    start = models.resolve(store, config.distill.student)
    if config.distill.teacher:
        models.resolve(store, config.distill.teacher)  # a bad teacher fails before the first rollout
    with tracked_run(store, RunKind.train, config) as run:
        policy = models.register(store, start)
        rounds: list[RoundResult] = []
        for r in range(config.rounds):
            rollout_cfg, distill_cfg = config.round_configs(r, policy.id)
            say(f"round {r + 1}/{config.rounds}: rollout with {policy.id} ({policy.path})")
            backend = models.backend(rollout_cfg.backend, policy.path, rollout_cfg.dtype, runtime)
            rolled = run_rollout(store, rollout_cfg, runtime, backend=backend, policy=policy, on_round=on_round)
            del backend
            run.beat(force=True)
            mean_f1 = sum(e.f1 or 0.0 for e in rolled.episodes) / len(rolled.episodes)
            say(f"round {r + 1}/{config.rounds}: rollout F1 {mean_f1:.3f}; distill {distill_cfg.steps} steps")
            distill_cfg = distill_cfg.model_copy(update={"run_ids": [rolled.run_id]})
            distilled = run_distill(store, distill_cfg, runtime, on_step=on_step)
            assert distilled.last_checkpoint is not None
            rounds.append(RoundResult(r, policy, rolled.run_id, distilled.run_id, mean_f1,
                                      distilled.last_checkpoint))
            policy = distilled.last_checkpoint
            run.beat(force=True)
    return run.id, rounds

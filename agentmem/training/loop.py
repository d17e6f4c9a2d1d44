"""The on-policy loop (``agentmem train``): roll out with the current checkpoint, distill on that
rollout, register the new checkpoint, repeat. Every stored invocation carries the id of the checkpoint
that sampled it (its policy version); every distill checkpoint names its parent.

The default is sized for a CPU: the default model as the student and, as the teacher, the same base
model under the ``privileged`` context (it sees the gold answer and evidence), so one small model runs
the whole loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from agentmem.agent.loop import AgentConfig, RoundStats
from agentmem.agent.models import resolve_model_ref
from agentmem.agent.rollout import RolloutConfig, register_policy, run_rollout
from agentmem.policy.backends import make_backend
from agentmem.records import Checkpoint, Run, RunKind, TeacherContext, TrainStep
from agentmem.training.distill import DistillConfig, load_models, run_distill
from store import repository as repo
from store.engine import Store


def _default_rollout() -> RolloutConfig:
    return RolloutConfig(env="synthetic", env_knobs={"context_tokens": 384, "distractors": 2, "hops": 1},
                         episodes=4, group_size=2, chunk_tokens=192,
                         agent=AgentConfig(memory_tokens=48, answer_max_new_tokens=12, temperature=1.0))


class TrainConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    student: str = "default"
    teacher: str = "default"
    context: TeacherContext = TeacherContext.privileged
    rounds: int = Field(2, ge=1)
    steps_per_round: int = Field(2, ge=1)
    invocations_per_step: int = Field(8, ge=1)
    lr: float = Field(1e-5, gt=0)
    loss: str = "reverse_kl"
    rl: str = "grpo"
    kd_weight: float = 1.0
    rl_weight: float = 1.0
    row_tokens: int = 4096
    out: str = "checkpoints"
    seed: int = 0
    rollout: RolloutConfig = Field(default_factory=_default_rollout)


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
    *,
    on_phase: Callable[[str], None] | None = None,
    on_step: Callable[[TrainStep], None] | None = None,
    on_round: Callable[[RoundStats], None] | None = None,
) -> tuple[str, list[RoundResult]]:
    run = Run(kind=RunKind.train, config=config.model_dump(mode="json"))
    with store.session() as s:
        repo.insert_run(s, run)
        s.commit()
    path, base = resolve_model_ref(store, config.student)
    policy = register_policy(store, path, base)
    rounds: list[RoundResult] = []
    for r in range(config.rounds):
        if on_phase:
            on_phase(f"round {r + 1}/{config.rounds}: rollout with {policy.id} ({policy.path})")
        rollout_cfg = config.rollout.model_copy(update={"model": policy.id, "seed": config.seed + r})
        backend = make_backend(rollout_cfg.backend, policy.path, rollout_cfg.dtype)
        rolled = run_rollout(store, rollout_cfg, backend, policy, on_round=on_round)
        del backend
        mean_f1 = sum(e.f1 or 0.0 for e in rolled.episodes) / len(rolled.episodes)
        if on_phase:
            on_phase(f"round {r + 1}/{config.rounds}: rollout F1 {mean_f1:.3f}; distill {config.steps_per_round} steps")
        distill_cfg = DistillConfig(
            run_ids=[rolled.run_id], student=policy.id, teacher=config.teacher, context=config.context,
            loss=config.loss, rl=config.rl, kd_weight=config.kd_weight, rl_weight=config.rl_weight,
            steps=config.steps_per_round, invocations_per_step=config.invocations_per_step,
            row_tokens=config.row_tokens, lr=config.lr, seed=config.seed + r, out=config.out,
            truncate="left",
        )
        distilled = run_distill(store, distill_cfg, load_models(store, distill_cfg), on_step=on_step)
        assert distilled.last_checkpoint is not None
        rounds.append(RoundResult(r, policy, rolled.run_id, distilled.run_id, mean_f1, distilled.last_checkpoint))
        policy = distilled.last_checkpoint
    with store.session() as s:
        repo.finish_run(s, run.id)
        s.commit()
    return run.id, rounds

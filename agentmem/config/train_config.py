"""The on-policy loop: ``TrainConfig``, a rollout and a distill per round."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from agentmem.config import distill_config as distill
from agentmem.config.agent_config import AgentConfig
from agentmem.config.base import Frozen
from agentmem.config.choices import (
    Divergence,
    LrSchedule,
    Oversize,
    Packing,
    PolicySource,
    RewardKind,
    RoundData,
    TeacherTruncation,
)
from agentmem.config.distill_config import DistillConfig
from agentmem.config.rollout_config import RolloutConfig
from agentmem.config.sft_config import WarmStartConfig
from agentmem.records import SamplingContext, TeacherContext

# round r of seed s samples with seed ROUND_SEED_BASE + s x ROUND_SEEDS + r: no two seeds' rounds share tasks, and
# none is an evaluation's (held-out seeds from HELD_OUT_SEED = 1000, the learning plan's validation from 9000)
ROUND_SEED_BASE = 100_000
ROUND_SEEDS = 1000


def _train_rollout() -> RolloutConfig:
    return RolloutConfig(env="synthetic", env_knobs={"context_tokens": 384, "distractors": 2, "hops": 1},
                         episodes=4, group_size=4, chunk_tokens=192,
                         agent=AgentConfig(memory_tokens=48, answer_max_new_tokens=16, temperature=1.0))


def _train_distill() -> DistillConfig:
    # privileged: the same base model sees the gold answer and evidence, so one small model runs the loop;
    # skip: a call over the row budget is left out and counted, never cut (train_steps.metrics).
    # the stable recipe (docs/learning.md): fresh rollouts every 2 steps, one warmup + cosine schedule over
    # all rounds, AdamW's moments carried across rounds (round 1 takes the warm start's scale without its first
    # moment: the SFT's momentum is another objective's direction), a reward with variance for a small model; forward
    # KL at 5e-5 (reverse KL drove every memory update to `(empty)` in one step; at 1e-5 the student barely
    # moved from its warm start)
    return DistillConfig(
        monitor_start_kl=True,
        teacher=distill.TeacherSection(context=TeacherContext.privileged, truncation=TeacherTruncation.left),
        loss=distill.LossSection(divergence=Divergence.forward_kl),
        rl=distill.RLSection(reward=RewardKind.max_f1_sub_em),
        optim=distill.OptimSection(steps=2, lr=5e-5, warmup_steps=1, schedule=LrSchedule.cosine,
                                   carry_optimizer=True, carry_first_moment=False),
        batch=distill.BatchSection(oversize=Oversize.skip, packing=Packing.shared_prefix))


class TrainConfig(Frozen):
    """The loop: ``rounds`` × (a rollout of the round's tasks, ``distill.optim.steps`` distill steps on it).
    Each round sets the rollout's model, seed and knobs (``round_knobs``) and the distill's student, run ids
    and seed; everything else is taken as given. ``round_data`` says who writes the round's calls: the current
    checkpoint (on-policy), the teacher (SeqKD) or the oracle (SFT continued)."""

    rounds: int = Field(2, ge=1, le=ROUND_SEEDS)
    """Rollout + distill rounds."""
    seed: int = Field(0, ge=0)
    """Seed of tasks, sampling and data order: round r uses 100000 + 1000 x seed + r."""
    round_data: RoundData = RoundData.student
    """Who writes each round's calls: the student (the current checkpoint: on-policy distillation and RL), the
    teacher (distill.teacher.model, sampled under distill.teacher.context: SeqKD) or the oracle (its calls on
    the round's tasks: SFT continued). The distill's loss weights say what is learned from them."""
    round_knobs: list[dict[str, Any]] = Field(default_factory=list)
    """Environment knobs per round, cycled: round r's rollout takes the rollout's knobs (--knob) updated by entry
    r mod its length (e.g. [{level: 1}, {level: 2}, {level: 3}] rotates the task ladder). Empty: every round
    alike."""
    rollout: RolloutConfig = Field(default_factory=_train_rollout)
    distill: DistillConfig = Field(default_factory=_train_distill)
    # SFT before round 1 (its run_ids: an oracle or teacher run); its last checkpoint starts round 1
    warm_start: WarmStartConfig | None = None
    # the teacher is checked before any distillation: a greedy eval of it on ``teacher_check_episodes``
    # tasks of the rollout's environment (held-out seed); above ``max_teacher_empty`` end-of-sequence-only
    # outputs on any call kind the loop refuses it. 0 episodes: no check.
    teacher_check_episodes: int = Field(8, ge=0)
    """Validate the teacher first on this many held-out greedy episodes; refuse it when a call kind's
    end-of-sequence-only share is over --max-teacher-empty (0: no check)."""
    max_teacher_empty: float = Field(0.1, ge=0, le=1)
    """Largest end-of-sequence-only share the teacher may have on any call kind."""
    max_teacher_forgot: float = Field(0.5, ge=0, le=1)
    """Largest share of the teacher's memory updates, made once a fact was read, that write an empty memory
    ((empty)): a teacher over it would teach the student to drop what it read."""

    @model_validator(mode="after")
    def _run_ids_per_round(self) -> TrainConfig:
        if self.distill.run_ids:
            raise ValueError("distill.run_ids is set by each round of the loop: leave it empty")
        if self.round_data is RoundData.teacher and not self.distill.teacher.model:
            raise ValueError("round_data=teacher samples each round with the teacher: give distill.teacher.model")
        if self.round_data is not RoundData.student and self.distill.effective_rl_weight:
            raise ValueError(f"round_data={self.round_data.value}: the RL term needs the student's own samples "
                             "(round_data=student), not another writer's calls")
        return self

    def round_seed(self, round_index: int) -> int:
        return ROUND_SEED_BASE + self.seed * ROUND_SEEDS + round_index

    def round_rollout(self, round_index: int, policy: str, teacher: str | None = None) -> RolloutConfig:
        """Round ``round_index``'s rollout: its seed and knobs, written by ``policy`` (the current checkpoint),
        by ``teacher`` (its model path, under the teacher's context) or by the oracle, as ``round_data`` says."""
        seed = self.round_seed(round_index)
        knobs = {**self.rollout.env_knobs, **(self.round_knobs[round_index % len(self.round_knobs)]
                                              if self.round_knobs else {})}
        agent = self.rollout.agent.model_copy(update={"seed": seed})
        update: dict[str, Any] = {"model": policy, "seed": seed, "env_knobs": knobs, "agent": agent}
        if self.round_data is RoundData.teacher:
            update |= {"model": teacher or self.distill.teacher.model,
                       "context": SamplingContext(self.distill.teacher.context.value)}
        elif self.round_data is RoundData.oracle:
            update |= {"policy": PolicySource.oracle}
        return self.rollout.model_copy(update=update)

    def round_configs(self, round_index: int, policy_id: str) -> tuple[RolloutConfig, DistillConfig]:
        """Round ``round_index``'s rollout (``round_rollout``) and distill (the current policy as the student,
        seed ``round_seed``; its part of one learning-rate schedule over every round)."""
        seed = self.round_seed(round_index)
        rollout = self.round_rollout(round_index, policy_id)
        optim = self.distill.optim
        # every round carries AdamW from its student's folder when that kept a state: from round 2 on the previous
        # round's; in round 1 the warm start's or --student's (a base model folder keeps none: a fresh AdamW, whose
        # first step moves every weight by about lr; carrying the warm start's took the first step's KL to the
        # start from 0.24 to 0.015 in the learning benchmark, docs/learning.md)
        # carry_first_moment concerns round 1's start only (the warm start's or --student's moments, another job's
        # direction); from round 2 on the moments carried are this loop's own
        optim = optim.model_copy(update={
            "schedule_offset": round_index * optim.steps, "schedule_steps": self.rounds * optim.steps,
            "carry_first_moment": optim.carry_first_moment or round_index > 0})
        return rollout, self.distill.model_copy(update={"student": policy_id, "seed": seed, "optim": optim})

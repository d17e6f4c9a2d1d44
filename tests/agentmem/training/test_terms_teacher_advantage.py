"""The RL-plus-distillation form (``kd_form=advantage``): the teacher enters the RL term's advantage as
``A - c (log p_sampler(a) - log p_teacher(a))`` instead of a divergence term of its own."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from agentmem.config import DistillConfig, KdForm, RLKind, TeacherCentering
from agentmem.testing.configs import merged
from agentmem.training.terms import MicroBatch, PolicyGradientTerm, objective_from_config


def _batch(teacher: torch.Tensor) -> MicroBatch:
    logits = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]], requires_grad=True)
    actions = torch.tensor([0, 2])
    sampler = torch.log_softmax(logits.detach(), dim=-1).gather(-1, actions[:, None]).squeeze(-1)  # ratio 1
    return MicroBatch(logits=logits, action_ids=actions, sampler_logprobs=sampler,
                      sampling_temperature=torch.ones(2), advantages=torch.tensor([1.0, -0.5]),
                      weights=torch.tensor([0.25, 0.75]), teacher=teacher)


def test_the_teacher_moves_each_tokens_advantage_by_c_times_the_log_prob_gap():
    teacher = torch.tensor([[math.log(2.0), 0.0, 0.0], [0.0, 0.0, 0.0]])  # p_t(0) = 1/2; p_t(2) = 1/3
    value = PolicyGradientTerm(clip_eps=0.2, teacher_coef=0.3, needs_teacher=True)(_batch(teacher))
    gap = [math.log(1 / 3) - math.log(1 / 2), -math.log(math.e + 2) - math.log(1 / 3)]
    adv = [1.0 - 0.3 * gap[0], -0.5 - 0.3 * gap[1]]
    assert value.loss.item() == pytest.approx(-(0.25 * adv[0] + 0.75 * adv[1]), abs=1e-6)
    assert value.metrics["rl_teacher_gap"] == pytest.approx(0.25 * gap[0] + 0.75 * gap[1], abs=1e-6)
    # sampled-token teacher log-probs ([A], teacher_source=scores) give the same value
    sampled = torch.tensor([math.log(1 / 2), math.log(1 / 3)])
    same = PolicyGradientTerm(clip_eps=0.2, teacher_coef=0.3, needs_teacher=True)(_batch(sampled))
    assert same.loss.item() == pytest.approx(value.loss.item(), abs=1e-6)
    plain = PolicyGradientTerm(clip_eps=0.2)(_batch(teacher))
    assert plain.loss.item() == pytest.approx(-(0.25 * 1.0 + 0.75 * -0.5), abs=1e-6)
    assert "rl_teacher_gap" not in plain.metrics


def test_without_teacher_log_probs_the_advantage_form_is_refused():
    from agentmem.errors import TrainingError

    batch = _batch(torch.zeros(2, 3))
    with pytest.raises(TrainingError, match="no teacher log-probs"):
        PolicyGradientTerm(teacher_coef=0.3, needs_teacher=True)(MicroBatch(**{**batch.__dict__, "teacher": None}))


def test_the_config_picks_the_form_and_the_objective_follows():
    base = {"run_ids": ["r"], "teacher": {"model": "t"}, "rl": {"kind": RLKind.grpo}, "loss": {"kd_weight": 0.3}}
    additive = objective_from_config(DistillConfig(**base))
    assert [t.name for _, t in additive.terms] == ["kd", "rl"]
    advantage = objective_from_config(DistillConfig(**merged(base, {"loss": dict(kd_form=KdForm.advantage)})))
    ((weight, term),) = advantage.terms
    assert (term.name, weight, term.teacher_coef, term.needs_teacher) == ("rl", 1.0, 0.3, True)
    assert advantage.needs_teacher
    with pytest.raises(ValidationError, match="needs a teacher, kd_weight > 0, rl.kind=grpo and rl_weight > 0"):
        DistillConfig(**merged(base, {"rl": {"kind": RLKind.none}, "loss": dict(kd_form=KdForm.advantage)}))
    with pytest.raises(ValidationError, match="no distillation term to centre"):
        DistillConfig(**merged(base, {"loss": dict(kd_form=KdForm.advantage,
                                                   teacher_centering=TeacherCentering.first_token)}))

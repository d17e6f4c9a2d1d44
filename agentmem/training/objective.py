"""One optimisation step's objective on packed rows: distillation at the action positions plus the
clipped policy-gradient term on the final task reward.

Token averaging is explicit (``weighting``): the weights of all action tokens of the step sum to 1 and
are computed over the whole step before the rows are run one by one as micro-batches, so a step's loss
and gradient do not depend on how its calls were packed (a test checks packed == unpacked).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from transformers import PreTrainedModel

from agentmem.replay import Row
from agentmem.training.collate import PackedBatch
from agentmem.training.forward import collate, invocation_action_logits, split_actions
from agentmem.training.losses import distill_loss, policy_gradient_loss, sampled_logprobs, token_weights
from agentmem.training.packed_attention import Path

DivergenceKind = Literal["reverse_kl", "forward_kl", "jsd"]
WeightMode = Literal["token", "call", "episode"]


@dataclass(frozen=True)
class Objective:
    kind: DivergenceKind = "reverse_kl"
    beta: float = 0.5
    kd_weight: float = 1.0
    rl_weight: float = 1.0
    clip_eps: float = 0.2
    weighting: WeightMode = "token"


@dataclass(frozen=True)
class StepInputs:
    """Per-invocation facts the objective needs besides the rows: its episode, the episode's advantage,
    the sampling temperature, and the teacher's logits at its actions (``[O, V]``, no gradient)."""

    episode_of: Mapping[str, str]
    advantage_of: Mapping[str, float]
    temperature_of: Mapping[str, float]
    teacher_logits: Mapping[str, torch.Tensor] | None


@dataclass(frozen=True)
class StepResult:
    loss: float
    kd_loss: float
    rl_loss: float
    tokens: int
    actions: int
    metrics: dict[str, float]


def _weights(batches: Sequence[PackedBatch], inputs: StepInputs, mode: WeightMode) -> list[torch.Tensor]:
    calls, episodes = {}, {}
    seg, ep = [], []
    for b in batches:
        for inv_id, n in zip(b.invocation_ids, b.action_counts, strict=True):
            seg += [calls.setdefault(inv_id, len(calls))] * n
            ep += [episodes.setdefault(inputs.episode_of[inv_id], len(episodes))] * n
    w = token_weights(torch.tensor(seg, dtype=torch.long), torch.tensor(ep, dtype=torch.long), mode)
    return list(torch.split(w, [int(b.action_ids.shape[0]) for b in batches]))


def _per_action(batch: PackedBatch, values: Mapping[str, float]) -> torch.Tensor:
    return torch.cat([torch.full((n,), float(values[i])) for i, n in zip(batch.invocation_ids, batch.action_counts,
                                                                      strict=True)])


def teacher_action_logits(model: PreTrainedModel, rows: Sequence[Row], vocab: int, pad_id: int,
                          path: Path = "fast") -> dict[str, torch.Tensor]:
    """The teacher's fp32 logits at each invocation's actions, one packed row per forward pass."""
    out: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        for row in rows:
            batch = collate([row], pad_id, model.device)
            logits = invocation_action_logits(model, batch, vocab, path).float()
            out.update((k, v.clone()) for k, v in split_actions(batch, logits))
    return out


def accumulate_step(student: PreTrainedModel, rows: Sequence[Row], inputs: StepInputs, objective: Objective,
                    vocab: int, pad_id: int, path: Path = "fast") -> StepResult:
    """Forward and backward over the step's student rows (gradients accumulate in ``student``)."""
    device = student.device
    batches = [collate([r], pad_id, device) for r in rows]
    weights = _weights(batches, inputs, objective.weighting)
    kd_total = rl_total = 0.0
    metrics = {"clip_fraction": 0.0, "approx_kl": 0.0, "ratio_mean": 0.0}
    tokens = actions = 0
    for batch, w in zip(batches, weights, strict=True):
        logits = invocation_action_logits(student, batch, vocab, path).float()
        loss = logits.new_zeros(())
        if objective.kd_weight and inputs.teacher_logits is not None:
            teacher = torch.cat([inputs.teacher_logits[i] for i in batch.invocation_ids]).to(device)
            kd = distill_loss(logits, teacher, objective.kind, objective.beta, w)
            loss = loss + objective.kd_weight * kd
            kd_total += float(kd.detach())
        if objective.rl_weight:
            temps = _per_action(batch, inputs.temperature_of).to(device)
            new = sampled_logprobs(logits / temps[:, None], batch.action_ids)
            adv = _per_action(batch, inputs.advantage_of).to(device)
            pg, m = policy_gradient_loss(new, batch.sampler_logprobs, adv, objective.clip_eps, weights=w)
            loss = loss + objective.rl_weight * pg
            rl_total += float(pg.detach())
            share = float(w.sum())
            for key in metrics:
                metrics[key] += share * getattr(m, key)
        loss.backward()
        tokens += batch.num_tokens
        actions += int(batch.action_ids.shape[0])
    total = objective.kd_weight * kd_total + objective.rl_weight * rl_total
    return StepResult(total, kd_total, rl_total, tokens, actions, metrics if objective.rl_weight else {})

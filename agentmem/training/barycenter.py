"""The barycenter distillation target (DemoPSD): between teacher and student, weighted by how much they
disagree at each token.

At an action position with student ``p_s`` and teacher ``p_t`` (both at the distillation temperature):

    D     = discrepancy(p_s, p_t)                       default: JSD on the union of both top-K sets
    alpha = alpha_map(D)                                default: exp(-D / tau)
    alpha = clamp(ema-blend(alpha), alpha_min, alpha_max)
    q     ∝ p_t^alpha * p_s^(1 - alpha)                 (``losses.barycenter_logprobs``, floored if asked)

so a token where the two agree is taught by (nearly) the teacher, and one where they disagree strongly by
a distribution close to the student's own: the step towards the teacher is shorter where the teacher's
judgement is furthest from the state the student is in. ``q`` is a target, computed without gradient;
the distillation term then minimises its configured divergence towards it (reverse KL by default). With
reverse KL and ``q`` held fixed, the gradient at the current parameters is exactly ``alpha`` times the
gradient of ``KL(p_s || p_t)`` (``log p_s - log q = alpha (log p_s - log p_t) + log Z``; tested).

Pluggable: ``discrepancy`` (student and teacher log-probs ``[A, V]`` -> ``[A]``) and ``alpha_map``
(``[A]`` -> ``[A]``) are plain callables; ``from_config`` builds the defaults with ``alpha_topk`` and
``alpha_tau``. Another choice is another callable passed to ``BarycenterTarget``.

EMA (``alpha_ema = lambda > 0``): ``AlphaEma`` keeps ``m``, a running mean over optimizer steps of the
step's mean raw alpha (``m <- lambda m + (1 - lambda) mean_alpha``, the first step sets ``m``); each
token then uses ``lambda m + (1 - lambda) alpha_i`` (before the clamps), so the weighting moves smoothly
from step to step. It is per distill run: saved in each checkpoint's trainer state (``Objective.state_dict``)
and restored by ``--resume``; a checkpoint without it (saved before the option existed) restarts it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from agentmem.config import DistillConfig, DistillTarget
from agentmem.training.losses import barycenter_logprobs, topk_union_jsd

Discrepancy = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (log p_s, log p_t) [A, V] -> [A]
AlphaMap = Callable[[torch.Tensor], torch.Tensor]  # discrepancy [A] -> alpha [A]


def exp_alpha(discrepancy: torch.Tensor, tau: float) -> torch.Tensor:
    """``alpha = exp(-D / tau)``: 1 where teacher and student agree, towards 0 as they disagree."""
    return torch.exp(-discrepancy / tau)


@dataclass
class AlphaEma:
    """The running mean ``value`` of the per-step mean alpha (None before the first step); mutable, one per
    objective, updated once per optimizer step with the step's mean over every process."""

    decay: float
    value: float | None = None

    def blend(self, alpha: torch.Tensor) -> torch.Tensor:
        return alpha if self.value is None else self.decay * self.value + (1 - self.decay) * alpha

    def update(self, step_mean: float) -> None:
        self.value = step_mean if self.value is None else self.decay * self.value + (1 - self.decay) * step_mean


@dataclass(frozen=True)
class Barycenter:
    """The target of one micro-batch: ``logprobs`` ``[A, V]`` of ``q``, the ``alpha`` ``[A]`` it used and
    the ``raw_alpha`` ``[A]`` before EMA blending and clamps. No gradient."""

    logprobs: torch.Tensor
    alpha: torch.Tensor
    raw_alpha: torch.Tensor


@dataclass(frozen=True)
class BarycenterTarget:
    discrepancy: Discrepancy
    alpha_map: AlphaMap
    alpha_min: float = 0.0
    alpha_max: float = 1.0
    prob_floor: float = 0.0
    ema: AlphaEma | None = None

    @classmethod
    def from_config(cls, config: DistillConfig) -> BarycenterTarget | None:
        """The target ``config.loss.target`` names (None for the plain teacher)."""
        if config.loss.target is not DistillTarget.barycenter:
            return None
        return cls(functools.partial(topk_union_jsd, k=config.loss.alpha_topk),
                   functools.partial(exp_alpha, tau=config.loss.alpha_tau), config.loss.alpha_min, config.loss.alpha_max,
                   config.loss.prob_floor, AlphaEma(config.loss.alpha_ema) if config.loss.alpha_ema else None)

    def __call__(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                 temperature: float = 1.0) -> Barycenter:
        with torch.no_grad():
            dtype = torch.promote_types(student_logits.dtype, torch.float32)
            log_ps = F.log_softmax(student_logits.detach().to(dtype) / temperature, dim=-1)
            log_pt = F.log_softmax(teacher_logits.detach().to(dtype) / temperature, dim=-1)
            raw = self.alpha_map(self.discrepancy(log_ps, log_pt))
            blended = self.ema.blend(raw) if self.ema is not None else raw
            alpha = blended.clamp(self.alpha_min, self.alpha_max)
            return Barycenter(barycenter_logprobs(log_ps, log_pt, alpha, self.prob_floor), alpha, raw)

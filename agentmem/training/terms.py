"""Loss terms: the parts of the training objective, each a function of one micro-batch of action tokens.

An ``Objective`` is a weighted list of terms; the step loss is ``sum_k weight_k * term_k``, each term a
token-weighted sum over the step's action tokens (weights normalised over the whole global step, see
``objective.step_weights``), so micro-batches and processes add up to the step.

Temperature convention (one for the whole project): every distribution a term compares is taken at
``DistillConfig.loss.temperature`` (T, default 1), the student's and the teacher's (or the frozen
reference's) alike: ``p = softmax(logits / T)``. ``agentmem score`` stores its divergences at its own
``ScoreConfig.temperature`` under the same rule. The one exception is the policy-gradient importance ratio,
which compares with the sampler's stored log-probs and so uses each call's own sampling temperature.

Terms:
- ``DistillTerm``: divergence to the teacher at the action positions: full-vocabulary reverse KL,
  forward KL or generalised JSD when the teacher source gives logits ``[A, V]``; the sampled-token
  reverse-KL estimator (``losses.sampled_reverse_kl_loss``) when it gives only ``log p_t(a)`` ``[A]``.
  With full-vocabulary targets it may pull towards the barycenter of teacher and student instead
  (``barycenter``, DemoPSD) and cap each token's divergence (``jsd_clip``, OPSD);
- ``PolicyGradientTerm``: PPO/GRPO clipped surrogate on the episode's group advantage (it needs the
  student sampler's log-probs: an oracle call, stored without them, and a call sampled under a privileged
  prompt, rebuilt with NaN for the student, are refused);
- ``CrossEntropyTerm``: ``-log p_s(a)`` of the sampled action (supervised fine-tuning on the calls);
- ``AnchorTerm``: reverse KL(student || frozen reference), the reference being run on the student's own
  aligned rows (a KL anchor to the starting model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from agentmem.config import DistillConfig, Divergence, KdForm, TeacherCentering, TeacherSourceKind, Weighting
from agentmem.errors import TrainingError
from agentmem.training.barycenter import AlphaEma, BarycenterTarget
from agentmem.training.losses import (
    clipped,
    divergence,
    policy_gradient_loss,
    reverse_kl,
    sampled_logprobs,
    sampled_reverse_kl_loss,
)
from agentmem.training.term_registry import loss_term_factory


@dataclass(frozen=True)
class MicroBatch:
    """What every term sees for one packed micro-batch: one entry per action token, all on one device.

    ``teacher`` is ``[A, V]`` teacher logits (or log-probs) or ``[A]`` teacher log-probs of the sampled
    tokens; ``reference`` ``[A, V]`` logits of the frozen reference; each is None unless a term needs it.
    """

    logits: torch.Tensor  # float32 [A, V], the student's, with gradient
    action_ids: torch.Tensor  # int64 [A]
    sampler_logprobs: torch.Tensor  # float32 [A], stored with each call
    sampling_temperature: torch.Tensor  # float32 [A], each call's own (greedy calls: 1)
    advantages: torch.Tensor  # float32 [A], the call's episode group advantage
    weights: torch.Tensor  # float32 [A], normalised over the whole global step
    teacher: torch.Tensor | None = None
    reference: torch.Tensor | None = None
    # the teacher term's centring (DistillConfig.loss.teacher_centering): at action positions ``center_positions``
    # [G] (each call's first), the push to subtract there, ``center`` [G, V] (its group's weighted mean)
    center_positions: torch.Tensor | None = None
    center: torch.Tensor | None = None


@dataclass(frozen=True)
class TermValue:
    """A term's loss on one micro-batch and its metrics, each additive over micro-batches and processes
    (means are pre-multiplied by the micro-batch's share of the step's weight)."""

    loss: torch.Tensor
    metrics: dict[str, float]


class LossTerm(Protocol):
    """One part of the objective. ``name`` keys its value in the step's metrics (``{name}_loss``, where the
    progress line and the viewer read every term); its own metrics (``TermValue.metrics``) go beside it."""

    # read-only members, so that frozen dataclasses satisfy the protocol
    @property
    def name(self) -> str: ...
    @property
    def needs_teacher(self) -> bool: ...
    @property
    def needs_reference(self) -> bool: ...

    def __call__(self, batch: MicroBatch) -> TermValue: ...


@dataclass(frozen=True)
class DistillTerm:
    """``sum_i w_i D_i`` towards the teacher, or towards the ``barycenter`` target built from it; with
    ``clip``, ``min(D_i, clip)`` (a clipped token keeps its capped value and gets no gradient).

    Metrics (weight shares, so they add up to step means): ``kd_clip_fraction`` with ``clip``;
    ``alpha_mean`` and ``alpha_below_half`` (share of tokens with alpha < 0.5) with a barycenter, and
    ``alpha_raw_mean`` (before EMA and clamps) when it keeps an EMA."""

    divergence: Divergence = Divergence.reverse_kl
    beta: float = 0.5
    temperature: float = 1.0
    clip: float | None = None
    barycenter: BarycenterTarget | None = None
    teacher_temperature: float = 1.0  # the teacher's log-probs divided by it first (below 1: sharper)
    # positions where the teacher's own top probability is below this get no distillation (0: every position)
    min_confidence: float = 0.0
    # subtract the group mean of the push at each call's first token (``MicroBatch.center``, computed by
    # ``objective.accumulate_step`` over the whole step from ``push``)
    centered: bool = False
    name: str = "kd"
    needs_teacher: bool = True
    needs_reference: bool = False

    def push(self, logits: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        """The term's per-position gradient on the student's logits, ``d D_i / d z_i`` [P, V] (no weights),
        at positions whose logits [P, V] and full-distribution teacher [P, V] are given; no gradient flows."""
        leaf = logits.detach().float().requires_grad_(True)
        with torch.enable_grad():
            per_token = self._per_token(leaf, teacher.detach())[0]
            (grad,) = torch.autograd.grad(per_token.sum(), leaf)
        return grad

    def _per_token(self, logits: torch.Tensor, teacher: torch.Tensor,
                   w: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """The divergence at each position (gated, tempered, barycentred and clipped as configured) and the
        weight shares of what was gated or clipped (with ``w``)."""
        metrics: dict[str, float] = {}
        confident = None
        if self.min_confidence > 0:  # the teacher's own (untempered) top probability at each position
            confident = torch.softmax(teacher.float(), dim=-1).amax(dim=-1) >= self.min_confidence
            if w is not None:
                metrics["kd_gated_fraction"] = float((w * (~confident).to(w.dtype)).sum())
        if self.teacher_temperature != 1.0:  # log p_t / tau: the logits of p_t^(1/tau), renormalised by the softmax
            teacher = torch.log_softmax(teacher.float(), dim=-1) / self.teacher_temperature
        if self.barycenter is not None:
            target = self.barycenter(logits, teacher, self.temperature)
            teacher = target.logprobs * self.temperature  # T=1-equivalent logits of q: softmax(. / T) is q
            if w is not None:
                metrics["alpha_mean"] = float((w * target.alpha.to(w.dtype)).sum())
                metrics["alpha_below_half"] = float((w * (target.alpha < 0.5).to(w.dtype)).sum())
                if self.barycenter.ema is not None:
                    metrics["alpha_raw_mean"] = float((w * target.raw_alpha.to(w.dtype)).sum())
        per_token = divergence(logits, teacher, self.divergence.value, self.beta, self.temperature)
        if self.clip is not None:
            per_token, over = clipped(per_token, self.clip)
            if w is not None:
                metrics["kd_clip_fraction"] = float((w * over.to(w.dtype)).sum())
        if confident is not None:
            per_token = per_token * confident.to(per_token.dtype)
        return per_token, metrics

    def __call__(self, batch: MicroBatch) -> TermValue:
        teacher = batch.teacher
        if teacher is None:
            raise TrainingError("the distillation term has no teacher targets for this micro-batch")
        if teacher.dim() == 1:  # sampled-token log-probs only: the reverse-KL estimator
            if self.divergence != Divergence.reverse_kl:
                raise TrainingError(f"loss={self.divergence}: needs the teacher's full distribution; sampled-token "
                                    "teacher log-probs support only reverse_kl")
            if (self.clip is not None or self.barycenter is not None or self.teacher_temperature != 1.0
                    or self.min_confidence > 0 or self.centered):
                raise TrainingError("jsd_clip, target=barycenter, teacher_temperature, teacher_min_confidence and "
                                    "teacher_centering "
                                    "need the teacher's full "
                                    "distribution; sampled-token teacher log-probs (teacher_source=scores) have none")
            loss = sampled_reverse_kl_loss(batch.logits, batch.action_ids, teacher, batch.weights, self.temperature)
            return TermValue(loss, {})
        w = batch.weights
        per_token, metrics = self._per_token(batch.logits, teacher, w)
        loss = (per_token * w.to(per_token.dtype)).sum()
        if self.centered:
            if batch.center is None or batch.center_positions is None:
                raise TrainingError("the centred distillation term has no group means for this micro-batch "
                                    "(objective.accumulate_step computes them)")
            at = batch.center_positions
            shift = -(w[at].to(batch.center.dtype)[:, None] * batch.center * batch.logits[at].float()).sum()
            loss = loss + (shift - shift.detach())  # the value stays the divergence; the gradient is centred
        return TermValue(loss, metrics)


@dataclass(frozen=True)
class PolicyGradientTerm:
    """The clipped surrogate on each token's advantage. With ``teacher_coef`` c > 0 (``KdForm.advantage``) the
    advantage of sampled token a is ``A - c (log p_sampler(a) - log p_teacher(a))``: the teacher's per-token
    reverse-KL estimate as a penalty in the reward (slime, tinker-cookbook), the teacher's log-probs at
    temperature 1 and without gradient; ``rl_teacher_gap`` logs the weighted mean of that difference."""

    clip_eps: float = 0.2
    teacher_coef: float = 0.0
    name: str = "rl"
    needs_teacher: bool = False
    needs_reference: bool = False

    def __call__(self, batch: MicroBatch) -> TermValue:
        if bool(torch.isnan(batch.sampler_logprobs).any()):
            raise TrainingError("calls without sampler log-probs (oracle calls) or sampled under a privileged "
                                "prompt (PSD off-policy) cannot be trained with the RL term; "
                                "use rl_weight 0 / --rl none, or agentmem sft")
        new = sampled_logprobs(batch.logits / batch.sampling_temperature[:, None], batch.action_ids)
        advantages, extra = batch.advantages, {}
        if self.teacher_coef:
            if batch.teacher is None:
                raise TrainingError("kd_form=advantage: the RL term has no teacher log-probs for this micro-batch")
            teacher = batch.teacher.detach().float()
            if teacher.dim() == 2:
                teacher = torch.log_softmax(teacher, dim=-1).gather(-1, batch.action_ids[:, None]).squeeze(-1)
            gap = batch.sampler_logprobs.float() - teacher
            advantages = advantages - self.teacher_coef * gap
            extra["rl_teacher_gap"] = float((batch.weights * gap.to(batch.weights.dtype)).sum())
        loss, m = policy_gradient_loss(new, batch.sampler_logprobs, advantages, self.clip_eps,
                                       weights=batch.weights)
        share = float(batch.weights.sum())
        return TermValue(loss, {"clip_fraction": share * m.clip_fraction, "approx_kl": share * m.approx_kl,
                                "ratio_mean": share * m.ratio_mean, **extra})


@dataclass(frozen=True)
class CrossEntropyTerm:
    temperature: float = 1.0
    name: str = "ce"
    needs_teacher: bool = False
    needs_reference: bool = False

    def __call__(self, batch: MicroBatch) -> TermValue:
        nll = -sampled_logprobs(batch.logits, batch.action_ids, self.temperature)
        return TermValue((nll * batch.weights.to(nll.dtype)).sum(), {})


@dataclass(frozen=True)
class AnchorTerm:
    temperature: float = 1.0
    name: str = "anchor"
    needs_teacher: bool = False
    needs_reference: bool = True

    def __call__(self, batch: MicroBatch) -> TermValue:
        if batch.reference is None:
            raise TrainingError("the anchor term needs the frozen reference model's logits (Models.reference)")
        kl = reverse_kl(batch.logits, batch.reference, self.temperature)
        return TermValue((kl * batch.weights.to(kl.dtype)).sum(), {})


@dataclass(frozen=True)
class Objective:
    """``sum(weight * term)`` over ``terms`` (zero-weight terms are left out), tokens averaged as
    ``weighting`` says over the whole global step."""

    terms: tuple[tuple[float, LossTerm], ...]
    weighting: Weighting = Weighting.token
    alpha_ema: AlphaEma | None = None  # the barycenter target's state across steps (shared with its term)

    @property
    def needs_teacher(self) -> bool:
        return any(t.needs_teacher for _, t in self.terms)

    @property
    def needs_reference(self) -> bool:
        return any(t.needs_reference for _, t in self.terms)

    @property
    def centered(self) -> DistillTerm | None:
        """The distillation term whose push is centred at first tokens, if the objective has one."""
        return next((t for _, t in self.terms if isinstance(t, DistillTerm) and t.centered), None)

    def end_step(self, metrics: Mapping[str, float]) -> None:
        """After an optimizer step, with its metrics summed over micro-batches and processes: update the
        state kept across steps (the alpha EMA; a step without action tokens leaves it as it was)."""
        if self.alpha_ema is not None and "alpha_raw_mean" in metrics:
            self.alpha_ema.update(metrics["alpha_raw_mean"])

    def state_dict(self) -> dict[str, float]:
        """What a checkpoint keeps of the objective (empty when it keeps nothing across steps)."""
        if self.alpha_ema is None or self.alpha_ema.value is None:
            return {}
        return {"alpha_ema": self.alpha_ema.value}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        if self.alpha_ema is not None and "alpha_ema" in state:
            self.alpha_ema.value = float(state["alpha_ema"])


def objective_from_config(config: DistillConfig) -> Objective:
    """The terms a ``DistillConfig`` asks for, in a fixed order: distillation, policy gradient,
    cross-entropy, anchor, then the installed packages' terms of ``config.loss.terms`` (by name,
    ``agentmem.training.term_registry``). Raises TrainingError for a divergence the teacher source cannot
    give."""
    if (config.teacher.source == TeacherSourceKind.scores and config.effective_kd_weight
            and config.loss.divergence != Divergence.reverse_kl):
        raise TrainingError(f"loss={config.loss.divergence}: teacher_source=scores stores only the sampled token's "
                            "teacher log-prob, which supports reverse_kl only (use teacher_source=model or shards)")
    barycenter = BarycenterTarget.from_config(config)
    loss = config.loss
    advantage = loss.kd_form is KdForm.advantage  # the teacher inside the RL term's advantage, no term of its own
    candidates: list[tuple[float, LossTerm]] = [
        (0.0 if advantage else config.effective_kd_weight,
         DistillTerm(Divergence(loss.divergence), loss.beta, loss.temperature, loss.jsd_clip, barycenter,
                     config.teacher.temperature, config.teacher.min_confidence,
                     loss.teacher_centering is not TeacherCentering.none)),
        (config.effective_rl_weight, PolicyGradientTerm(config.rl.clip_eps,
                                                        config.effective_kd_weight if advantage else 0.0,
                                                        needs_teacher=advantage)),
        (loss.ce_weight, CrossEntropyTerm(loss.temperature)),
        (loss.anchor_weight, AnchorTerm(loss.temperature)),
        *((w, loss_term_factory(name)(config)) for name, w in sorted(loss.terms.items()) if w),
    ]
    return Objective(tuple((w, t) for w, t in candidates if w), Weighting(config.loss.weighting),
                     barycenter.ema if barycenter is not None else None)

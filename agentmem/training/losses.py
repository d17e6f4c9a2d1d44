"""Training losses at action positions: distillation divergences and the clipped policy-gradient surrogate;
also the pieces of the barycenter target (``topk_union_jsd``, ``barycenter_logprobs``) and per-token
divergence clipping (``clipped``).

Conventions (every function here):
- inputs are already gathered at the N action positions (positions whose next token was sampled);
  logits are ``[N, V]`` over the full vocabulary, per-position vectors are ``[N]``;
- ``p_s = softmax(student_logits / T)``, ``p_t = softmax(teacher_logits / T)``; logits must be finite;
- everything is computed in at least float32 (bf16 and fp16 inputs are upcast: a bf16 log-softmax over
  a large vocabulary loses too much; float64 stays float64), and so are the results;
- a loss is ``sum_i w_i * loss_i`` with explicit weights (``objective.step_weights``). The weights are not
  renormalised, so weights computed over a whole batch and sliced into micro-batches make the
  micro-batch losses add up to the full-batch loss (gradient accumulation gives the same step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

DivergenceKind = Literal["reverse_kl", "forward_kl", "jsd"]


def _log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return F.log_softmax(_upcast(logits) / temperature, dim=-1)


def _upcast(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row: ``sum_v p_v (log p_v - log q_v)`` -> ``[N]``."""
    # F.kl_div(input, target, log_target=True) is exp(target) * (target - input): KL(target || input).
    return F.kl_div(log_q, log_p, reduction="none", log_target=True).sum(dim=-1)


def reverse_kl(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Reverse KL(student || teacher) per action position.

    ``[N, V], [N, V] -> [N]``: ``sum_v p_s(v) * (log p_s(v) - log p_t(v))``. Mode-seeking; the on-policy
    distillation default (the student is penalised for mass the teacher does not support).
    """
    return _kl(_log_probs(student_logits, temperature), _log_probs(teacher_logits, temperature))


def forward_kl(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Forward KL(teacher || student) per action position.

    ``[N, V], [N, V] -> [N]``: ``sum_v p_t(v) * (log p_t(v) - log p_s(v))``. Mass-covering.
    """
    return _kl(_log_probs(teacher_logits, temperature), _log_probs(student_logits, temperature))


def generalized_jsd(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    beta: float,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Generalised Jensen-Shannon divergence per action position, with TRL's ``generalized_jsd_loss``
    semantics (GKD, Agarwal et al. 2023, eq. 1), before TRL's reduction over positions.

    ``[N, V], [N, V] -> [N]``, with ``beta`` in [0, 1]:

    - ``beta == 0``: forward KL(teacher || student), exactly :func:`forward_kl`;
    - ``beta == 1``: reverse KL(student || teacher), exactly :func:`reverse_kl`;
    - otherwise, with the mixture ``m = beta * p_t + (1 - beta) * p_s`` (taken in log space as
      ``logsumexp(log p_s + log(1 - beta), log p_t + log(beta))``)::

          jsd = beta * KL(p_t || m) + (1 - beta) * KL(p_s || m)

    Note that the endpoints are special cases, not limits: as ``beta -> 0`` the general formula tends to
    0 (it behaves like ``beta * KL(p_t || p_s)``), and likewise as ``beta -> 1``. ``beta = 0.5`` is the
    ordinary Jensen-Shannon divergence.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    log_ps = _log_probs(student_logits, temperature)
    log_pt = _log_probs(teacher_logits, temperature)
    if beta == 0.0:
        return _kl(log_pt, log_ps)
    if beta == 1.0:
        return _kl(log_ps, log_pt)
    b = torch.tensor(beta, dtype=log_ps.dtype, device=log_ps.device)
    log_m = torch.logsumexp(torch.stack([log_ps + torch.log1p(-b), log_pt + torch.log(b)]), dim=0)
    return b * _kl(log_pt, log_m) + (1 - b) * _kl(log_ps, log_m)


def divergence(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    kind: DivergenceKind,
    beta: float,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Per-position divergence ``[N, V], [N, V] -> [N]``: :func:`reverse_kl`, :func:`forward_kl` or
    :func:`generalized_jsd` (``beta`` is used only by ``"jsd"``)."""
    if kind == "reverse_kl":
        return reverse_kl(student_logits, teacher_logits, temperature)
    if kind == "forward_kl":
        return forward_kl(student_logits, teacher_logits, temperature)
    if kind == "jsd":
        return generalized_jsd(student_logits, teacher_logits, beta, temperature)
    raise ValueError(f"unknown divergence kind {kind!r}")


def clipped(per_position: torch.Tensor, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """OPSD-style per-token clipping -> (``min(D_i, clip)`` ``[N]``, clipped mask ``[N]`` bool).

    A position whose divergence exceeds ``clip`` contributes the constant ``clip``: its value is capped and
    its gradient is zero (the token is too far from the target to be trusted); the others are unchanged,
    gradient included."""
    if clip <= 0:
        raise ValueError(f"clip must be > 0, got {clip}")
    over = per_position.detach() > clip
    return torch.where(over, torch.full_like(per_position, clip).detach(), per_position), over


def topk_union_jsd(log_p: torch.Tensor, log_q: torch.Tensor, k: int) -> torch.Tensor:
    """Jensen-Shannon divergence of two distributions on the union of their top-``k`` tokens -> ``[N]``.

    ``[N, V], [N, V]`` log-probs (normalised over the vocabulary). Per row, ``U`` is the union of the ``k``
    most likely tokens of ``p`` and of ``q`` (at most ``2k`` tokens); both are restricted to ``U`` and
    renormalised there (``p~ = p / p(U)``), then ``JSD = 1/2 KL(p~ || m) + 1/2 KL(q~ || m)`` with
    ``m = (p~ + q~) / 2``, natural log, so ``0 <= JSD <= ln 2``. With ``k >= V`` it is the full-vocabulary
    JSD (``generalized_jsd`` at beta 1/2). Memory is ``O(N k)`` beyond the inputs.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    log_p, log_q = _upcast(log_p), _upcast(log_q)
    k = min(k, log_p.shape[-1])
    index = torch.cat([log_p.topk(k, dim=-1).indices, log_q.topk(k, dim=-1).indices], dim=-1).sort(dim=-1).values
    repeat = torch.zeros_like(index, dtype=torch.bool)
    repeat[:, 1:] = index[:, 1:] == index[:, :-1]  # a token in both top-k sets counts once

    def on_union(log_x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(log_x.gather(-1, index).masked_fill(repeat, float("-inf")), dim=-1)

    p, q = on_union(log_p), on_union(log_q)
    m = (p + q) / 2
    kl_pm = (torch.xlogy(p, p) - torch.xlogy(p, m)).sum(-1)
    kl_qm = (torch.xlogy(q, q) - torch.xlogy(q, m)).sum(-1)
    return (0.5 * (kl_pm + kl_qm)).clamp_min(0.0)


def barycenter_logprobs(
    student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, alpha: torch.Tensor, prob_floor: float = 0.0
) -> torch.Tensor:
    """Log-probs of the reverse-KL barycenter ``q ∝ p_t^alpha * p_s^(1 - alpha)`` per row -> ``[N, V]``.

    Inputs are log-probs ``[N, V]`` and ``alpha`` ``[N]`` in [0, 1]; in log space
    ``log q = alpha log p_t + (1 - alpha) log p_s - logsumexp(alpha log p_t + (1 - alpha) log p_s)``.
    ``q`` minimises ``alpha KL(q || p_t) + (1 - alpha) KL(q || p_s)``: alpha 1 gives the teacher, 0 the
    student. ``prob_floor > 0`` raises every probability to at least the floor and renormalises
    (``q' = max(q, floor) / sum max(q, floor)``), bounding how hard a reverse KL towards ``q`` pushes the
    student off a token the target almost rules out. Gradient flows back into the inputs unless they are
    detached (the distillation term computes the target without gradient).
    """
    if prob_floor < 0 or prob_floor >= 1:
        raise ValueError(f"prob_floor must be in [0, 1), got {prob_floor}")
    log_ps, log_pt = _upcast(student_logprobs), _upcast(teacher_logprobs)
    a = _upcast(alpha).to(log_ps.dtype)[:, None]
    log_q = F.log_softmax(a * log_pt + (1 - a) * log_ps, dim=-1)
    if prob_floor > 0:
        log_q = F.log_softmax(log_q.clamp_min(math.log(prob_floor)), dim=-1)
    return log_q


def sampled_reverse_kl_loss(
    student_logits: torch.Tensor,
    action_ids: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    weights: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Reverse KL(student || teacher) estimated from the sampled tokens only -> scalar.

    For a teacher known only through ``log p_t(a)`` of each sampled action ``a`` (stored per-token
    scores), with ``log p_s(a)`` the student's log-prob at ``temperature`` and ``d = log p_s(a) - log p_t(a)``:

    - value: ``sum_i w_i d_i``, the single-sample Monte-Carlo estimate of ``sum_i w_i KL_i``;
    - gradient: ``sum_i w_i stopgrad(d_i) grad log p_s(a_i)``, the score-function (REINFORCE) estimate of
      ``grad KL(p_s || p_t)`` (the other term of the exact gradient, ``E[grad log p_s] = 0``, drops out).

    Both are unbiased when the actions were sampled from the student at ``temperature`` (on-policy); the
    calls of an older policy make them an off-policy approximation, as for any sampled-token estimator.
    Built as ``stopgrad(d) * log p_s - stopgrad(stopgrad(d) * log p_s) + stopgrad(d)``: value ``d``,
    gradient ``stopgrad(d) * grad log p_s``.
    """
    log_ps = sampled_logprobs(student_logits, action_ids, temperature)
    d = (log_ps - _upcast(teacher_logprobs).to(log_ps.dtype)).detach()
    surrogate = d * log_ps
    return _weighted_sum(surrogate - surrogate.detach() + d, weights)


@dataclass(frozen=True)
class PolicyGradientMetrics:
    """Diagnostics of one :func:`policy_gradient_loss` call, each a weighted mean over tokens
    (``sum w_i x_i / sum w_i``, so a micro-batch reports its own average).

    - ``clip_fraction``: share of tokens whose gradient the clip removes, i.e. ``r < 1 - eps`` with
      ``A < 0`` or ``r > 1 + eps`` with ``A > 0`` (TRL GRPO's definition);
    - ``approx_kl``: Schulman's k3 estimator of KL(old || new), ``(r - 1) - log r``, non-negative;
    - ``ratio_mean``: mean importance ratio ``r``.
    """

    clip_fraction: float
    approx_kl: float
    ratio_mean: float


def policy_gradient_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float = 0.2,
    *,
    weights: torch.Tensor,
) -> tuple[torch.Tensor, PolicyGradientMetrics]:
    """PPO/GRPO clipped surrogate over action tokens -> (scalar loss, metrics).

    All inputs are ``[N]``: ``new_logprobs`` from the policy being trained (with gradient; use
    :func:`sampled_logprobs` at the sampler's temperature), ``old_logprobs`` the stored sampler log-probs
    (``Invocation.output_logprobs``), ``advantages`` the token's advantage (its episode's group advantage
    broadcast over its tokens), ``weights`` the step's token weights (``objective.step_weights``)::

        r_i    = exp(new_i - old_i)
        loss   = sum_i w_i * -min(r_i * A_i, clip(r_i, 1 - eps, 1 + eps) * A_i)

    With ``new == old`` the gradient is the plain REINFORCE gradient ``-sum_i w_i A_i grad(new_i)``.
    """
    if clip_eps < 0:
        raise ValueError(f"clip_eps must be >= 0, got {clip_eps}")
    old = _upcast(old_logprobs.detach())
    adv = _upcast(advantages.detach())
    log_ratio = _upcast(new_logprobs) - old
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    loss = _weighted_sum(-torch.minimum(unclipped, clipped), weights)

    with torch.no_grad():
        w = _upcast(weights.detach())
        total = w.sum().clamp_min(torch.finfo(w.dtype).tiny)
        is_clipped = ((ratio < 1 - clip_eps) & (adv < 0)) | ((ratio > 1 + clip_eps) & (adv > 0))
        metrics = PolicyGradientMetrics(
            clip_fraction=float((w * is_clipped.float()).sum() / total),
            approx_kl=float((w * (ratio - 1 - log_ratio)).sum() / total),
            ratio_mean=float((w * ratio).sum() / total),
        )
    return loss, metrics


def sampled_logprobs(
    logits: torch.Tensor, action_ids: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Log-prob of each sampled token under the temperature-scaled distribution.

    ``[N, V], [N] -> [N]``: ``log_softmax(logits / T)[i, action_ids[i]]``, in at least float32. Use the sampler's
    temperature so the result is comparable with ``Invocation.output_logprobs``.
    """
    log_p = _log_probs(logits, temperature)
    return log_p.gather(-1, action_ids.long().unsqueeze(-1)).squeeze(-1)


def _weighted_sum(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    if values.shape != weights.shape:
        raise ValueError(f"weights shape {tuple(weights.shape)} != values shape {tuple(values.shape)}")
    return (values * weights.to(values.dtype)).sum()

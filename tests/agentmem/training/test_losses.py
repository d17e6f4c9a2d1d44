"""Losses at action positions: exact values on hand-computable logits, TRL-pinned generalized JSD,
the clipped policy-gradient surrogate, and the barycenter target's pieces (JSD on the
union of top-K sets, the barycenter, per-token clipping)."""

from __future__ import annotations

import math

import pytest
import torch

from agentmem.training.losses import (
    barycenter_logprobs,
    clipped,
    divergence,
    forward_kl,
    generalized_jsd,
    policy_gradient_loss,
    reverse_kl,
    sampled_logprobs,
    topk_union_jsd,
)

torch.set_num_threads(1)

LN2, LN3 = math.log(2.0), math.log(3.0)

# Three action positions over a 4-token vocabulary; the last row has student == teacher.
STUDENT = torch.tensor(
    [[1.0, 2.0, 0.5, -1.0], [0.0, 0.0, 3.0, 1.0], [-2.0, 1.0, 1.0, 0.0]], dtype=torch.float64
)
TEACHER = torch.tensor(
    [[0.5, 2.5, -0.5, 0.0], [1.0, -1.0, 2.0, 2.0], [-2.0, 1.0, 1.0, 0.0]], dtype=torch.float64
)

# Per-position values of TRL's GKDTrainer.generalized_jsd_loss (huggingface/trl, trl/trainer/gkd_trainer.py,
# Apache-2.0) on STUDENT/TEACHER, taken before its reduction (reduction="none", summed over the vocabulary),
# computed in float64 with the function body transcribed into a scratch script. Keyed by (temperature, beta).
TRL_PINNED = {
    (1.0, 0.0): [0.1250232319, 0.4597647964, 0.0],
    (1.0, 0.1): [0.0113864679, 0.0396433933, 0.0],
    (1.0, 0.5): [0.0337292709, 0.0986611971, 0.0],
    (1.0, 0.9): [0.0134401890, 0.0337007919, 0.0],
    (1.0, 1.0): [0.1546532218, 0.3719899278, 0.0],
    (2.0, 0.0): [0.0548885664, 0.1232012656, 0.0],
    (2.0, 0.1): [0.0049501399, 0.0110035168, 0.0],
    (2.0, 0.5): [0.0139438689, 0.0299235712, 0.0],
    (2.0, 0.9): [0.0051407966, 0.0106885406, 0.0],
    (2.0, 1.0): [0.0575619387, 0.1187659267, 0.0],
}
# TRL's reduction="batchmean" over these three positions (sum / number of positions), for (1.0, beta).
TRL_BATCHMEAN = {0.0: 0.1949293428, 0.5: 0.0441301560, 1.0: 0.1755477165}


def _softmax(row: list[float], temperature: float = 1.0) -> list[float]:
    z = sum(math.exp(x / temperature) for x in row)
    return [math.exp(x / temperature) / z for x in row]


def _kl(p: list[float], q: list[float]) -> float:
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))


def _gjsd(s_row: list[float], t_row: list[float], beta: float, temperature: float) -> float:
    """Independent plain-Python reference: eq. (1) of the GKD paper in TRL's orientation."""
    ps, pt = _softmax(s_row, temperature), _softmax(t_row, temperature)
    if beta == 0.0:
        return _kl(pt, ps)
    if beta == 1.0:
        return _kl(ps, pt)
    m = [beta * t + (1 - beta) * s for s, t in zip(ps, pt, strict=True)]
    return beta * _kl(pt, m) + (1 - beta) * _kl(ps, m)


# -- reverse and forward KL ------------------------------------------------------------------------


def test_kl_on_two_tokens_by_hand() -> None:
    student = torch.tensor([[0.0, LN3]])  # p_s = (1/4, 3/4)
    teacher = torch.tensor([[0.0, 0.0]])  # p_t = (1/2, 1/2)
    expected_reverse = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    expected_forward = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert reverse_kl(student, teacher).item() == pytest.approx(expected_reverse, abs=1e-7)
    assert forward_kl(student, teacher).item() == pytest.approx(expected_forward, abs=1e-7)
    assert expected_reverse != pytest.approx(expected_forward)  # the direction matters


def test_kl_with_temperature_on_three_tokens_by_hand() -> None:
    student = torch.tensor([[0.0, 2 * LN2, 0.0]])  # at T=2: logits (0, ln 2, 0) -> p_s = (1/4, 1/2, 1/4)
    teacher = torch.tensor([[5.0, 5.0, 5.0]])  # p_t = (1/3, 1/3, 1/3)
    expected_reverse = 2 * 0.25 * math.log(0.75) + 0.5 * math.log(1.5)
    expected_forward = (1 / 3) * (2 * math.log((1 / 3) / 0.25) + math.log((1 / 3) / 0.5))
    assert reverse_kl(student, teacher, temperature=2.0).item() == pytest.approx(expected_reverse, abs=1e-7)
    assert forward_kl(student, teacher, temperature=2.0).item() == pytest.approx(expected_forward, abs=1e-7)


def test_kl_matches_plain_python_per_position() -> None:
    rev = reverse_kl(STUDENT, TEACHER)
    fwd = forward_kl(STUDENT, TEACHER)
    assert rev.shape == fwd.shape == (3,)
    for i in range(3):
        ps, pt = _softmax(STUDENT[i].tolist()), _softmax(TEACHER[i].tolist())
        assert rev[i].item() == pytest.approx(_kl(ps, pt), abs=1e-12)
        assert fwd[i].item() == pytest.approx(_kl(pt, ps), abs=1e-12)


@pytest.mark.parametrize("fn", [reverse_kl, forward_kl, lambda s, t: generalized_jsd(s, t, 0.5)])
def test_divergences_zero_when_equal_and_nonnegative(fn) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 11, generator=gen) * 3
    assert torch.allclose(fn(logits, logits.clone()), torch.zeros(5), atol=1e-6)
    other = torch.randn(5, 11, generator=gen) * 3
    assert (fn(logits, other) >= 0).all()


def test_a_constant_shift_of_the_logits_changes_nothing() -> None:
    assert torch.allclose(reverse_kl(STUDENT + 7.0, TEACHER - 3.0), reverse_kl(STUDENT, TEACHER), atol=1e-12)


# -- generalized JSD, TRL semantics ------------------------------------------------------------------


@pytest.mark.parametrize(("temperature", "beta"), sorted(TRL_PINNED))
def test_generalized_jsd_matches_trl_pinned_values(temperature: float, beta: float) -> None:
    got = generalized_jsd(STUDENT, TEACHER, beta, temperature=temperature)
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx(TRL_PINNED[(temperature, beta)], abs=1e-9)
    for i in range(3):
        ref = _gjsd(STUDENT[i].tolist(), TEACHER[i].tolist(), beta, temperature)
        assert got[i].item() == pytest.approx(ref, abs=1e-12)


@pytest.mark.parametrize("beta", sorted(TRL_BATCHMEAN))
def test_generalized_jsd_mean_is_trl_batchmean(beta: float) -> None:
    weights = torch.full((3,), 1 / 3, dtype=torch.float64)  # token weights, exact in float64
    loss = (generalized_jsd(STUDENT, TEACHER, beta) * weights).sum()
    assert loss.item() == pytest.approx(TRL_BATCHMEAN[beta], abs=1e-9)


def test_generalized_jsd_endpoints_are_the_two_kls() -> None:
    """TRL's orientation: beta=0 is forward KL(teacher||student), beta=1 reverse KL(student||teacher)."""
    assert torch.equal(generalized_jsd(STUDENT, TEACHER, 0.0), forward_kl(STUDENT, TEACHER))
    assert torch.equal(generalized_jsd(STUDENT, TEACHER, 1.0), reverse_kl(STUDENT, TEACHER))


def test_generalized_jsd_half_is_the_symmetric_jsd() -> None:
    ps, pt = _softmax([0.0, LN3]), _softmax([0.0, 0.0])  # (1/4, 3/4) and (1/2, 1/2)
    m = [(a + b) / 2 for a, b in zip(ps, pt, strict=True)]  # (3/8, 5/8)
    expected = 0.5 * _kl(ps, m) + 0.5 * _kl(pt, m)
    s, t = torch.tensor([[0.0, LN3]]), torch.tensor([[0.0, 0.0]])
    assert generalized_jsd(s, t, 0.5).item() == pytest.approx(expected, abs=1e-7)
    assert generalized_jsd(t, s, 0.5).item() == pytest.approx(expected, abs=1e-7)


def test_generalized_jsd_swapping_roles_mirrors_beta() -> None:
    for beta in (0.1, 0.3, 0.75):
        assert torch.allclose(
            generalized_jsd(STUDENT, TEACHER, beta), generalized_jsd(TEACHER, STUDENT, 1 - beta), atol=1e-12
        )


def test_generalized_jsd_rejects_beta_outside_unit_interval() -> None:
    with pytest.raises(ValueError):
        generalized_jsd(STUDENT, TEACHER, 1.5)
    with pytest.raises(ValueError):
        reverse_kl(STUDENT, TEACHER, temperature=0.0)


# -- gradients and dtypes --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["reverse_kl", "forward_kl", "jsd"])
def test_divergence_is_differentiable_with_finite_gradients(kind: str) -> None:
    gen = torch.Generator().manual_seed(1)
    student = (torch.randn(6, 13, generator=gen) * 4).requires_grad_()
    teacher = torch.randn(6, 13, generator=gen) * 4
    loss = divergence(student, teacher, kind, 0.5).sum()  # type: ignore[arg-type]
    loss.backward()
    assert torch.isfinite(loss) and loss.item() > 0
    assert torch.isfinite(student.grad).all() and student.grad.abs().sum() > 0


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_gradient_vanishes_at_the_teacher(beta: float) -> None:
    student = TEACHER.clone().requires_grad_()
    generalized_jsd(student, TEACHER, beta).sum().backward()
    assert torch.allclose(student.grad, torch.zeros_like(student.grad), atol=1e-12)


def test_bf16_logits_are_upcast() -> None:
    s, t = STUDENT.bfloat16(), TEACHER.bfloat16()
    for out in (reverse_kl(s, t), forward_kl(s, t), generalized_jsd(s, t, 0.5)):
        assert out.dtype == torch.float32
    assert reverse_kl(s, t).tolist() == pytest.approx(reverse_kl(s.float(), t.float()).tolist(), abs=1e-7)


# -- the divergence by kind -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["reverse_kl", "forward_kl", "jsd"])
def test_divergence_dispatches_by_kind(kind: str) -> None:
    per = {"reverse_kl": reverse_kl, "forward_kl": forward_kl}.get(
        kind, lambda s, t: generalized_jsd(s, t, 0.3)
    )
    assert divergence(STUDENT, TEACHER, kind, 0.3).tolist() == per(STUDENT, TEACHER).tolist()  # type: ignore[arg-type]


def test_divergence_rejects_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown divergence kind"):
        divergence(STUDENT, TEACHER, "tvd", 0.5)  # type: ignore[arg-type]


# -- policy gradient -------------------------------------------------------------------------------


def test_policy_gradient_on_policy_is_reinforce() -> None:
    old = torch.log(torch.tensor([0.5, 0.25, 0.8]))
    new = old.clone().requires_grad_()
    adv = torch.tensor([1.0, -2.0, 0.5])
    w = torch.tensor([0.5, 0.25, 0.25])
    loss, metrics = policy_gradient_loss(new, old, adv, weights=w)
    assert loss.item() == pytest.approx(-(0.5 * 1.0 - 0.25 * 2.0 + 0.25 * 0.5), abs=1e-7)
    loss.backward()
    assert new.grad.tolist() == pytest.approx((-w * adv).tolist(), abs=1e-7)
    assert metrics.clip_fraction == 0.0
    assert metrics.approx_kl == pytest.approx(0.0, abs=1e-7)
    assert metrics.ratio_mean == pytest.approx(1.0, abs=1e-7)


def test_policy_gradient_clipping_by_hand() -> None:
    # ratios 1.5, 0.5, 0.5, 1.5 against advantages +1, -1, +1, -1 with eps 0.2:
    #   1.5, A=+1: min(1.5, 1.2) = 1.2 (clipped, no gradient)
    #   0.5, A=-1: min(-0.5, -0.8) = -0.8 (clipped, no gradient)
    #   0.5, A=+1: min(0.5, 0.8) = 0.5 (not clipped: the surrogate pushes the ratio back up)
    #   1.5, A=-1: min(-1.5, -1.2) = -1.5 (not clipped)
    ratios = torch.tensor([1.5, 0.5, 0.5, 1.5])
    old = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    new = (old + torch.log(ratios)).requires_grad_()
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    w = torch.tensor([0.1, 0.2, 0.3, 0.4])
    loss, metrics = policy_gradient_loss(new, old, adv, clip_eps=0.2, weights=w)
    assert loss.item() == pytest.approx(-(0.1 * 1.2 + 0.2 * -0.8 + 0.3 * 0.5 + 0.4 * -1.5), abs=1e-6)
    loss.backward()
    # d/d new of -w * r * A is -w * A * r
    assert new.grad.tolist() == pytest.approx([0.0, 0.0, -0.3 * 0.5, 0.4 * 1.5], abs=1e-6)
    assert metrics.clip_fraction == pytest.approx(0.1 + 0.2, abs=1e-6)
    k3 = [r - 1 - math.log(r) for r in (1.5, 0.5, 0.5, 1.5)]
    assert metrics.approx_kl == pytest.approx(
        sum(wi * k for wi, k in zip(w.tolist(), k3, strict=True)), abs=1e-6
    )
    assert metrics.ratio_mean == pytest.approx(0.1 * 1.5 + 0.2 * 0.5 + 0.3 * 0.5 + 0.4 * 1.5, abs=1e-6)


def test_policy_gradient_metrics_are_micro_batch_means() -> None:
    old = torch.zeros(2)
    new = torch.log(torch.tensor([1.5, 1.0]))
    _, metrics = policy_gradient_loss(new, old, torch.ones(2), weights=torch.tensor([0.05, 0.05]))
    assert metrics.clip_fraction == pytest.approx(0.5, abs=1e-6)


# -- sampled log-probs -----------------------------------------------------------------------------


def test_sampled_logprobs_by_hand() -> None:
    logits = torch.tensor([[0.0, LN3], [0.0, 2 * LN3], [LN2, 0.0]])
    actions = torch.tensor([1, 1, 0], dtype=torch.int32)
    assert sampled_logprobs(logits[:2], actions[:2]).tolist() == pytest.approx(
        [math.log(0.75), math.log(0.9)], abs=1e-6
    )
    at_two = sampled_logprobs(logits, actions, temperature=2.0)  # logits / 2: (0, ln 3) -> 3/4
    assert at_two[1].item() == pytest.approx(math.log(0.75), abs=1e-6)
    assert at_two[2].item() == pytest.approx(math.log(math.sqrt(2) / (math.sqrt(2) + 1)), abs=1e-6)


# -- barycenter target pieces: JSD on the union of top-K sets, the barycenter, per-token clipping ------


def _jsd_on_union(ps: list[float], pt: list[float], k: int) -> float:
    """Plain-Python reference: restrict both to the union of their top-k tokens, renormalise, JSD."""
    top = lambda p: set(sorted(range(len(p)), key=lambda v: -p[v])[:k])  # noqa: E731
    union = sorted(top(ps) | top(pt))
    a = [ps[v] / sum(ps[u] for u in union) for v in union]
    b = [pt[v] / sum(pt[u] for u in union) for v in union]
    m = [(x + y) / 2 for x, y in zip(a, b, strict=True)]
    return 0.5 * _kl(a, m) + 0.5 * _kl(b, m)


UNION_S = torch.tensor([[3.0, 2.0, 0.0, -1.0, 0.5], [0.0, 1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
UNION_T = torch.tensor([[0.0, 1.0, 3.0, 2.0, -2.0], [0.5, 1.0, 2.5, 3.5, 4.5]], dtype=torch.float64)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 50])
def test_topk_union_jsd_matches_direct_computation(k: int) -> None:
    # row 0: the top-2 sets are disjoint ({0, 1} and {2, 3}); row 1: they are the same ({3, 4})
    log_s, log_t = torch.log_softmax(UNION_S, -1), torch.log_softmax(UNION_T, -1)
    got = topk_union_jsd(log_s, log_t, k)
    for i in range(2):
        expected = _jsd_on_union(_softmax(UNION_S[i].tolist()), _softmax(UNION_T[i].tolist()), k)
        assert got[i].item() == pytest.approx(expected, abs=1e-12)
    assert ((got >= 0) & (got <= LN2)).all()


def test_topk_union_jsd_by_hand_and_at_full_vocabulary() -> None:
    # both top-1 tokens are token 1 in row 0 of STUDENT/TEACHER: on a one-token union the two agree exactly
    log_s, log_t = torch.log_softmax(STUDENT, -1), torch.log_softmax(TEACHER, -1)
    assert topk_union_jsd(log_s, log_t, 1)[0].item() == 0.0
    # disjoint one-hot-like supports on a 2-token union: p~ = (1, 0), q~ = (0, 1) -> JSD = ln 2
    s = torch.tensor([[0.0, -1e4, -1e4]], dtype=torch.float64)
    t = torch.tensor([[-1e4, 0.0, -1e4]], dtype=torch.float64)
    assert topk_union_jsd(torch.log_softmax(s, -1), torch.log_softmax(t, -1), 1).item() == pytest.approx(LN2)
    # K >= vocabulary: the ordinary JSD over the whole vocabulary
    torch.testing.assert_close(topk_union_jsd(log_s, log_t, 4), generalized_jsd(STUDENT, TEACHER, 0.5),
                               atol=1e-12, rtol=0)


def test_barycenter_by_hand() -> None:
    log_s = torch.log(torch.tensor([[0.25, 0.75]], dtype=torch.float64))
    log_t = torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    # alpha 1/2: q ∝ sqrt(p_t p_s) = (sqrt(1/8), sqrt(3/8)) -> (1, sqrt 3) / (1 + sqrt 3)
    q = barycenter_logprobs(log_s, log_t, torch.tensor([0.5])).exp()
    r3 = math.sqrt(3.0)
    assert q[0].tolist() == pytest.approx([1 / (1 + r3), r3 / (1 + r3)], abs=1e-12)
    # the endpoints are the student (alpha 0) and the teacher (alpha 1)
    both_s, both_t = log_s.expand(2, 2), log_t.expand(2, 2)
    ends = barycenter_logprobs(both_s, both_t, torch.tensor([0.0, 1.0])).exp()
    assert ends.flatten().tolist() == pytest.approx([0.25, 0.75, 0.5, 0.5], abs=1e-12)


def test_barycenter_matches_plain_python_per_row() -> None:
    alpha = torch.tensor([0.2, 0.7, 1.0], dtype=torch.float64)
    log_q = barycenter_logprobs(torch.log_softmax(STUDENT, -1), torch.log_softmax(TEACHER, -1), alpha)
    for i in range(3):
        ps, pt, a = _softmax(STUDENT[i].tolist()), _softmax(TEACHER[i].tolist()), alpha[i].item()
        unnormalised = [t**a * s ** (1 - a) for s, t in zip(ps, pt, strict=True)]
        z = sum(unnormalised)
        assert log_q[i].exp().tolist() == pytest.approx([u / z for u in unnormalised], abs=1e-12)


def test_barycenter_probability_floor_by_hand() -> None:
    # alpha 1: q = p_t = (0.02, 0.18, 0.8); floor 0.1 -> (0.1, 0.18, 0.8) / 1.08
    log_t = torch.log(torch.tensor([[0.02, 0.18, 0.8]], dtype=torch.float64))
    q = barycenter_logprobs(torch.zeros_like(log_t), log_t, torch.tensor([1.0]), prob_floor=0.1).exp()
    assert q[0].tolist() == pytest.approx([0.1 / 1.08, 0.18 / 1.08, 0.8 / 1.08], abs=1e-12)
    with pytest.raises(ValueError, match="prob_floor"):
        barycenter_logprobs(log_t, log_t, torch.tensor([1.0]), prob_floor=1.0)


def test_clipped_caps_the_value_and_stops_the_gradient() -> None:
    per = torch.tensor([0.1, 0.4, 2.0], requires_grad=True)
    value, over = clipped(per, 0.4)
    assert value.tolist() == pytest.approx([0.1, 0.4, 0.4]) and over.tolist() == [False, False, True]
    (value * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert per.grad.tolist() == [1.0, 2.0, 0.0]  # a token at the cap keeps its gradient; one above has none
    with pytest.raises(ValueError, match="clip"):
        clipped(per, 0.0)

"""The objective as weighted terms: config -> terms, each term by hand, the sampled-token reverse-KL
estimator, and global-step normalisation: a step split over two (simulated) processes gives the same
loss and summed gradient as one process."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from tiny_models import tiny_llama

from agentmem.config import DistillConfig, TeacherSourceKind, Weighting
from agentmem.errors import TrainingError
from agentmem.replay import Sequence, pack
from agentmem.runtime import Runtime
from agentmem.training.forward import PackedModel, plan
from agentmem.training.losses import reverse_kl, sampled_logprobs, sampled_reverse_kl_loss
from agentmem.training.objective import StepInputs, accumulate_step
from agentmem.training.teachers import TeacherTargets
from agentmem.training.terms import (
    AnchorTerm,
    CrossEntropyTerm,
    DistillTerm,
    MicroBatch,
    PolicyGradientTerm,
    objective_from_config,
)

torch.set_num_threads(1)
VOCAB = 320
SHAPES = [(12, 5), (7, 3), (20, 6), (4, 9), (9, 2), (15, 4), (3, 1), (10, 8)]
EPISODE_OF = {f"inv{i}": f"ep{i % 3}" for i in range(len(SHAPES))}  # every episode spread over calls
ADVANTAGE_OF = {f"inv{i}": a for i, a in enumerate([0.5, -0.5, 1.0, -1.0, 0.25, 0.0, -0.25, 0.75])}
TEMPERATURE_OF = {f"inv{i}": t for i, t in enumerate([1.0, 0.7, 1.0, 1.3, 1.0, 1.0, 0.9, 1.0])}


def sequences() -> list[Sequence]:
    rng = np.random.default_rng(0)
    out = []
    for i, (p, o) in enumerate(SHAPES):
        ids = rng.integers(3, VOCAB, p + o).astype(np.int32)
        mask = np.zeros(p + o, bool)
        mask[p - 1 : p + o - 1] = True
        out.append(Sequence(f"inv{i}", ids, np.arange(p + o, dtype=np.int32), mask, ids[p:].copy(),
                            -rng.exponential(1.0, o).astype(np.float32)))
    return out


def config(**kw) -> DistillConfig:
    return DistillConfig(run_ids=["r"], **kw)


# -- terms from the config ---------------------------------------------------------------------------


def test_objective_from_config_default_and_all_terms():
    default = objective_from_config(config())
    assert [(w, t.name) for w, t in default.terms] == [(1.0, "kd"), (1.0, "rl")]
    assert default.needs_teacher and not default.needs_reference
    every = objective_from_config(config(kd_weight=0.5, rl_weight=2.0, ce_weight=0.1, anchor_weight=0.3,
                                         temperature=2.0, weighting="call"))
    assert [(w, t.name) for w, t in every.terms] == [(0.5, "kd"), (2.0, "rl"), (0.1, "ce"), (0.3, "anchor")]
    assert every.needs_reference and every.weighting is Weighting.call
    assert every.terms[0][1].temperature == 2.0 and every.terms[3][1].temperature == 2.0
    no_teacher = objective_from_config(config(teacher=None, rl="none", ce_weight=1.0))
    assert [t.name for _, t in no_teacher.terms] == ["ce"] and not no_teacher.needs_teacher


def test_stored_scores_support_reverse_kl_only():
    with pytest.raises(TrainingError, match="reverse_kl only"):
        objective_from_config(config(teacher_source=TeacherSourceKind.scores, loss="forward_kl"))
    assert objective_from_config(config(teacher_source=TeacherSourceKind.scores)).needs_teacher


# -- terms by hand ---------------------------------------------------------------------------------


def micro_batch(**kw) -> MicroBatch:
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(4, 6, generator=gen) * 2).requires_grad_()
    base = dict(logits=logits, action_ids=torch.tensor([1, 0, 5, 2]), sampler_logprobs=torch.full((4,), -1.5),
                sampling_temperature=torch.ones(4), advantages=torch.tensor([1.0, -1.0, 0.5, 0.0]),
                weights=torch.tensor([0.1, 0.2, 0.3, 0.4]))
    return MicroBatch(**(base | kw))


def test_cross_entropy_term_by_hand():
    mb = micro_batch()
    got = CrossEntropyTerm(temperature=2.0)(mb).loss
    expected = -(mb.weights * sampled_logprobs(mb.logits, mb.action_ids, 2.0)).sum()
    assert got.item() == pytest.approx(expected.item(), abs=1e-7)


def test_anchor_term_is_zero_with_zero_gradient_at_the_reference():
    mb = micro_batch()
    mb = micro_batch(logits=mb.logits, reference=mb.logits.detach().clone())
    loss = AnchorTerm()(mb).loss
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    assert mb.logits.grad.abs().max().item() < 1e-6
    other = micro_batch(reference=torch.zeros(4, 6))
    assert AnchorTerm()(other).loss.item() == pytest.approx(
        (other.weights * reverse_kl(other.logits, torch.zeros(4, 6))).sum().item(), abs=1e-7)


def test_distill_term_refuses_other_divergences_on_sampled_targets():
    mb = micro_batch(teacher=torch.full((4,), -1.0))
    with pytest.raises(TrainingError, match="reverse_kl"):
        DistillTerm("forward_kl")(mb)  # type: ignore[arg-type]


def test_policy_gradient_term_metrics_are_weight_shares():
    mb = micro_batch(weights=torch.tensor([0.05, 0.05, 0.05, 0.05]))
    value = PolicyGradientTerm()(mb)
    assert set(value.metrics) == {"clip_fraction", "approx_kl", "ratio_mean"}
    assert 0 <= value.metrics["clip_fraction"] <= 0.2 + 1e-7


# -- the sampled-token reverse-KL estimator --------------------------------------------------------


def test_sampled_reverse_kl_value_and_gradient_by_hand():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 5, generator=gen).requires_grad_()
    actions = torch.tensor([0, 4, 2])
    teacher_lp = torch.log_softmax(torch.randn(3, 5, generator=gen), -1).gather(-1, actions[:, None])[:, 0]
    w = torch.tensor([0.2, 0.3, 0.5])
    loss = sampled_reverse_kl_loss(logits, actions, teacher_lp, w, temperature=1.5)
    lp = sampled_logprobs(logits, actions, 1.5)
    d = (lp - teacher_lp).detach()
    assert loss.item() == pytest.approx((w * d).sum().item(), abs=1e-7)  # the value is the KL estimate
    loss.backward()
    expected = torch.autograd.grad((w * d * sampled_logprobs(logits, actions, 1.5)).sum(), logits)[0]
    torch.testing.assert_close(logits.grad, expected)


def test_sampled_reverse_kl_gradient_is_unbiased():
    """Averaging the estimator over actions drawn from the student gives the exact gradient of
    KL(student || teacher): here the expectation is taken exactly, by enumerating the vocabulary."""
    gen = torch.Generator().manual_seed(4)
    student = torch.randn(1, 7, generator=gen, dtype=torch.float64)
    teacher = torch.randn(1, 7, generator=gen, dtype=torch.float64)
    t_lp = torch.log_softmax(teacher, -1)[0]
    p_s = torch.softmax(student, -1)[0].detach()
    expected_grad = torch.zeros(7, dtype=torch.float64)
    for a in range(7):
        x = student.clone().requires_grad_()
        loss = sampled_reverse_kl_loss(x, torch.tensor([a]), t_lp[a : a + 1], torch.ones(1, dtype=torch.float64))
        loss.backward()
        expected_grad += p_s[a] * x.grad[0]
    x = student.clone().requires_grad_()
    reverse_kl(x, teacher).sum().backward()
    torch.testing.assert_close(expected_grad, x.grad[0], atol=1e-12, rtol=1e-10)


# -- global-step normalisation across processes ----------------------------------------------------


def targets(teacher: PackedModel, seqs: list[Sequence]) -> TeacherTargets:
    return TeacherTargets(True, teacher.logits_by_invocation(plan(seqs, 4096).batches))


def one_step(seqs, objective, runtime=None, step_episodes=None, row_tokens=40, teacher_targets=None, model=None):
    model = model if model is not None else tiny_llama(seed=0).train()
    student = PackedModel(model, VOCAB, 0)
    rows, _ = pack(seqs, row_tokens)
    inputs = StepInputs(EPISODE_OF, ADVANTAGE_OF, TEMPERATURE_OF, teacher_targets)
    kw = {"runtime": runtime} if runtime is not None else {}
    result = accumulate_step(student, rows, inputs, objective, step_episodes=step_episodes, **kw)
    return result, {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


class ThreadReduce:
    """An all-reduce over ``world`` threads: each contributes its tensor and gets the sum."""

    def __init__(self, world: int):
        self.barrier = threading.Barrier(world)
        self.lock = threading.Lock()
        self.parts: list[torch.Tensor] = []
        self.calls = 0

    def __call__(self, value: torch.Tensor) -> torch.Tensor:
        with self.lock:
            self.parts.append(value.clone())
            self.calls += 1
        self.barrier.wait()  # every process has contributed (one reduce per process in these tests)
        return value.copy_(torch.stack(self.parts).sum(0))


@pytest.mark.parametrize("weighting", ["token", "call", "episode"])
def test_a_step_split_over_two_processes_equals_one_process(weighting):
    seqs = sequences()
    objective = objective_from_config(config(weighting=weighting, ce_weight=0.5, kd_weight=0.7))
    teacher = targets(PackedModel(tiny_llama(seed=1), VOCAB, 0), seqs)
    single, single_grads = one_step(seqs, objective, teacher_targets=teacher)
    assert single.global_actions == sum(o for _, o in SHAPES)

    episodes = list(dict.fromkeys(EPISODE_OF[s.invocation_id] for s in seqs))
    reduce = ThreadReduce(2)
    results: dict[int, tuple] = {}
    models = [tiny_llama(seed=0).train() for _ in range(2)]  # built here: model init draws from the global RNG

    def rank(r: int) -> None:
        runtime = Runtime(rank=r, world_size=2).with_reduce(reduce)
        mine = seqs[r::2]  # episode ep0 has calls on both ranks
        results[r] = one_step(mine, objective, runtime, episodes, teacher_targets=teacher, model=models[r])

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert reduce.calls == 2  # one all-reduce per process per step
    (r0, g0), (r1, g1) = results[0], results[1]
    assert r0.global_actions == r1.global_actions == single.global_actions
    assert r0.loss + r1.loss == pytest.approx(single.loss, abs=1e-6)
    assert r0.kd_loss + r1.kd_loss == pytest.approx(single.kd_loss, abs=1e-6)
    assert r0.metrics["ce_loss"] + r1.metrics["ce_loss"] == pytest.approx(single.metrics["ce_loss"], abs=1e-6)
    assert r0.metrics["ratio_mean"] + r1.metrics["ratio_mean"] == pytest.approx(single.metrics["ratio_mean"],
                                                                                abs=1e-5)
    for n, g in single_grads.items():
        torch.testing.assert_close(g0[n] + g1[n], g, atol=1e-6, rtol=1e-4, msg=n)


def test_weights_do_not_depend_on_packing():
    seqs = sequences()
    objective = objective_from_config(config(weighting="episode", teacher=None, ce_weight=1.0))
    a, ga = one_step(seqs, objective, row_tokens=4096)
    b, gb = one_step(seqs, objective, row_tokens=30)
    assert a.loss == pytest.approx(b.loss, abs=1e-6)
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], atol=1e-6, rtol=1e-4, msg=n)


def test_an_empty_process_still_joins_the_all_reduce():
    objective = objective_from_config(config(teacher=None, ce_weight=1.0))
    calls = []
    runtime = Runtime().with_reduce(lambda v: calls.append(v.clone()) or v)
    result, grads = one_step([], objective, runtime)
    assert len(calls) == 1 and result.loss == 0.0 and result.actions == 0
    assert all(g is None for g in grads.values())

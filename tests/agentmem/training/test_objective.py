"""The objective as weighted terms: config -> terms, each term by hand, the sampled-token reverse-KL
estimator, the barycenter target (its gradient is alpha times the reverse-KL gradient) and per-token
clipping, and global-step normalisation: a step split over two (simulated) processes gives the same
loss and summed gradient as one process."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from agentmem.config import DistillConfig, Divergence, TeacherCentering, TeacherSourceKind, Weighting
from agentmem.errors import TrainingError
from agentmem.records import Invocation
from agentmem.replay import Sequence, pack
from agentmem.replay.groups import centering_groups
from agentmem.runtime import Runtime
from agentmem.testing.tiny_models import tiny_llama
from agentmem.training.barycenter import AlphaEma, BarycenterTarget
from agentmem.training.forward import PackedModel, plan
from agentmem.training.losses import (
    divergence,
    reverse_kl,
    sampled_logprobs,
    sampled_reverse_kl_loss,
    topk_union_jsd,
)
from agentmem.training.objective import StepInputs, accumulate_step, step_totals, step_weights
from agentmem.training.teachers import TeacherTargets
from agentmem.training.terms import (
    AnchorTerm,
    CrossEntropyTerm,
    DistillTerm,
    MicroBatch,
    Objective,
    PolicyGradientTerm,
    TermValue,
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
    every = objective_from_config(config(loss=dict(kd_weight=0.5, rl_weight=2.0, ce_weight=0.1, anchor_weight=0.3, temperature=2.0, weighting="call")))
    assert [(w, t.name) for w, t in every.terms] == [(0.5, "kd"), (2.0, "rl"), (0.1, "ce"), (0.3, "anchor")]
    assert every.needs_reference and every.weighting is Weighting.call
    assert every.terms[0][1].temperature == 2.0 and every.terms[3][1].temperature == 2.0
    no_teacher = objective_from_config(config(teacher=dict(model=None), loss=dict(ce_weight=1.0), rl=dict(kind="none")))
    assert [t.name for _, t in no_teacher.terms] == ["ce"] and not no_teacher.needs_teacher


def test_stored_scores_support_reverse_kl_only():
    with pytest.raises(TrainingError, match="reverse_kl only"):
        objective_from_config(config(teacher=dict(source=TeacherSourceKind.scores), loss=dict(divergence="forward_kl")))
    assert objective_from_config(config(teacher=dict(source=TeacherSourceKind.scores))).needs_teacher


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


@pytest.mark.parametrize("loss", ["reverse_kl", "forward_kl", "jsd"])
def test_distill_term_is_the_weighted_divergence(loss):
    mb = micro_batch(teacher=torch.randn(4, 6, generator=torch.Generator().manual_seed(1)))
    term = objective_from_config(config(loss=dict(divergence=loss, beta=0.3, temperature=1.5))).terms[0][1]
    expected = (mb.weights * divergence(mb.logits, mb.teacher, loss, 0.3, 1.5)).sum()
    value = term(mb)
    assert value.loss.item() == pytest.approx(expected.item(), abs=1e-7) and value.metrics == {}


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


def one_step(seqs, objective, runtime=None, step_episodes=None, row_tokens=40, teacher_targets=None, model=None,
             center_group_of=None):
    model = model if model is not None else tiny_llama(seed=0).train()
    student = PackedModel(model, VOCAB, 0)
    rows, _ = pack(seqs, row_tokens)
    inputs = StepInputs(EPISODE_OF, ADVANTAGE_OF, TEMPERATURE_OF, teacher_targets, center_group_of=center_group_of)
    kw = {"runtime": runtime} if runtime is not None else {}
    result = accumulate_step(student, rows, inputs, objective, step_episodes=step_episodes, **kw)
    return result, {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


class ThreadReduce:
    """An all-reduce over ``world`` threads: each contributes its tensor and gets the sum."""

    def __init__(self, world: int):
        self.barrier = threading.Barrier(world)
        self.lock = threading.Lock()
        self.parts: list[torch.Tensor] = []
        self.done = threading.Barrier(world, action=self.parts.clear)  # the next reduce starts empty
        self.calls = 0

    def __call__(self, value: torch.Tensor) -> torch.Tensor:
        with self.lock:
            self.parts.append(value.clone())
            self.calls += 1
        self.barrier.wait()  # every process has contributed
        total = torch.stack(self.parts).sum(0)
        self.done.wait()  # every process has read the sum
        return value.copy_(total)


@dataclass(frozen=True)
class Calls:
    """The two fields of a ``PackedBatch`` that the step's token weights read."""

    invocation_ids: tuple[str, ...]
    action_counts: tuple[int, ...]


def test_step_weights_by_hand():
    """Episode e7: call c10 (3 action tokens) and c11 (1); episode e8: call c12 (2); c11 in another row."""
    batches = [Calls(("c10", "c12"), (3, 2)), Calls(("c11",), (1,))]
    episode_of = {"c10": "e7", "c11": "e7", "c12": "e8"}
    expected = {
        "token": [[1 / 6] * 5, [1 / 6]],
        "call": [[1 / 9] * 3 + [1 / 6] * 2, [1 / 3]],  # 3 calls, each 1/3 split over its tokens
        "episode": [[1 / 8] * 3 + [1 / 4] * 2, [1 / 8]],  # 2 episodes, each 1/2 over its tokens
    }
    totals = step_totals(batches, episode_of)  # type: ignore[arg-type]
    assert (totals.actions, totals.calls, totals.episodes) == (6, 3, 2)
    for mode, values in expected.items():
        weights = step_weights(batches, episode_of, mode, totals)  # type: ignore[arg-type]
        assert [w.dtype for w in weights] == [torch.float32] * 2
        assert [w.tolist() for w in weights] == [pytest.approx(v, abs=1e-7) for v in values], mode
        assert float(sum(w.sum() for w in weights)) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("weighting", ["token", "call", "episode"])
def test_a_step_split_over_two_processes_equals_one_process(weighting):
    seqs = sequences()
    objective = objective_from_config(config(loss=dict(weighting=weighting, ce_weight=0.5, kd_weight=0.7)))
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
    assert r0.metrics["kd_loss"] + r1.metrics["kd_loss"] == pytest.approx(single.metrics["kd_loss"], abs=1e-6)
    assert r0.metrics["ce_loss"] + r1.metrics["ce_loss"] == pytest.approx(single.metrics["ce_loss"], abs=1e-6)
    assert r0.metrics["ratio_mean"] + r1.metrics["ratio_mean"] == pytest.approx(single.metrics["ratio_mean"],
                                                                                abs=1e-5)
    for n, g in single_grads.items():
        torch.testing.assert_close(g0[n] + g1[n], g, atol=1e-6, rtol=1e-4, msg=n)


@dataclass(frozen=True)
class HalfTerm:
    """A term worth 0.5 per unit of token weight (0.5 over a step), that reports its weight share as ``metric``."""

    metric: str = "half_share"
    name: str = "half"
    needs_teacher: bool = False
    needs_reference: bool = False

    def __call__(self, batch: MicroBatch) -> TermValue:
        share = batch.weights.sum()
        return TermValue(0.5 * share + 0.0 * batch.logits.sum(), {self.metric: float(share)})


def test_every_term_reports_its_value_in_the_metrics_first():
    seqs = sequences()
    ce = CrossEntropyTerm()
    alone, _ = one_step(seqs, Objective(((1.0, ce),)))
    both, _ = one_step(seqs, Objective(((1.0, ce), (2.0, HalfTerm()))))
    assert list(both.metrics)[:2] == ["ce_loss", "half_loss"]
    assert both.metrics["ce_loss"] == pytest.approx(alone.metrics["ce_loss"], abs=1e-6)
    assert (both.metrics["half_loss"], both.metrics["half_share"]) == (pytest.approx(0.5), pytest.approx(1.0))
    assert both.loss == pytest.approx(alone.loss + 2.0 * 0.5, abs=1e-6)
    with pytest.raises(TrainingError, match="loss term 'half' reports metric 'half_bonus_loss'"):
        one_step(seqs, Objective(((1.0, HalfTerm("half_bonus_loss")),)))


def test_weights_do_not_depend_on_packing():
    seqs = sequences()
    objective = objective_from_config(config(teacher=dict(model=None), loss=dict(weighting="episode", ce_weight=1.0)))
    a, ga = one_step(seqs, objective, row_tokens=4096)
    b, gb = one_step(seqs, objective, row_tokens=30)
    assert a.loss == pytest.approx(b.loss, abs=1e-6)
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], atol=1e-6, rtol=1e-4, msg=n)


def test_an_empty_process_still_joins_the_all_reduce():
    objective = objective_from_config(config(teacher=dict(model=None), loss=dict(ce_weight=1.0)))
    calls = []
    runtime = Runtime().with_reduce(lambda v: calls.append(v.clone()) or v)
    result, grads = one_step([], objective, runtime)
    assert len(calls) == 1 and result.loss == 0.0 and result.actions == 0
    assert all(g is None for g in grads.values())


# -- the barycenter target and per-token clipping ------------------------------------------------------


def float64_batch(n: int = 5, vocab: int = 7, seed: int = 5) -> MicroBatch:
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, vocab, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    teacher = torch.randn(n, vocab, generator=gen, dtype=torch.float64) * 2
    weights = torch.linspace(1, 2, n, dtype=torch.float64)
    return micro_batch(logits=logits, teacher=teacher, weights=weights / weights.sum(),
                       action_ids=torch.zeros(n, dtype=torch.long), sampler_logprobs=torch.zeros(n),
                       sampling_temperature=torch.ones(n), advantages=torch.zeros(n))


def barycenter_term(temperature: float = 1.0, **kw) -> DistillTerm:
    cfg = config(**kw, loss=dict(target="barycenter", alpha_tau=0.2, alpha_topk=3, temperature=temperature))
    return objective_from_config(cfg).terms[0][1]


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_barycenter_gradient_is_alpha_times_the_reverse_kl_gradient(temperature):
    """With q = p_t^a p_s^(1-a) / Z held fixed (detached) and a constant per token:
    log p_s - log q = a (log p_s - log p_t) + log Z, so KL(p_s || q) = a KL(p_s || p_t) + log Z, and
    grad KL(p_s || q) = sum_v grad p_s(v) (log p_s(v) - log q(v))      [sum_v p_s grad log p_s = 0]
                      = a sum_v grad p_s(v) (log p_s(v) - log p_t(v)) + log Z sum_v grad p_s(v)
                      = a grad KL(p_s || p_t)                           [sum_v grad p_s = 0].
    At the parameters where q was built the two gradients are equal exactly (not only to first order: the
    terms that would differ are the change of q and a with the parameters, which the stop-gradient
    removes), so the tolerance is float64 round-off over a 7-token vocabulary: 1e-12."""
    term = barycenter_term(temperature)
    mb = float64_batch()
    value = term(mb)
    value.loss.backward()
    target = term.barycenter(mb.logits, mb.teacher, temperature)
    alpha = target.alpha
    assert 0.0 < float(alpha.min()) < 0.5 < float(alpha.max()) < 1.0  # a spread of alphas, none clamped
    x = mb.logits.detach().clone().requires_grad_()
    kl = reverse_kl(x, mb.teacher, temperature)
    (mb.weights * alpha * kl).sum().backward()
    torch.testing.assert_close(mb.logits.grad, x.grad, atol=1e-12, rtol=0)
    log_ps = torch.log_softmax(mb.logits.detach() / temperature, -1)
    log_pt = torch.log_softmax(mb.teacher / temperature, -1)
    log_z = torch.logsumexp(alpha[:, None] * log_pt + (1 - alpha[:, None]) * log_ps, -1)
    assert (log_z <= 0).all()  # Hölder: sum p_t^a p_s^(1-a) <= 1
    expected = (mb.weights * (alpha * kl.detach() + log_z)).sum()
    assert value.loss.item() == pytest.approx(expected.item(), abs=1e-12)


def test_barycenter_alpha_and_its_metrics_by_hand():
    term = barycenter_term()
    mb = float64_batch()
    value = term(mb)
    log_ps, log_pt = torch.log_softmax(mb.logits.detach(), -1), torch.log_softmax(mb.teacher, -1)
    alpha = torch.exp(-topk_union_jsd(log_ps, log_pt, 3) / 0.2)
    torch.testing.assert_close(term.barycenter(mb.logits, mb.teacher).alpha, alpha, atol=1e-15, rtol=0)
    assert set(value.metrics) == {"alpha_mean", "alpha_below_half"}
    assert value.metrics["alpha_mean"] == pytest.approx(float((mb.weights * alpha).sum()), abs=1e-12)
    below = float((mb.weights * (alpha < 0.5)).sum())
    assert 0 < below < 1 and value.metrics["alpha_below_half"] == pytest.approx(below, abs=1e-12)


def test_barycenter_is_pluggable_clamped_and_smoothed():
    """Any discrepancy and alpha map plug in as callables; the EMA blends the running mean in before the
    clamps; the objective updates it once per step from the step's mean raw alpha and saves it."""
    ema = AlphaEma(0.5)
    target = BarycenterTarget(lambda s, t: torch.zeros(s.shape[0], dtype=s.dtype),
                              lambda d: torch.full_like(d, 0.25), alpha_min=0.3, alpha_max=0.6, ema=ema)
    mb = float64_batch(n=3)
    assert target(mb.logits, mb.teacher).alpha.tolist() == [0.3, 0.3, 0.3]  # no EMA yet: 0.25 clamped up
    ema.value = 1.0
    got = target(mb.logits, mb.teacher)
    assert got.alpha.tolist() == [0.6] * 3 and got.raw_alpha.tolist() == [0.25] * 3  # 0.625 clamped down
    log_ps, log_pt = torch.log_softmax(mb.logits.detach(), -1), torch.log_softmax(mb.teacher, -1)
    torch.testing.assert_close(got.logprobs, torch.log_softmax(0.6 * log_pt + 0.4 * log_ps, -1))

    objective = objective_from_config(config(loss=dict(target="barycenter", alpha_ema=0.9)))
    term = objective.terms[0][1]
    assert objective.alpha_ema is term.barycenter.ema and objective.state_dict() == {}
    assert "alpha_raw_mean" in term(float64_batch()).metrics
    objective.end_step({"alpha_raw_mean": 0.5})
    assert objective.alpha_ema.value == 0.5  # the first step sets the mean
    objective.end_step({"alpha_raw_mean": 0.3})
    assert objective.alpha_ema.value == pytest.approx(0.9 * 0.5 + 0.1 * 0.3)
    objective.end_step({})  # a step without action tokens leaves it
    state = objective.state_dict()
    fresh = objective_from_config(config(loss=dict(target="barycenter", alpha_ema=0.9)))
    fresh.load_state_dict(state)
    assert fresh.alpha_ema.value == objective.alpha_ema.value == state["alpha_ema"]


@pytest.mark.parametrize("loss", ["reverse_kl", "forward_kl", "jsd"])
@pytest.mark.parametrize("target", ["teacher", "barycenter"])
def test_jsd_clip_caps_each_token_and_drops_its_gradient(loss, target):
    cfg = {"divergence": loss, "beta": 0.3, "target": target} | ({"alpha_tau": 0.05} if target == "barycenter" else {})
    plain = objective_from_config(config(loss=cfg)).terms[0][1]
    mb = float64_batch(n=8)
    per_token = []
    for i in range(8):  # the unclipped per-token divergence, one token at a time
        one = MicroBatch(mb.logits[i : i + 1], mb.action_ids[:1], mb.sampler_logprobs[:1],
                         mb.sampling_temperature[:1], mb.advantages[:1], torch.ones(1, dtype=torch.float64),
                         mb.teacher[i : i + 1])
        per_token.append(plain(one).loss.item())
    clip = sorted(per_token)[4]  # about half the tokens above the cap
    over = torch.tensor(per_token) > clip
    term = objective_from_config(config(loss=dict(**cfg, jsd_clip=clip))).terms[0][1]
    value = term(mb)
    capped = torch.tensor([min(d, clip) for d in per_token], dtype=torch.float64)
    assert value.loss.item() == pytest.approx(float((mb.weights * capped).sum()), abs=1e-12)
    assert value.metrics["kd_clip_fraction"] == pytest.approx(float((mb.weights * over).sum()), abs=1e-12)
    assert 0 < int(over.sum()) < 8
    value.loss.backward()
    grad_norms = mb.logits.grad.abs().sum(-1)
    assert (grad_norms[over] == 0).all() and (grad_norms[~over] > 0).all()


def test_clip_and_barycenter_need_full_vocabulary_targets():
    mb = micro_batch(teacher=torch.full((4,), -1.0))
    with pytest.raises(TrainingError, match="full distribution"):
        DistillTerm(clip=0.5)(mb)
    with pytest.raises(TrainingError, match="full distribution"):
        barycenter_term()(mb)


# -- the teacher's own temperature -----------------------------------------------------------------


@pytest.mark.parametrize("loss", ["forward_kl", "reverse_kl", "jsd"])
def test_teacher_temperature_is_the_divergence_to_the_tempered_teacher(loss):
    gen = torch.Generator().manual_seed(5)
    teacher = torch.randn(4, 6, generator=gen) * 2
    mb = micro_batch(teacher=teacher)
    tau = 0.5
    got = DistillTerm(Divergence(loss), teacher_temperature=tau)(mb).loss
    sharp = torch.softmax(teacher, -1) ** (1 / tau)  # p_t^(1/tau), renormalised: by hand
    sharp = sharp / sharp.sum(-1, keepdim=True)
    expected = DistillTerm(Divergence(loss))(micro_batch(teacher=sharp.log())).loss
    assert got.item() == pytest.approx(expected.item(), abs=1e-6)
    assert got.item() != pytest.approx(DistillTerm(Divergence(loss))(mb).loss.item(), abs=1e-3)


def test_a_cold_teacher_makes_forward_kl_the_cross_entropy_of_its_greedy_token():
    gen = torch.Generator().manual_seed(6)
    teacher = torch.randn(4, 6, generator=gen) * 2
    mb = micro_batch(teacher=teacher)
    got = DistillTerm(Divergence.forward_kl, teacher_temperature=0.01)(mb).loss
    greedy = teacher.argmax(-1)
    expected = -(mb.weights * sampled_logprobs(mb.logits, greedy)).sum()
    assert got.item() == pytest.approx(expected.item(), abs=1e-4)


def test_teacher_temperature_needs_full_vocabulary_targets():
    with pytest.raises(TrainingError, match="full distribution"):
        DistillTerm(teacher_temperature=0.5)(micro_batch(teacher=torch.full((4,), -1.0)))
    with pytest.raises(ValueError, match=r"teacher\.source=scores stores only"):
        config(teacher=dict(source=TeacherSourceKind.scores, temperature=0.5))
    assert objective_from_config(config(teacher=dict(temperature=0.5))).terms[0][1].teacher_temperature == 0.5


# -- distilling only where the teacher is decided ---------------------------------------------------


@pytest.mark.parametrize("loss", ["forward_kl", "reverse_kl"])
def test_min_confidence_leaves_out_the_positions_where_the_teacher_is_split(loss):
    # rows 0 and 2: the teacher puts 0.9 on one token; rows 1 and 3: 0.45 / 0.45 / 0.1 over three (split)
    decided = torch.log(torch.tensor([0.9, 0.02, 0.02, 0.02, 0.02, 0.02]))
    split = torch.log(torch.tensor([0.45, 0.45, 0.025, 0.025, 0.025, 0.025]))
    teacher = torch.stack([decided, split, decided.roll(2), split.roll(3)])
    mb = micro_batch(teacher=teacher)
    per_row = [DistillTerm(Divergence(loss))(micro_batch(teacher=teacher, weights=torch.eye(4)[i])).loss.item()
               for i in range(4)]
    gated = DistillTerm(Divergence(loss), min_confidence=0.5)(mb)
    expected = 0.1 * per_row[0] + 0.3 * per_row[2]  # the split rows' weights (0.2, 0.4) get no term
    assert gated.loss.item() == pytest.approx(expected, abs=1e-6)
    assert gated.metrics["kd_gated_fraction"] == pytest.approx(0.2 + 0.4)
    gated.loss.backward()
    assert mb.logits.grad is not None
    assert mb.logits.grad[[1, 3]].abs().max().item() == 0.0 and mb.logits.grad[[0, 2]].abs().max().item() > 0
    ungated = DistillTerm(Divergence(loss), min_confidence=0.0)(micro_batch(teacher=teacher))
    assert ungated.loss.item() == pytest.approx(sum(w * v for w, v in zip([0.1, 0.2, 0.3, 0.4], per_row, strict=True)), abs=1e-6)
    assert "kd_gated_fraction" not in ungated.metrics


def test_min_confidence_needs_full_vocabulary_targets_and_comes_from_the_config():
    with pytest.raises(TrainingError, match="full distribution"):
        DistillTerm(min_confidence=0.5)(micro_batch(teacher=torch.full((4,), -1.0)))
    with pytest.raises(ValueError, match=r"teacher\.min_confidence=0.5 reads the teacher's full distribution"):
        config(teacher=dict(source=TeacherSourceKind.scores, min_confidence=0.5))
    with pytest.raises(ValueError, match="less than 1"):
        config(teacher=dict(min_confidence=1.0))
    assert objective_from_config(config(teacher=dict(min_confidence=0.6))).terms[0][1].min_confidence == 0.6


# -- centring the teacher's push at first tokens (a group baseline) ---------------------------------------

GROUP_OF = {f"inv{i}": "memory_update" if i % 3 else "answer" for i in range(len(SHAPES))}


def first_positions(seqs) -> list[int]:
    """Index of each call's first action token in the step's action order (calls in ``seqs`` order)."""
    out, pos = [], 0
    for s in seqs:
        out.append(pos)
        pos += len(s.action_ids)
    return out


class Capture:
    """A zero term that keeps each micro-batch's student logits, to read their gradient after the step."""

    name, needs_teacher, needs_reference = "capture", False, False

    def __init__(self) -> None:
        self.logits: list[torch.Tensor] = []
        self.ids: list[torch.Tensor] = []

    def __call__(self, batch: MicroBatch) -> TermValue:
        batch.logits.retain_grad()
        self.logits.append(batch.logits)
        self.ids.append(batch.action_ids)
        return TermValue(batch.logits.sum() * 0, {})

    def grads(self) -> torch.Tensor:
        assert all(x.grad is not None for x in self.logits)
        return torch.cat([x.grad for x in self.logits])


def logit_grads(seqs, centered: bool, loss: str, teacher, row_tokens=4096, group_of=GROUP_OF):
    capture = Capture()
    term = DistillTerm(Divergence(loss), centered=centered)
    result, _ = one_step(seqs, Objective(((1.0, term), (1.0, capture))), row_tokens=row_tokens,
                         teacher_targets=teacher, center_group_of=group_of)
    return result, capture.grads()


@pytest.mark.parametrize("loss", ["forward_kl", "reverse_kl"])
def test_centering_removes_each_kinds_mean_push_at_first_tokens_only(loss):
    seqs = sequences()
    teacher = targets(PackedModel(tiny_llama(seed=1), VOCAB, 0), seqs)
    plain, g_plain = logit_grads(seqs, False, loss, teacher)
    centered, g_cent = logit_grads(seqs, True, loss, teacher)
    assert centered.metrics["kd_loss"] == pytest.approx(plain.metrics["kd_loss"], abs=1e-7)  # the value is still the divergence
    firsts = first_positions(seqs)
    others = [i for i in range(g_plain.shape[0]) if i not in firsts]
    torch.testing.assert_close(g_cent[others], g_plain[others], atol=0, rtol=0)  # later tokens: untouched
    weight = 1.0 / g_plain.shape[0]  # token weighting
    for kind in ("answer", "memory_update"):
        at = [p for p, s in zip(firsts, seqs, strict=True) if GROUP_OF[s.invocation_id] == kind]
        assert len(at) >= 3
        # the centred pushes of a kind add to zero; each differs from the plain one by the same mean push
        assert g_cent[at].sum(0).abs().max().item() < 1e-7
        shift = (g_plain[at] - g_cent[at]) / weight
        torch.testing.assert_close(shift, shift[:1].expand_as(shift), atol=1e-6, rtol=0)
        torch.testing.assert_close(shift[0], g_plain[at].sum(0) / (weight * len(at)), atol=1e-6, rtol=0)
        assert shift[0].abs().max().item() > 1e-4  # and that mean is not zero: the test can fail
    assert 0 < centered.metrics["kd_shared_fraction"] < 1


def test_centering_does_not_depend_on_packing_and_adds_up_over_processes():
    seqs = sequences()
    teacher = targets(PackedModel(tiny_llama(seed=1), VOCAB, 0), seqs)
    objective = objective_from_config(config(loss=dict(divergence="forward_kl", teacher_centering="first_token", rl_weight=0.0)))
    one_row, g_one = one_step(seqs, objective, row_tokens=4096, teacher_targets=teacher, center_group_of=GROUP_OF)
    many, g_many = one_step(seqs, objective, row_tokens=30, teacher_targets=teacher, center_group_of=GROUP_OF)
    assert many.metrics["kd_shared_fraction"] == pytest.approx(one_row.metrics["kd_shared_fraction"], abs=1e-6)
    for n in g_one:
        torch.testing.assert_close(g_many[n], g_one[n], atol=1e-6, rtol=1e-4, msg=n)

    episodes = list(dict.fromkeys(EPISODE_OF[s.invocation_id] for s in seqs))
    reduce = ThreadReduce(2)
    results: dict[int, tuple] = {}
    models = [tiny_llama(seed=0).train() for _ in range(2)]

    def rank(r: int) -> None:
        runtime = Runtime(rank=r, world_size=2).with_reduce(reduce)
        results[r] = one_step(seqs[r::2], objective, runtime, episodes, teacher_targets=teacher, model=models[r],
                              center_group_of=GROUP_OF)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert reduce.calls == 4  # the step's counts, then the group means: two all-reduces per process
    (r0, g0), (r1, g1) = results[0], results[1]
    assert r0.metrics["kd_shared_fraction"] + r1.metrics["kd_shared_fraction"] == pytest.approx(
        one_row.metrics["kd_shared_fraction"], abs=1e-6)
    for n in g_one:
        torch.testing.assert_close(g0[n] + g1[n], g_one[n], atol=1e-6, rtol=1e-4, msg=n)


def test_a_group_of_one_call_is_all_shared_and_loses_its_first_token_push():
    seqs = sequences()
    teacher = targets(PackedModel(tiny_llama(seed=1), VOCAB, 0), seqs)
    alone = {s.invocation_id: s.invocation_id for s in seqs}  # every call its own kind: the mean is the call
    result, grads = logit_grads(seqs, True, "forward_kl", teacher, group_of=alone)
    assert result.metrics["kd_shared_fraction"] == pytest.approx(1.0, abs=1e-9)
    assert grads[first_positions(seqs)].abs().max().item() < 1e-9


def test_centering_comes_from_the_config_and_needs_a_full_teacher():
    objective = objective_from_config(config(loss=dict(teacher_centering="first_token")))
    term = objective.terms[0][1]
    assert isinstance(term, DistillTerm) and term.centered and objective.centered is term
    assert objective_from_config(config()).centered is None
    assert config().loss.teacher_centering is TeacherCentering.none
    with pytest.raises(ValueError, match="teacher_centering=first_token reads the teacher's full distribution"):
        config(teacher=dict(source=TeacherSourceKind.scores), loss=dict(teacher_centering="first_token"))
    with pytest.raises(ValueError, match="target=barycenter builds its target from the student"):
        config(loss=dict(teacher_centering="first_token", target="barycenter"))
    with pytest.raises(ValueError, match=r"needs a teacher and loss\.kd_weight > 0"):
        config(loss=dict(teacher_centering="first_token", kd_weight=0.0))
    with pytest.raises(TrainingError, match="full distribution"):
        DistillTerm(centered=True)(micro_batch(teacher=torch.full((4,), -1.0)))
    with pytest.raises(TrainingError, match="no group means"):
        DistillTerm(centered=True)(micro_batch(teacher=torch.zeros(4, 6)))
    seqs = sequences()
    with pytest.raises(TrainingError, match="needs each call's group"):
        one_step(seqs, objective_from_config(config(loss=dict(teacher_centering="first_token"))),
                 teacher_targets=targets(PackedModel(tiny_llama(seed=1), VOCAB, 0), seqs))


def test_centering_groups_are_the_kind_or_the_kind_and_whether_the_memory_was_empty():
    def call(kind: str, memory: str) -> Invocation:
        return Invocation(episode_id="e", step=0, kind=kind, prompt_ids=[1], output_ids=[2], output_logprobs=[-1.0],
                          memory_before=memory)

    calls = [call("memory_update", ""), call("memory_update", "(empty)"), call("memory_update", " (empty)\n"),
             call("memory_update", "Bazo works for Pinisoft."), call("answer", "(empty)"), call("answer", "a fact")]
    by_kind = centering_groups(calls, TeacherCentering.first_token)
    by_memory = centering_groups(calls, TeacherCentering.first_token_memory)
    assert [by_kind[c.id] for c in calls] == ["memory_update"] * 4 + ["answer"] * 2
    assert [by_memory[c.id] for c in calls] == ["memory_update/empty"] * 3 + ["memory_update/held", "answer/empty",
                                                                              "answer/held"]
    with pytest.raises(ValueError, match="no groups"):
        centering_groups(calls, TeacherCentering.none)

"""Distillation on tiny models: it trains every parameter with a finite loss, packing does not change
the step, resume continues exactly, checkpoints are model folders, bad input is one clear error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import OLD_ROLLOUT, SYNTH, register_policy
from job_fixtures import distill_config, models
from transformers import AutoModelForCausalLM

from agentmem.backends.transformers_backend import TransformersBackend
from agentmem.config import AgentConfig, DistillConfig, Oversize, RolloutConfig, TeacherSourceKind
from agentmem.errors import ConfigError
from agentmem.jobs.distill import check_psd_runs, check_rl_runs, run_distill
from agentmem.jobs.rollout import run_rollout
from agentmem.jobs.training_shell import load_train_run
from agentmem.records import EpisodeStatus, Run, RunKind, TeacherContext
from agentmem.replay import ReplayError, pack
from agentmem.testing.tiny_models import tiny_llama, tiny_tokenizer
from agentmem.training.forward import PackedModel
from agentmem.training.objective import StepInputs, accumulate_step
from agentmem.training.selection import select, student_sequences
from agentmem.training.teachers import OnlineTeacher
from agentmem.training.terms import objective_from_config
from agentmem.training.trainer import Models, advantages, step_indices
from store import repository as repo


def shards_of(cfg: DistillConfig) -> DistillConfig:
    """``cfg`` with its teacher's targets read from top-K shards."""
    return cfg.model_copy(update={"teacher": cfg.teacher.model_copy(update={"source": TeacherSourceKind.shards})})


def test_trains_every_parameter_and_registers_checkpoint(rolled, tmp_path):
    store, run_id, policy = rolled
    m = models(policy)
    before = {n: p.detach().clone() for n, p in m.student.named_parameters()}
    result = run_distill(store, distill_config(run_id, tmp_path), models=m)
    assert len(result.history) == 2
    for step in result.history:
        assert np.isfinite(step.loss) and step.kd_loss > 0 and step.tokens > 0
    unchanged = [n for n, p in m.student.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []
    ckpt = result.last_checkpoint
    assert ckpt.step == 2 and ckpt.parent_id == policy.id and ckpt.run_id == result.run_id
    loaded = AutoModelForCausalLM.from_pretrained(ckpt.path)
    for (n, p), (_, q) in zip(m.student.named_parameters(), loaded.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, msg=n)
    with store.session() as s:
        assert [t.step for t in repo.list_train_steps(s, result.run_id)] == [1, 2]
        assert repo.list_checkpoints(s, result.run_id) == [ckpt]


def test_checkpoints_keep_the_optimizer_as_sft_does(rolled, tmp_path):
    """distill's finished run kept the optimizer state in its last checkpoint (three times the model, 1.62 GB on
    the default model, where sft's keeps 0.54 GB): as in sft, only a running job's latest checkpoint keeps it, the
    finished run's last one only with keep_optimizer or when its schedule goes on (a train round but the last),
    and keep_last deletes all but the last N folders. Resuming past a run that kept none is refused before any
    model loads."""
    from pathlib import Path

    from agentmem.training.checkpoints import has_optimizer_state

    store, run_id, policy = rolled
    assert (DistillConfig(run_ids=["r"]).keep_optimizer, DistillConfig(run_ids=["r"]).keep_last) == (False, None)
    runs = {"dropped": distill_config(run_id, tmp_path / "a", save_every=1, optim=dict(steps=3)),
            "kept": distill_config(run_id, tmp_path / "b", save_every=1, keep_optimizer=True, keep_last=2, optim=dict(steps=3)),
            "round": distill_config(run_id, tmp_path / "c", save_every=1, optim=dict(steps=3, schedule_steps=6))}
    done = {name: run_distill(store, cfg, models=models(policy)) for name, cfg in runs.items()}
    with store.session() as s:
        paths = {name: [Path(c.path) for c in repo.list_checkpoints(s, r.run_id)] for name, r in done.items()}
    assert {name: [p.is_dir() and has_optimizer_state(p) for p in found] for name, found in paths.items()} == {
        "dropped": [False, False, False], "kept": [False, False, True], "round": [False, False, True]}
    assert [p.is_dir() for p in paths["kept"]] == [False, True, True]
    assert all((p / "config.json").is_file() for p in paths["dropped"])
    with pytest.raises(ConfigError, match=r"kept no optimizer state \(--keep-optimizer keeps it\)"):
        run_distill(store, None, resume=done["dropped"].run_id, steps=4, models=models(policy))


@pytest.mark.parametrize("kind,weighting", [("reverse_kl", "token"), ("jsd", "call"), ("forward_kl", "episode")])
def test_packed_and_unpacked_step_agree(rolled, kind, weighting):
    store, run_id, policy = rolled
    m = models(policy)
    selection = select(store, [run_id])
    seqs = student_sequences(selection)[:6]
    teacher = OnlineTeacher.for_selection(m.teacher, m.tokenizer, "t", selection, TeacherContext.privileged,
                                          row_tokens=4096)
    inputs = StepInputs({i.id: i.episode_id for i in selection.invocations}, advantages(selection, False),
                        {i.id: 1.0 for i in selection.invocations}, teacher.targets([s.invocation_id for s in seqs]))
    objective = objective_from_config(DistillConfig(run_ids=[run_id], loss=dict(divergence=kind, beta=0.3, weighting=weighting)))
    student = PackedModel.create(m.student, m.tokenizer)
    results, grads = [], []
    for row_tokens in (4096, max(len(s) for s in seqs)):  # all in one row, then (almost) one per row
        rows, _ = pack(seqs, row_tokens)
        m.student.zero_grad()
        results.append(accumulate_step(student, rows, inputs, objective))
        grads.append({n: p.grad.clone() for n, p in m.student.named_parameters()})
    assert len(pack(seqs, 4096)[0]) == 1 and len(pack(seqs, max(len(s) for s in seqs))[0]) > 1
    assert results[0].loss == pytest.approx(results[1].loss, abs=1e-6)
    assert results[0].metrics["kd_loss"] == pytest.approx(results[1].metrics["kd_loss"], abs=1e-6)
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], atol=1e-6, rtol=1e-4, msg=n)


def test_grpo_advantages_per_invocation(rolled):
    store, run_id, _ = rolled
    selection = select(store, [run_id])
    adv = advantages(selection, normalize_std=False)
    for inv in selection.invocations:
        ep = selection.episodes[inv.episode_id]
        group = [e.reward for e in selection.episodes.values() if e.task_id == ep.task_id]
        assert adv[inv.id] == pytest.approx(ep.reward - sum(group) / len(group))
    assert {round(a, 6) for a in adv.values()} == {-0.5, 0.5}


def test_step_order_depends_only_on_seed_and_step():
    a = [step_indices(10, 4, 3, s).tolist() for s in range(6)]
    assert a == [step_indices(10, 4, 3, s).tolist() for s in range(6)]
    assert sorted(sum(a[:3], [])) == list(range(10))  # one epoch covers everything once


class Interrupt(Exception):
    pass


def test_resume_gives_the_same_next_steps(rolled, tmp_path):
    store, run_id, policy = rolled
    cfg = distill_config(run_id, tmp_path, save_every=2, optim=dict(steps=4), batch=dict(invocations_per_step=3))
    straight = run_distill(store, cfg, models=(m_straight := models(policy)))

    def die_after_3(step):
        if step.step == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_distill(store, cfg, models=models(policy), on_step=die_after_3)
    with store.session() as s:
        killed_id = [r.run.id for r in repo.list_runs(s) if r.run.kind.value == "distill" and r.run.status == "failed"][0]
    full_id, stored_cfg, last = load_train_run(store, killed_id[:8], RunKind.distill, DistillConfig)
    assert full_id == killed_id
    assert stored_cfg == cfg and last.step == 2
    resumed_models = models(policy)
    resumed_models.student.load_state_dict(AutoModelForCausalLM.from_pretrained(last.path).state_dict())
    resumed = run_distill(store, None, resume=killed_id, models=resumed_models)
    assert [h.step for h in resumed.history] == [3, 4]
    for a, b in zip(straight.history[2:], resumed.history, strict=True):
        assert a.loss == pytest.approx(b.loss, abs=1e-6, rel=1e-6)
    for (n, p), (_, q) in zip(m_straight.student.named_parameters(), resumed_models.student.named_parameters(),
                              strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=n)
    with store.session() as s:
        assert [t.step for t in repo.list_train_steps(s, killed_id)] == [1, 2, 3, 4]


def test_bad_inputs(rolled, tmp_path, sqlite_store):
    store, run_id, policy = rolled
    with pytest.raises(Exception, match="no run with id 'nopenope'"):
        run_distill(store, distill_config("nopenope", tmp_path), models=models(policy))
    from agentmem.records import Run, RunKind

    empty = Run(kind=RunKind.rollout)
    with store.session() as s:
        repo.start_run(s, empty)
        s.commit()
    with pytest.raises(ValueError, match="no stored invocations"):
        run_distill(store, distill_config(empty.id, tmp_path), models=models(policy))
    from transformers import PreTrainedTokenizerFast

    tok = tiny_tokenizer()
    other = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, eos_token="<|im_end|>")
    other.add_tokens(["<new>"])
    m = models(policy)
    with pytest.raises(ValueError, match="vocabularies differ"):
        run_distill(store, distill_config(run_id, tmp_path), models=Models(m.student, tok, policy, m.teacher, other))
    assert all(e.status is not EpisodeStatus.running for e in select(store, [run_id]).episodes.values())


def test_distill_from_a_stored_run_on_each_database(store, tmp_path):
    """The same rollout -> distill path on SQLite and Postgres (the `store` fixture runs both)."""
    tok = tiny_tokenizer()
    cfg = RolloutConfig(model="tiny", episodes=1, group_size=2, chunk_tokens=48, env_knobs=SYNTH,
                        agent=AgentConfig(memory_tokens=6, answer_max_new_tokens=3, seed=1))
    policy = register_policy(store, "/models/tiny", "tiny")
    rolled = run_rollout(store, cfg, backend=TransformersBackend.from_model(tiny_llama(seed=3), tok), policy=policy)
    result = run_distill(store, distill_config(rolled.run_id, tmp_path, optim=dict(steps=1)), models=models(policy))
    with store.session() as s:
        (step,) = repo.list_train_steps(s, result.run_id)
        assert repo.get_checkpoint(s, result.last_checkpoint.id).step == 1
    assert np.isfinite(step.loss) and step.kd_loss > 0


def test_distill_from_topk_shards(rolled, tmp_path):
    """With K = vocabulary the shards hold the whole teacher distribution: the same losses as the online
    teacher. With a small K the tail mass is spread evenly and every divergence stays finite."""
    from agentmem.config import ScoreConfig
    from agentmem.jobs.score import run_score
    from agentmem.training.scoring import LoadedModel

    store, run_id, policy = rolled
    tok = tiny_tokenizer()
    teacher = tiny_llama(seed=1)
    cfg = distill_config(run_id, tmp_path, teacher=dict(context=TeacherContext.aligned), rl=dict(kind="none"), optim=dict(steps=2))
    with pytest.raises(ValueError, match="run `agentmem score --topk K` first"):
        run_distill(store, shards_of(cfg),
                    models=Models(tiny_llama(seed=0).train(), tok, policy, None, None, "t-full"))
    run_score(store, ScoreConfig(run_ids=[run_id], topk=len(tok), topk_dir=str(tmp_path / "full")),
              teacher=LoadedModel(teacher, tok, "t-full"))
    online = run_distill(store, cfg, models=Models(tiny_llama(seed=0).train(), tok, policy, teacher, tok))
    shards = run_distill(store, shards_of(cfg),
                         models=Models(tiny_llama(seed=0).train(), tok, policy, None, None, "t-full"))
    for a, b in zip(online.history, shards.history, strict=True):
        assert a.kd_loss == pytest.approx(b.kd_loss, rel=1e-4, abs=1e-6)
    run_score(store, ScoreConfig(run_ids=[run_id], topk=4, topk_dir=str(tmp_path / "k4")),
              teacher=LoadedModel(teacher, tok, "t-k4"))
    small = run_distill(store, shards_of(cfg),
                        models=Models(tiny_llama(seed=0).train(), tok, policy, None, None, "t-k4"))
    assert all(np.isfinite(h.kd_loss) and h.kd_loss > 0 for h in small.history)


def test_dense_logprobs_from_topk_exact():
    from agentmem.training.topk import dense_logprobs

    values = torch.log(torch.tensor([[0.5, 0.3]]))
    out = dense_logprobs(values, torch.tensor([[2, 0]]), vocab=6)
    expected = torch.log(torch.tensor([[0.3, 0.05, 0.5, 0.05, 0.05, 0.05]]))
    torch.testing.assert_close(out, expected)
    assert out.exp().sum().item() == pytest.approx(1.0)


class RecordingTeacher:
    def __init__(self, inner):
        self.inner, self.name, self.asked = inner, inner.name, []

    def targets(self, ids):
        self.asked.extend(ids)
        return self.inner.targets(ids)


def test_oversize_call_is_skipped_counted_and_absent_from_the_teacher(rolled, tmp_path):
    """A call over the row budget is left out of the step (student and teacher) and counted; the other
    calls' loss equals a step without it. The longer privileged teacher contexts are cut from the left
    (teacher_truncation=left) and counted."""
    from agentmem.training.trainer import Trainer, draw_units

    store, run_id, policy = rolled
    seqs = student_sequences(select(store, [run_id]))
    budget = max(len(s) for s in seqs) - 1
    long = {s.invocation_id: len(s) for s in seqs if len(s) > budget}
    cfg = distill_config(run_id, tmp_path, teacher=dict(truncation="left"), batch=dict(invocations_per_step=len(seqs), row_tokens=budget, oversize="skip"))
    skipping = Trainer(store, cfg, models(policy), "a")
    skipping.teacher = recorder = RecordingTeacher(skipping.teacher)
    step = skipping.step(0)
    assert step.metrics["skipped_calls"] == len(long) >= 1
    assert step.metrics["skipped_tokens"] == sum(long.values())
    assert step.metrics["teacher_truncated_calls"] >= 1 and step.metrics["teacher_truncated_tokens"] >= 1
    assert set(recorder.asked) == {s.invocation_id for s in seqs} - set(long)

    without = Trainer(store, cfg, models(policy), "b")
    without.student_seqs = [s for s in without.student_seqs if s.invocation_id not in long]
    without.units = draw_units(without.student_seqs, cfg.batch.packing)
    expected = without.step(0)
    assert expected.metrics["skipped_calls"] == 0
    assert (step.loss, step.kd_loss, step.rl_loss, step.tokens) == (
        expected.loss, expected.kd_loss, expected.rl_loss, expected.tokens)

    refusing = Trainer(store, cfg.model_copy(update={"batch": cfg.batch.model_copy(update={"oversize": Oversize.error})}),
                       models(policy), "c")
    first = next(iter(long))
    with pytest.raises(ReplayError, match=f"invocation {first}: {long[first]} tokens .* row budget of {budget}"):
        refusing.step(0)


@pytest.mark.parametrize("context", [TeacherContext.aligned, TeacherContext.privileged])
def test_a_step_counts_the_tokens_the_teacher_read(rolled, tmp_path, context):
    """``teacher_tokens``: every drawn call under the teacher's context, once; aligned, the student's own."""
    from agentmem.training.selection import teacher_sequences
    from agentmem.training.trainer import Trainer

    store, run_id, policy = rolled
    selection = select(store, [run_id])
    every = len(student_sequences(selection))
    step = Trainer(store, distill_config(run_id, tmp_path, teacher=dict(context=context), batch=dict(invocations_per_step=every)), models(policy),
                   context.value).step(0)
    read = sum(len(s) for s in teacher_sequences(selection, context, tiny_tokenizer()))
    assert step.metrics["teacher_tokens"] == read
    assert (read == step.tokens) if context is TeacherContext.aligned else (read > step.tokens)


def test_teacher_contexts_over_the_budget_are_refused_unless_cut(rolled, tmp_path):
    from agentmem.training.trainer import Trainer

    store, run_id, policy = rolled
    seqs = student_sequences(select(store, [run_id]))
    budget = max(len(s) for s in seqs)  # every student call fits; the privileged teacher contexts do not
    cfg = distill_config(run_id, tmp_path, batch=dict(invocations_per_step=len(seqs), row_tokens=budget))
    with pytest.raises(ReplayError, match="exceed the row budget"):
        Trainer(store, cfg, models(policy), "a").step(0)


def test_shared_prefix_steps_draw_whole_sibling_groups(rolled, tmp_path):
    """With shared-prefix packing a step takes whole (run, task, step) groups, so siblings share a step;
    every call is still drawn exactly once per epoch."""
    from agentmem.config import Packing
    from agentmem.training.trainer import draw_units, step_units

    store, run_id, policy = rolled
    seqs = student_sequences(select(store, [run_id]))
    units = draw_units(seqs, Packing.shared_prefix)
    assert all(len({seqs[i].group for i in u}) == 1 for u in units)
    assert sorted(i for u in units for i in u) == list(range(len(seqs)))
    assert max(len(u) for u in units) == 2  # group_size=2 in the fixture
    per_epoch = [step_units(units, 4, 0, s) for s in range(-(-len(units) // 2))]
    assert sorted(sum(per_epoch, [])) == list(range(len(units)))
    assert draw_units(seqs, Packing.segments) == [[i] for i in range(len(seqs))]


# -- the seed methods: barycenter target, per-token clipping, the anchor --------------------------------


def test_two_barycenter_steps_with_clipping_on_each_database(store, tmp_path):
    """`--target barycenter --jsd-clip` for two steps on a tiny model: finite losses, the alpha and clip
    metrics stored in train_steps, every parameter changed (SQLite and Postgres)."""
    tok = tiny_tokenizer()
    cfg = RolloutConfig(model="tiny", episodes=1, group_size=2, chunk_tokens=48, env_knobs=SYNTH,
                        agent=AgentConfig(memory_tokens=6, answer_max_new_tokens=3, seed=1))
    policy = register_policy(store, "/models/tiny", "tiny")
    rolled = run_rollout(store, cfg, backend=TransformersBackend.from_model(tiny_llama(seed=3), tok), policy=policy)
    m = models(policy)
    before = {n: p.detach().clone() for n, p in m.student.named_parameters()}
    # per-token divergences towards q are 0.0053 to 0.0068 here: the clip splits them
    distill_cfg = distill_config(rolled.run_id, tmp_path, loss=dict(target="barycenter", alpha_tau=0.02, alpha_ema=0.5, jsd_clip=0.0057), rl=dict(kind="none"))
    result = run_distill(store, distill_cfg, models=m)
    with store.session() as s:
        stored = repo.list_train_steps(s, result.run_id)
    assert [t.step for t in stored] == [1, 2]
    for step in stored:
        assert np.isfinite(step.loss) and np.isfinite(step.kd_loss) and step.kd_loss > 0
        assert 0 < step.metrics["alpha_mean"] <= 1 and 0 <= step.metrics["alpha_below_half"] <= 1
        assert 0 < step.metrics["alpha_raw_mean"] <= 1 and 0 <= step.metrics["kd_clip_fraction"] <= 1
    assert stored[0].metrics["alpha_mean"] == pytest.approx(stored[0].metrics["alpha_raw_mean"], abs=1e-6)
    assert all(0 < t.metrics["kd_clip_fraction"] < 1 for t in stored)  # some tokens clipped, some trained
    unchanged = [n for n, p in m.student.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []


def test_resume_restores_the_alpha_ema(rolled, tmp_path):
    """The barycenter's alpha EMA is saved in each checkpoint's trainer state: a run killed after step 3
    and resumed from its step-2 checkpoint gives the uninterrupted run's steps 3 and 4."""
    store, run_id, policy = rolled
    cfg = distill_config(run_id, tmp_path, save_every=2, loss=dict(target="barycenter", alpha_tau=0.05, alpha_ema=0.5), rl=dict(kind="none"), optim=dict(steps=4), batch=dict(invocations_per_step=3))
    straight = run_distill(store, cfg, models=models(policy))

    def die_after_3(step):
        if step.step == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_distill(store, cfg, models=models(policy), on_step=die_after_3)
    with store.session() as s:
        killed_id = [r.run.id for r in repo.list_runs(s) if r.run.kind.value == "distill" and r.run.status == "failed"][0]
    _, _, last = load_train_run(store, killed_id, RunKind.distill, DistillConfig)
    resumed_models = models(policy)
    resumed_models.student.load_state_dict(AutoModelForCausalLM.from_pretrained(last.path).state_dict())
    resumed = run_distill(store, None, resume=killed_id, models=resumed_models)
    for a, b in zip(straight.history[2:], resumed.history, strict=True):
        assert a.metrics["alpha_mean"] == pytest.approx(b.metrics["alpha_mean"], abs=1e-6)
        assert a.loss == pytest.approx(b.loss, abs=1e-6, rel=1e-6)
    # without the saved mean, step 3's alphas would be unblended: the EMA is what makes them equal
    assert straight.history[2].metrics["alpha_mean"] != pytest.approx(straight.history[2].metrics["alpha_raw_mean"],
                                                                      abs=1e-6)


def test_anchor_is_zero_at_the_start_and_grows_after_a_step(rolled, tmp_path):
    """anchor_weight > 0 with the reference a frozen copy of the starting student: the anchor loss is 0 at
    the first step (student == reference) and positive once the parameters have moved."""
    store, run_id, policy = rolled
    m = models(policy)
    reference = tiny_llama(seed=0).requires_grad_(False)
    anchored = Models(m.student, m.tokenizer, policy, m.teacher, m.teacher_tokenizer, reference=reference)
    result = run_distill(store, distill_config(run_id, tmp_path, loss=dict(anchor_weight=0.5), rl=dict(kind="none")), models=anchored)
    first, second = result.history
    assert first.metrics["anchor_loss"] == pytest.approx(0.0, abs=1e-7)
    assert second.metrics["anchor_loss"] > 1e-6
    assert first.loss == pytest.approx(first.kd_loss, abs=1e-6)  # the anchor adds nothing at the start


def test_distill_reads_the_stored_sampling_context_and_policy_through_the_config(sqlite_store):
    runs = {"privileged": OLD_ROLLOUT, "oracle": {**OLD_ROLLOUT, "context": "aligned", "policy": "oracle"},
            "plain": {**OLD_ROLLOUT, "context": "aligned"}, "hint": {**OLD_ROLLOUT, "context": "hint"}}
    ids = {}
    with sqlite_store.session() as s:
        for name, config in runs.items():
            run = Run(kind=RunKind.rollout, config=config, status="finished")
            repo.insert_run(s, run)
            ids[name] = run.id
        s.commit()
    check_rl_runs(sqlite_store, DistillConfig(run_ids=[ids["plain"]], teacher=dict(model=None), loss=dict(kd_weight=0)))
    with pytest.raises(ConfigError, match=f"run {ids['privileged']} was sampled under the privileged prompt"):
        check_rl_runs(sqlite_store, DistillConfig(run_ids=[ids["privileged"]], teacher=dict(model=None), loss=dict(kd_weight=0)))
    with pytest.raises(ConfigError, match=f"run {ids['oracle']} is an oracle rollout"):
        check_rl_runs(sqlite_store, DistillConfig(run_ids=[ids["oracle"]], teacher=dict(model=None), loss=dict(kd_weight=0)))
    # a hint teacher's samples are not the student's either: no RL term, no on-policy PSD
    with pytest.raises(ConfigError, match=f"run {ids['hint']} was sampled under the hint prompt"):
        check_rl_runs(sqlite_store, DistillConfig(run_ids=[ids["hint"]], teacher=dict(model=None), loss=dict(kd_weight=0)))
    with pytest.raises(ConfigError, match=f"but run {ids['hint']} was sampled under the hint prompt"):
        check_psd_runs(sqlite_store, DistillConfig(run_ids=[ids["hint"]], teacher=dict(psd="on_policy", context="privileged"), rl=dict(kind="none")))

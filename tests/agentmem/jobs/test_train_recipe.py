"""The training recipe's seams: the learning-rate schedule (one over every round of `train`), AdamW's state
carried across rounds, the reward choices, and the per-step dynamics (live groups, first-token EOS and
output length per kind, KL to the teacher and to the start) with the warnings that say training is dead."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from job_fixtures import distill_config, models, tiny_train

from agentmem.config import LrSchedule, RewardKind, TrainConfig
from agentmem.errors import ConfigError
from agentmem.jobs.distill import run_distill
from agentmem.jobs.train import run_train
from agentmem.records import Episode, TrainStep
from agentmem.testing.tiny_models import save_tiny, tiny_tokenizer
from agentmem.training.dynamics import finish_sums, group_liveness, note, output_stats, round_warnings
from agentmem.training.schedule import lr_at
from agentmem.training.trainer import episode_reward
from agentmem.training.validation import first_token_eos
from store import repository as repo


def test_lr_schedule_exact_values():
    assert [lr_at(s, 1.0, 5) for s in range(5)] == [1.0] * 5
    assert [lr_at(s, 3.0, 5, warmup=2) for s in range(3)] == [1.0, 2.0, 3.0]
    cos = [lr_at(s, 2.0, 5, warmup=1, schedule=LrSchedule.cosine, min_ratio=0.1) for s in range(6)]
    assert cos[0] == 1.0 and cos[1] == 2.0  # warmup, then the peak
    assert cos[4] == pytest.approx(0.2) and cos[5] == pytest.approx(0.2)  # the floor at the last step, and past it
    mid = 2.0 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 1 / 3)))
    assert cos[2] == pytest.approx(mid)
    assert all(a >= b for a, b in zip(cos[1:], cos[2:], strict=False))
    with pytest.raises(ValueError):
        lr_at(-1, 1.0, 3)


def test_rounds_share_one_schedule():
    loop = TrainConfig()
    offsets = [loop.round_configs(r, "p")[1] for r in range(loop.rounds)]
    assert [(d.optim.schedule_offset, d.optim.schedule_steps) for d in offsets] == [(0, 4), (2, 4)]


def test_distill_steps_follow_the_schedule_and_record_the_lr(rolled, tmp_path):
    store, run_id, policy = rolled
    cfg = distill_config(run_id, tmp_path, optim=dict(steps=3, lr=1e-3, warmup_steps=1, schedule="cosine", schedule_offset=2, schedule_steps=6))
    result = run_distill(store, cfg, models=models(policy))
    expected = [lr_at(2 + s, 1e-3, 6, 1, LrSchedule.cosine, 0.1) for s in range(3)]
    assert [s.lr for s in result.history] == pytest.approx(expected)


def test_carry_optimizer_starts_from_the_checkpoint_state(rolled, tmp_path):
    """A job started from a checkpoint with ``carry_optimizer`` loads the checkpoint's AdamW state: its step
    differs in every tensor from the same job with a fresh optimizer."""
    store, run_id, policy = rolled
    one = run_distill(store, distill_config(run_id, tmp_path / "a", save_every=1, keep_optimizer=True, optim=dict(steps=2)),
                      models=models(policy))
    with store.session() as s:
        ckpts = repo.list_checkpoints(s, one.run_id)
    from transformers import AutoModelForCausalLM

    results = {}
    for carry in (True, False):
        from agentmem.training.trainer import Models

        student = AutoModelForCausalLM.from_pretrained(ckpts[-1].path).train()  # the last keeps its AdamW state
        m = models(policy)
        m = Models(student, m.tokenizer, ckpts[-1], m.teacher, m.teacher_tokenizer)
        cfg = distill_config(run_id, tmp_path / f"b{carry}", optim=dict(steps=1, carry_optimizer=carry))
        run_distill(store, cfg, models=m)
        results[carry] = {n: p.detach().clone() for n, p in student.named_parameters()}
    # both take one step from the same weights on the same calls; only the carried one uses AdamW's moments
    # from the first job, so they differ; a fresh Adam's first step moves every weight by lr (sign-like)
    changed = [n for n in results[True] if not torch.equal(results[True][n], results[False][n])]
    assert len(changed) == len(results[True])


def test_carry_without_first_moment_moves_by_the_new_gradients_alone(tmp_path):
    """``carry_trainer_state(first_moment=False)``: AdamW's running mean of the earlier gradients is zeroed,
    its second moment and step count kept. A zero gradient then moves nothing (the fully carried state moves
    along the earlier direction), and a step with gradient g is exactly the gradient part of the fully carried
    step: -lr (1-b1) g / (1-b1^(s+1)) / (sqrt((b2 v + (1-b2) g^2) / (1-b2^(s+1))) + eps), in float64."""
    from agentmem.training.checkpoints import TRAINER_STATE, carry_trainer_state

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(6, dtype=torch.float64))
    opt = torch.optim.AdamW([w], lr=1e-2, weight_decay=0.0)
    for _ in range(3):
        w.grad = torch.randn(6, dtype=torch.float64)
        opt.step()
    torch.save({"optimizer": opt.state_dict(), "step": 3}, tmp_path / TRAINER_STATE)
    v, s = opt.state[w]["exp_avg_sq"].clone(), int(opt.state[w]["step"])

    def carried(first_moment: bool) -> tuple[torch.nn.Parameter, torch.optim.Optimizer]:
        q = torch.nn.Parameter(w.detach().clone())
        o = torch.optim.AdamW([q], lr=1e-2, weight_decay=0.0)
        assert carry_trainer_state(tmp_path, o, first_moment=first_moment)
        return q, o

    q, o = carried(False)
    state = o.state[q]
    assert not state["exp_avg"].any() and torch.equal(state["exp_avg_sq"], v) and int(state["step"]) == s
    start = q.detach().clone()
    q.grad = torch.zeros_like(q)
    o.step()
    assert torch.equal(q.detach(), start)  # no carried push
    full, fo = carried(True)
    full.grad = torch.zeros_like(full)
    fo.step()
    assert not torch.equal(full.detach(), start)  # the fully carried state coasts

    q, o = carried(False)
    g = torch.randn(6, dtype=torch.float64)
    q.grad = g.clone()
    o.step()
    (b1, b2), eps, lr = o.param_groups[0]["betas"], o.param_groups[0]["eps"], 1e-2
    v_hat = (b2 * v + (1 - b2) * g**2) / (1 - b2 ** (s + 1))
    want = w.detach() - lr * ((1 - b1) * g / (1 - b1 ** (s + 1))) / (v_hat.sqrt() + eps)
    assert torch.allclose(q.detach(), want, rtol=1e-12, atol=0)


def test_first_moment_choice_reaches_the_trainer_and_concerns_round_one():
    from agentmem.config import SftConfig

    sft = SftConfig(run_ids=["r"], student="s", optim=dict(carry_optimizer=True, carry_first_moment=False))
    assert sft.distill_config().optim.carry_first_moment is False
    # the loop's default: round 1 takes the warm start's (or --student's) scale without its first moment; later
    # rounds carry their own round's moments
    loop = TrainConfig(rounds=3)
    assert loop.distill.optim.carry_optimizer and not loop.distill.optim.carry_first_moment
    assert [loop.round_configs(r, "p")[1].optim.carry_first_moment for r in range(3)] == [False, True, True]
    carried = TrainConfig(rounds=2, distill=loop.distill.model_copy(
        update={"optim": loop.distill.optim.model_copy(update={"carry_first_moment": True})}))
    assert [carried.round_configs(r, "p")[1].optim.carry_first_moment for r in range(2)] == [True, True]


def test_mixed_precision_needs_float32_weights_and_reaches_the_warm_start():
    from pydantic import ValidationError

    from agentmem.config import DistillConfig, SftConfig

    for make in (DistillConfig, SftConfig):
        with pytest.raises(ValidationError, match="mixed_precision .* needs dtype=float32, got dtype=bfloat16"):
            make(run_ids=["r"], student="s", dtype="bfloat16", mixed_precision=True)
        assert make(run_ids=["r"], student="s", mixed_precision=True).mixed_precision
    assert SftConfig(run_ids=["r"], student="s", mixed_precision=True).distill_config().mixed_precision


def test_mixed_precision_distils_float32_weights_close_to_the_float32_step(rolled, tmp_path):
    """One distill step with the student's and the teacher's decoders in bf16 autocast: the weights stay float32,
    the teacher term's value is float32's to bf16 rounding (not equal: the autocast acted), and the step moves
    the weights along the float32 step."""
    store, run_id, policy = rolled
    steps, moves = {}, {}
    for mixed in (False, True):
        m = models(policy)
        before = {n: p.detach().clone() for n, p in m.student.named_parameters()}
        cfg = distill_config(run_id, tmp_path / str(mixed), mixed_precision=mixed, optim=dict(steps=1, lr=1e-4))
        steps[mixed] = run_distill(store, cfg, models=m).history[0]
        assert all(p.dtype == torch.float32 for p in m.student.parameters())
        moves[mixed] = torch.cat([(p.detach() - before[n]).flatten() for n, p in m.student.named_parameters()])
    assert steps[True].kd_loss != steps[False].kd_loss
    assert steps[True].kd_loss == pytest.approx(steps[False].kd_loss, rel=1e-2)
    assert torch.nn.functional.cosine_similarity(moves[True], moves[False], dim=0).item() > 0.9


def test_reward_choices():
    e = Episode(run_id="r", env="e", task_id="t", question="q", reward=0.4, f1=0.4, sub_em=1.0)
    assert episode_reward(e, RewardKind.f1) == 0.4
    assert episode_reward(e, RewardKind.sub_em) == 1.0
    assert episode_reward(e, RewardKind.max_f1_sub_em) == 1.0
    failed = Episode(run_id="r", env="e", task_id="t", question="q")
    assert [episode_reward(failed, k) for k in RewardKind] == [0.0, 0.0, 0.0]


def test_dynamics_pure_functions():
    adv = {"a": 0.0, "b": 0.0, "c": 0.5, "d": -0.5, "e": 0.3}
    group = {"a": ("r", 1), "b": ("r", 1), "c": ("r", 2), "d": ("r", 2), "e": ("r", 3)}
    sizes = {("r", 1): 2, ("r", 2): 2, ("r", 3): 1}  # a singleton group is no group
    assert group_liveness(adv, group, ["a", "b", "c", "d", "e"], sizes) == (2, 1)
    stats = output_stats([("u", [9]), ("u", [4, 5, 9]), ("a", [9])], eos_id=9)
    assert stats == {"out_len/a": 1.0, "empty/a": 1.0, "out_len/u": 2.0, "empty/u": 0.5}
    assert finish_sums({"eos_first_sum/u": 0.6, "eos_first_n/u": 2.0, "x": 1.0}) == {"x": 1.0, "eos_first/u": 0.3}
    dead = [TrainStep(run_id="r", step=k, loss=0.0, tokens=1, lr=1.0, seconds=1.0,
                      metrics={"rl_groups": 3.0, "rl_groups_live": 0.0, "empty/answer": 0.5}) for k in (1, 2)]
    warnings = round_warnings(dead, rl_on=True)
    assert len(warnings) == 2 and "0 of 6 groups" in warnings[0] and "answer calls at step 2: 0.50" in warnings[1]
    assert round_warnings(dead, rl_on=False, threshold=0.6) == []
    assert note(dead[0]) == "live 0/3"


def test_each_step_logs_its_dynamics(rolled, tmp_path):
    """RL and KD on, with the reference loaded: every step stores live groups, lengths, first-token EOS per
    kind and both KLs; the lengths equal the drawn calls' stored lengths."""
    store, run_id, policy = rolled
    m = models(policy)
    from agentmem.training.trainer import Models

    m = Models(m.student, m.tokenizer, m.student_checkpoint, m.teacher, m.teacher_tokenizer,
               reference=models(policy).student.requires_grad_(False))
    result = run_distill(store, distill_config(run_id, tmp_path, monitor_start_kl=True, optim=dict(steps=1), batch=dict(invocations_per_step=100)),
                         models=m)
    (step,) = result.history
    with store.session() as s:
        calls = list(repo.stream_invocations(s, run_ids=[run_id]))
    for kind in {c.kind for c in calls}:
        mine = [len(c.output_ids) for c in calls if c.kind == kind]
        assert step.metrics[f"out_len/{kind}"] == pytest.approx(np.mean(mine))
        assert 0.0 < step.metrics[f"eos_first/{kind}"] < 1.0
    assert step.metrics["rl_groups"] == 2 and step.metrics["rl_groups_live"] == 2  # rewards 0 and 1 per task
    assert step.metrics["kl_teacher"] == pytest.approx(step.kd_loss, rel=1e-4)  # reverse KL is the kd term
    assert step.metrics["kl_start"] == pytest.approx(0.0, abs=1e-6)  # the reference is the starting student


def test_first_token_eos_is_the_softmax_at_the_last_prompt_position():
    from agentmem.testing.tiny_models import tiny_llama

    model = tiny_llama(seed=4)
    ids = [3, 7, 11, 5]
    with torch.no_grad():
        p = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1], -1)[2].item()
    assert first_token_eos(model, [("k", ids), ("k", ids)], 2) == {"k": pytest.approx(p)}
    with torch.no_grad():
        ps = [torch.softmax(model(input_ids=torch.tensor([ids[:n]])).logits[0, -1], -1)[2].item() for n in (1, 2, 3, 4)]
    prompts = [("k", ids[:n]) for n in (1, 2, 3, 4)]
    # at most 3 of a kind, evenly spaced: the first, the middle and the last
    assert first_token_eos(model, prompts, 2, max_per_kind=3) == {"k": pytest.approx((ps[0] + ps[2] + ps[3]) / 3)}
    assert first_token_eos(model, prompts, 2, max_per_kind=None) == {"k": pytest.approx(sum(ps) / 4)}


def test_train_refuses_a_teacher_that_stops_at_once(sqlite_store, tmp_path):
    """A teacher whose every first token is end-of-sequence (its lm head says so) is refused before any
    rollout or distill, naming its empty share."""
    from agentmem.testing.tiny_models import tiny_llama

    eos = tiny_tokenizer().eos_token_id
    stopper = tiny_llama(seed=5)
    with torch.no_grad():  # every logit 0 but eos's, a large multiple of the normed hidden state's sum
        stopper.lm_head.weight.zero_()
        stopper.lm_head.weight[eos] = 50.0
    teacher = save_tiny(tmp_path / "stopper", stopper)
    student = save_tiny(tmp_path / "tiny")
    config = tiny_train(student, tmp_path)
    distill = config.distill.model_copy(update={"teacher": config.distill.teacher.model_copy(update={"model": teacher})})
    config = config.model_copy(update={"distill": distill,
                                       "teacher_check_episodes": 2})
    with pytest.raises(ConfigError, match="end-of-sequence-only outputs on 100% of its"):
        run_train(sqlite_store, config)
    with sqlite_store.session() as s:
        kinds = [r.run.kind.value for r in repo.list_runs(s)]
    assert "rollout" not in kinds and "distill" not in kinds


def test_aligned_kinds_score_those_calls_in_the_aligned_context(rolled):
    """persistent with aligned_kinds=[answer]: answer calls get exactly the aligned rebuild, update calls
    the persistent one (the persistent context's effect on update calls alone)."""
    from agentmem.records import TeacherContext
    from agentmem.testing.tiny_models import tiny_llama
    from agentmem.training.selection import select, teacher_sequences
    from agentmem.training.teachers import OnlineTeacher

    store, run_id, _ = rolled
    selection = select(store, [run_id])
    tok = tiny_tokenizer()
    mixed = OnlineTeacher.for_selection(tiny_llama(), tok, "t", selection, TeacherContext.persistent, row_tokens=4096,
                                        aligned_kinds=["answer"])
    aligned = {s.invocation_id: s for s in teacher_sequences(selection, TeacherContext.aligned, tok)}
    persistent = {s.invocation_id: s for s in teacher_sequences(selection, TeacherContext.persistent, tok)}
    kinds = {i.id: i.kind for i in selection.invocations}
    assert {"answer", "memory_update"} <= set(kinds.values())
    def ids(seq) -> list[int]:
        return seq.input_ids.tolist()

    for inv_id, seq in mixed.sequences.items():
        expected = aligned[inv_id] if kinds[inv_id] == "answer" else persistent[inv_id]
        assert ids(seq) == ids(expected) and seq.action_mask.tolist() == expected.action_mask.tolist()
    assert any(ids(aligned[i]) != ids(persistent[i]) for i in kinds if kinds[i] == "memory_update")
    assert any(ids(aligned[i]) != ids(persistent[i]) for i in kinds if kinds[i] == "answer")


def test_train_warm_start_sft_starts_round_one_and_resumes(sqlite_store, tmp_path):
    """``warm_start``: an SFT on an oracle run before round 1, whose last checkpoint is round 1's policy;
    a loop killed after the warm start resumes without redoing it."""
    from agentmem.config import AgentConfig, RolloutConfig, SftConfig
    from agentmem.jobs.rollout import run_rollout
    from agentmem.jobs.train import load_train_state, warm_out

    folder = save_tiny(tmp_path / "tiny")
    oracle = run_rollout(sqlite_store, RolloutConfig(model=folder, policy="oracle", env_knobs={"level": 1},
                                                     chunk_tokens=48, episodes=3,
                                                     agent=AgentConfig(memory_tokens=16, answer_max_new_tokens=4)))
    config = tiny_train(folder, tmp_path, optim=dict(carry_optimizer=True), keep_optimizer=True)  # the last keeps its state
    config = config.model_copy(update={"warm_start": SftConfig(run_ids=[oracle.run_id], out="ignored", optim=dict(steps=2, lr=1e-3), batch=dict(invocations_per_step=4)),
                                       "teacher_check_episodes": 0})

    class Killed(Exception):
        pass

    def kill(msg: str) -> None:
        if msg.startswith("round 1/2: rollout with"):
            raise Killed

    with pytest.raises(Killed):
        run_train(sqlite_store, config, on_phase=kill)
    with sqlite_store.session() as s:
        (train,) = [r.run for r in repo.list_runs(s) if r.run.kind.value == "train"]
        (sft,) = [r.run for r in repo.list_runs(s) if r.run.kind.value == "sft"]
    assert sft.config["out"] == warm_out(config.distill.out, train.id) and sft.status == "finished"
    state = load_train_state(sqlite_store, train.id)
    assert state.finished == [] and state.pending_distill is None
    run_id, rounds = run_train(sqlite_store, None, resume=train.id)
    with sqlite_store.session() as s:
        sfts = [r.run for r in repo.list_runs(s) if r.run.kind.value == "sft"]
        (warm,) = [c for c in repo.list_checkpoints(s, sft.id) if c.step == 2]
    assert len(sfts) == 1  # the warm start was not redone
    assert rounds[0].policy == warm and rounds[1].policy == rounds[0].checkpoint
    # round 1 went on with the warm start's AdamW state: its moments counted the warm start's 2 steps, then
    # the round's 1 (a fresh AdamW would count 1), and round 2 the 4th
    from agentmem.training.checkpoints import TRAINER_STATE

    def adam_steps(ckpt) -> set[int]:
        state = torch.load(f"{ckpt.path}/{TRAINER_STATE}", weights_only=True)
        return {int(v["step"]) for v in state["optimizer"]["state"].values()} if "optimizer" in state else set()

    # only the last round's checkpoint keeps the AdamW state (the warm start's and round 1's were dropped
    # once the next round had its own; the last keeps it because of --keep-optimizer), and it counted all 4
    # steps: 2 warm-start steps, then 1 per round
    assert adam_steps(warm) == set() and adam_steps(rounds[0].checkpoint) == set()
    assert adam_steps(rounds[1].checkpoint) == {4}


def test_equal_rewards_give_no_live_group_and_a_warning(rolled, tmp_path):
    """Every sample of a task scored the same: the step records 0 live groups of 2, and the job's warnings
    say the RL term had no signal."""
    store, run_id, policy = rolled
    with store.session() as s:
        for ep in repo.list_episodes(s, run_id):
            repo.update_episode(s, ep.model_copy(update={"reward": 0.5, "f1": 0.5}))
        s.commit()
    result = run_distill(store, distill_config(run_id, tmp_path, optim=dict(steps=1), batch=dict(invocations_per_step=100)), models=models(policy))
    (step,) = result.history
    assert (step.metrics["rl_groups"], step.metrics["rl_groups_live"], step.metrics["rl_live_fraction"]) == (2, 0, 0)
    (warning,) = [w for w in round_warnings(result.history, rl_on=True) if "RL term" in w]
    assert "0 of 2 groups had a non-zero advantage" in warning


def test_teacher_check_refuses_a_teacher_that_writes_empty_after_evidence(sqlite_store, tmp_path, monkeypatch):
    """A teacher whose every update writes `(empty)` (whatever it read) is measured at 1.0 and refused at a
    limit of 0.5; one that writes a note passes at 0.0."""
    from helpers import register_policy
    from job_fixtures import eval_config

    from agentmem.backends.scripted import ScriptedBackend
    from agentmem.jobs import teacher_check

    tok = tiny_tokenizer()
    teacher = register_policy(sqlite_store, save_tiny(tmp_path / "teacher"), "tiny")

    def scripted(update: str):
        return lambda *a, **k: ScriptedBackend(
            tok, lambda p: "blue" if "Reply with the short answer" in tok.decode(p) else update)

    monkeypatch.setattr(teacher_check.model_refs, "backend", scripted("(empty)"))
    with pytest.raises(ConfigError, match="empty memory on 100% of its updates made after a fact was read"):
        teacher_check.check_teacher(sqlite_store, teacher, eval_config(), max_forgot=0.5)
    report = teacher_check.check_teacher(sqlite_store, teacher, eval_config())
    assert report.empty_after_evidence == 1.0 and "(empty) after evidence 1.00" in report.line()
    monkeypatch.setattr(teacher_check.model_refs, "backend", scripted("Ann lives in Oslo."))
    assert teacher_check.check_teacher(sqlite_store, teacher, eval_config(), max_forgot=0.5).empty_after_evidence == 0.0


def test_teacher_check_under_the_privileged_prompt_measures_eos_on_what_the_teacher_read(sqlite_store, tmp_path,
                                                                                      monkeypatch):
    """A privileged teacher is validated under its own prompt (``context`` privileged): every call is sampled with
    the splice, and the first-token EOS mass is that of the splice + prompt, not of the prompt alone."""
    from helpers import register_policy
    from job_fixtures import eval_config
    from transformers import AutoModelForCausalLM

    from agentmem.backends.scripted import ScriptedBackend
    from agentmem.jobs import teacher_check
    from agentmem.records import SamplingContext

    tok = tiny_tokenizer()
    folder = save_tiny(tmp_path / "teacher")
    teacher = register_policy(sqlite_store, folder, "tiny")
    monkeypatch.setattr(teacher_check.model_refs, "backend", lambda *a, **k: ScriptedBackend(
        tok, lambda p: "blue" if "Reply with the short answer" in tok.decode(p) else "Ann lives in Oslo."))
    report = teacher_check.check_teacher(sqlite_store, teacher,
                                         eval_config().model_copy(update={"context": SamplingContext.privileged}))
    with sqlite_store.session() as s:
        calls = list(repo.stream_invocations(s, run_ids=[report.eval_run_id]))
    assert calls and all(c.privileged_ids is not None and len(c.privileged_ids) > 0 for c in calls)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    read = first_token_eos(model, [(str(c.kind), c.sampled_prompt_ids.tolist()) for c in calls], tok.eos_token_id)
    plain = first_token_eos(model, [(str(c.kind), c.prompt_ids.tolist()) for c in calls], tok.eos_token_id)
    assert report.eos_first_by_kind.keys() == read.keys()
    for kind, value in read.items():
        assert report.eos_first_by_kind[kind] == pytest.approx(value, abs=1e-6)
        assert abs(plain[kind] - value) > 1e-6  # the splice changes what the teacher predicts

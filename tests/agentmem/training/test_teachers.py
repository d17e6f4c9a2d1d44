"""Teacher sources: the online teacher equals a direct per-invocation pass under each context; top-K shards
with K = vocabulary give the same distributions (at the score's temperature too); stored per-token scores
feed the sampled-token estimator and are refused when missing or taken at another temperature."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import SYNTH, register_policy, user_content

from agentmem.agent.prompts import SYSTEM
from agentmem.backends.transformers_backend import TransformersBackend
from agentmem.config import (
    AgentConfig,
    DistillConfig,
    RolloutConfig,
    ScoreConfig,
    TeacherSourceKind,
    TeacherTruncation,
)
from agentmem.errors import TrainingError
from agentmem.jobs.distill import run_distill
from agentmem.jobs.rollout import run_rollout
from agentmem.jobs.score import run_score
from agentmem.records import TeacherContext
from agentmem.replay import ReplayError
from agentmem.testing.tiny_models import tiny_llama, tiny_tokenizer
from agentmem.training.scoring import LoadedModel
from agentmem.training.selection import Selection, select, teacher_sequences
from agentmem.training.teachers import OnlineTeacher, ShardTeacher, StoredScoresTeacher
from agentmem.training.trainer import Models

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def teacher_model():
    return tiny_llama(seed=1)


@pytest.fixture
def rolled(sqlite_store, teacher_model):
    tok = tiny_tokenizer()
    config = RolloutConfig(model="tiny", episodes=2, group_size=2, chunk_tokens=48, env_knobs=SYNTH,
                           agent=AgentConfig(memory_tokens=8, answer_max_new_tokens=4, temperature=1.0, seed=7))
    policy = register_policy(sqlite_store, "/models/tiny", "tiny")
    result = run_rollout(sqlite_store, config, backend=TransformersBackend.from_model(teacher_model, tok), policy=policy)
    return sqlite_store, result.run_id, policy


def direct_logits(model, seq) -> torch.Tensor:
    ids = torch.from_numpy(seq.input_ids.astype(np.int64))[None]
    with torch.no_grad():
        return model(ids, use_cache=False).logits[0][torch.from_numpy(seq.action_mask)].float()


@pytest.mark.parametrize("context", [TeacherContext.aligned, TeacherContext.persistent])
def test_online_teacher_equals_direct_passes(rolled, teacher_model, context):
    store, run_id, _ = rolled
    selection = select(store, [run_id])
    teacher = OnlineTeacher.for_selection(teacher_model, tiny_tokenizer(), "t", selection, context, row_tokens=4096)
    ids = selection.ids[:5]
    got = teacher.targets(ids)
    assert got.full_vocab and set(got.values) == set(ids) and got.truncated_calls == 0
    for seq in teacher_sequences(selection, context)[:5]:
        torch.testing.assert_close(got.values[seq.invocation_id], direct_logits(teacher_model, seq),
                                   atol=1e-4, rtol=0)


def test_online_teacher_cuts_from_the_left_only_when_asked(rolled, teacher_model):
    store, run_id, _ = rolled
    selection = select(store, [run_id])
    seqs = teacher_sequences(selection, TeacherContext.persistent)
    budget = max(len(s) for s in seqs) - 3
    over = [s for s in seqs if len(s) > budget]
    kw = dict(row_tokens=budget)
    cut = OnlineTeacher.for_selection(teacher_model, tiny_tokenizer(), "t", selection, TeacherContext.persistent,
                                      truncation=TeacherTruncation.left, **kw)
    got = cut.targets(selection.ids)
    assert got.truncated_calls == len(over) and got.truncated_tokens == sum(len(s) - budget for s in over)
    refuse = OnlineTeacher.for_selection(teacher_model, tiny_tokenizer(), "t", selection, TeacherContext.persistent,
                                         **kw)
    with pytest.raises(Exception, match=f"invocation {over[0].invocation_id}: {len(over[0])} tokens"):
        refuse.targets(selection.ids)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_full_vocabulary_shards_equal_the_online_teacher(rolled, teacher_model, tmp_path, temperature):
    store, run_id, _ = rolled
    tok = tiny_tokenizer()
    run_score(store, ScoreConfig(run_ids=[run_id], topk=len(tok), topk_dir=str(tmp_path), temperature=temperature),
              teacher=LoadedModel(teacher_model, tok, "t-full"))
    selection = select(store, [run_id])
    shards = ShardTeacher.from_store(store, "t-full", TeacherContext.aligned, selection.ids, len(tok))
    online = OnlineTeacher.for_selection(teacher_model, tok, "t", selection, TeacherContext.aligned, row_tokens=4096)
    a, b = shards.targets(selection.ids), online.targets(selection.ids)
    for inv_id in selection.ids:  # equal distributions at any distillation temperature
        for t in (1.0, 0.5):
            torch.testing.assert_close(torch.log_softmax(a.values[inv_id] / t, -1),
                                       torch.log_softmax(b.values[inv_id] / t, -1), atol=2e-4, rtol=0)
    with pytest.raises(TrainingError, match="run `agentmem score --topk K` first"):
        ShardTeacher.from_store(store, "other", TeacherContext.aligned, selection.ids, len(tok))


def test_stored_scores_teacher(rolled, teacher_model):
    store, run_id, _ = rolled
    tok = tiny_tokenizer()
    selection = select(store, [run_id])
    missing = StoredScoresTeacher(store, "t", TeacherContext.aligned)
    with pytest.raises(TrainingError, match="has no stored score for teacher 't'"):
        missing.targets(selection.ids)
    run_score(store, ScoreConfig(run_ids=[run_id]), teacher=LoadedModel(teacher_model, tok, "t"))
    got = missing.targets(selection.ids)
    assert not got.full_vocab
    online = OnlineTeacher.for_selection(teacher_model, tok, "t", selection, TeacherContext.aligned, row_tokens=4096)
    for inv in selection.invocations:
        lp = torch.log_softmax(online.targets([inv.id]).values[inv.id], -1)
        expected = lp.gather(-1, torch.from_numpy(inv.output_ids.astype(np.int64))[:, None])[:, 0]
        torch.testing.assert_close(got.values[inv.id], expected, atol=1e-4, rtol=0)
    with pytest.raises(TrainingError, match="temperature 1.0, distillation uses 2.0"):
        StoredScoresTeacher(store, "t", TeacherContext.aligned, temperature=2.0).targets(selection.ids)


def test_distill_from_stored_scores_of_the_student_itself_is_zero(rolled, teacher_model, tmp_path):
    """Teacher == student, aligned, T = 1: the sampled-token estimate of KL is 0 at the first step."""
    store, run_id, policy = rolled
    tok = tiny_tokenizer()
    run_score(store, ScoreConfig(run_ids=[run_id]), teacher=LoadedModel(teacher_model, tok, "self"))
    cfg = DistillConfig(run_ids=[run_id], out=str(tmp_path), teacher=dict(model="self", source=TeacherSourceKind.scores), rl=dict(kind="none"), optim=dict(steps=2, lr=1e-3), batch=dict(invocations_per_step=4))
    student = tiny_llama(seed=1).train()
    result = run_distill(store, cfg, models=Models(student, tok, policy, teacher_name="self"))
    first, second = result.history
    assert first.kd_loss == pytest.approx(0.0, abs=1e-5) and first.metrics["grad_norm"] < 1e-4
    assert np.isfinite(second.kd_loss)


# -- persistent_chat: the faithful full-history baseline ---------------------------------------------


def test_persistent_chat_renders_one_well_formed_conversation(rolled):
    """Call t's teacher context is exactly the chat template's rendering of [system, user_0, assistant_0, ...,
    user_t] + generation prompt (tokenised without added special tokens), followed by call t's stored
    output ids, which are the actions, unchanged, at the end; the system prompt appears once."""
    store, run_id, _ = rolled
    tok = tiny_tokenizer()
    selection = select(store, [run_id])
    seqs = {s.invocation_id: s for s in teacher_sequences(selection, TeacherContext.persistent_chat, tok)}
    by_episode: dict[str, list] = {}
    for inv in selection.invocations:
        by_episode.setdefault(inv.episode_id, []).append(inv)
    system = tok.apply_chat_template([{"role": "system", "content": SYSTEM}], tokenize=False)
    for calls in by_episode.values():
        assert [c.step for c in calls] == list(range(len(calls))) and len(calls) >= 3
        for t, inv in enumerate(calls):
            messages = [{"role": "system", "content": SYSTEM}]
            for h in calls[:t]:
                messages += [{"role": "user", "content": user_content(h)},
                             {"role": "assistant", "content": h.output_text}]
            messages.append({"role": "user", "content": user_content(inv)})
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            expected = tok(text, add_special_tokens=False)["input_ids"] + inv.output_ids.tolist()
            seq = seqs[inv.id]
            assert seq.input_ids.tolist() == expected
            assert seq.action_ids.tolist() == inv.output_ids.tolist()
            o = inv.output_tokens
            assert seq.input_ids[len(seq) - o:].tolist() == inv.output_ids.tolist()  # the actions close the row
            assert np.flatnonzero(seq.action_mask).tolist() == list(range(len(seq) - o - 1, len(seq) - 1))
            assert text.count(system.strip()) == 1 and text.count("<|im_start|>user") == t + 1
            assert text.count("<|im_start|>assistant") == t + 1  # t replies + the generation prompt
    first = selection.invocations[0]  # a first call reads exactly what the student read
    assert seqs[first.id].input_ids.tolist() == first.prompt_ids.tolist() + first.output_ids.tolist()


def test_persistent_chat_truncation_is_counted(rolled, teacher_model):
    """Teacher contexts over the row budget are cut from the left and counted as for `persistent` (the
    same packing path), by the online teacher and in what `agentmem score` reports; without
    --teacher-truncation left they are refused naming the call."""
    store, run_id, _ = rolled
    tok = tiny_tokenizer()
    selection = select(store, [run_id])
    seqs = teacher_sequences(selection, TeacherContext.persistent_chat, tok)
    student = {s.invocation_id: len(s) for s in teacher_sequences(selection, TeacherContext.aligned)}
    budget = max(student.values()) + 8
    over = [s for s in seqs if len(s) > budget]
    assert over
    cut = OnlineTeacher.for_selection(teacher_model, tok, "t", selection, TeacherContext.persistent_chat,
                                      row_tokens=budget, truncation=TeacherTruncation.left)
    got = cut.targets(selection.ids)
    assert got.truncated_calls == len(over) and got.truncated_tokens == sum(len(s) - budget for s in over)
    assert all(got.values[i].shape[0] == inv.output_tokens for i, inv in zip(selection.ids, selection.invocations,
                                                                            strict=True))
    refuse = OnlineTeacher.for_selection(teacher_model, tok, "t", selection, TeacherContext.persistent_chat,
                                         row_tokens=budget)
    with pytest.raises(Exception, match=f"invocation {over[0].invocation_id}: {len(over[0])} tokens"):
        refuse.targets(selection.ids)
    scored = run_score(store, ScoreConfig(run_ids=[run_id], context=TeacherContext.persistent_chat, row_tokens=budget,
                                          teacher_truncation=TeacherTruncation.left),
                       teacher=LoadedModel(teacher_model, tok, "t-chat"))
    assert scored.scored == len(seqs) and scored.teacher_truncated_calls == len(over)  # what `score` prints


def test_persistent_chat_refuses_a_prompt_the_template_did_not_render(rolled):
    store, run_id, _ = rolled
    selection = select(store, [run_id])
    first = selection.invocations[0]
    broken = Selection([type(first).model_validate(first.model_dump() | {"prompt_text": "plain text, no chat turns"})],
                       selection.episodes)
    with pytest.raises(TrainingError, match=f"invocation {first.id}: its stored prompt_text is not one"):
        teacher_sequences(broken, TeacherContext.persistent_chat, tiny_tokenizer())
    with pytest.raises(ReplayError, match="teacher context 'persistent_chat' needs the teacher's tokenizer"):
        teacher_sequences(selection, TeacherContext.persistent_chat)

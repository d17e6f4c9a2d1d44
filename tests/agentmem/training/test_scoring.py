"""Teacher scoring: stored per-token scores equal a direct per-invocation computation under each
teacher context; resumable; top-K shards; vocabulary checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import SYNTH, register_policy, user_content
from model_helpers import direct_logprobs
from safetensors.torch import load_file
from transformers import PreTrainedTokenizerFast

from agentmem.agent.prompts import SYSTEM
from agentmem.backends.transformers_backend import TransformersBackend
from agentmem.config import AgentConfig, RolloutConfig, ScoreConfig, TeacherTruncation
from agentmem.jobs.rollout import run_rollout
from agentmem.jobs.score import run_score
from agentmem.records import TeacherContext
from agentmem.replay.privileged import hint_ids, privileged_ids
from agentmem.testing.tiny_models import tiny_llama, tiny_qwen2, tiny_tokenizer
from agentmem.training.scoring import LoadedModel
from store import repository as repo


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=1)


@pytest.fixture
def rolled(sqlite_store, model):
    tok = tiny_tokenizer()
    config = RolloutConfig(model="tiny", episodes=2, group_size=2, chunk_tokens=48, env_knobs=SYNTH,
                           agent=AgentConfig(memory_tokens=10, answer_max_new_tokens=5, temperature=1.0, seed=5))
    policy = register_policy(sqlite_store, "/models/tiny", "tiny")
    result = run_rollout(sqlite_store, config, backend=TransformersBackend.from_model(model, tok), policy=policy)
    return sqlite_store, result.run_id


def scores_of(store, run_id, teacher, context):
    with store.session() as s:
        invs = list(repo.stream_invocations(s, run_ids=[run_id]))
        eps = {e.id: e for e in repo.list_episodes(s, run_id)}
        got = repo.get_teacher_scores(s, [i.id for i in invs], teacher, context)
    return invs, eps, got


@pytest.mark.parametrize("context", list(TeacherContext))
def test_scores_equal_direct_computation(rolled, model, context):
    store, run_id = rolled
    tok = tiny_tokenizer()
    teacher = LoadedModel(model, tok, "tiny-teacher")
    result = run_score(store, ScoreConfig(run_ids=[run_id], context=context, row_tokens=4096), teacher=teacher,
                       student=LoadedModel(model, tok, "tiny-student"))
    invs, eps, got = scores_of(store, run_id, "tiny-teacher", context)
    assert result.scored == len(invs) == len(got)
    history: dict[str, list] = {}
    for inv in invs:
        if context is TeacherContext.aligned:
            ctx = inv.prompt_ids
        elif context is TeacherContext.persistent:
            earlier = history.setdefault(inv.episode_id, [])
            ctx = np.concatenate([*[a for h in earlier for a in (h.prompt_ids, h.output_ids)], inv.prompt_ids])
            earlier.append(inv)
        elif context is TeacherContext.persistent_chat:  # one chat: system once, earlier turns and replies
            earlier = history.setdefault(inv.episode_id, [])
            messages = [{"role": "system", "content": SYSTEM}]
            for h in earlier:
                messages += [{"role": "user", "content": user_content(h)},
                             {"role": "assistant", "content": h.output_text}]
            messages.append({"role": "user", "content": user_content(inv)})
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            ctx = np.asarray(tok(text, add_special_tokens=False)["input_ids"])
            earlier.append(inv)
        elif context is TeacherContext.hint:  # each memory update's hint line, nothing before an answer call
            ctx = np.concatenate([hint_ids(tok, eps[inv.episode_id].evidence, inv.chunk_text), inv.prompt_ids])
        else:
            ctx = np.concatenate([privileged_ids(tok, eps[inv.episode_id]), inv.prompt_ids])
        expected = direct_logprobs(model, ctx, inv.output_ids)
        score = got[inv.id]
        np.testing.assert_allclose(score.token_logprobs, expected, atol=1e-4)
        assert score.entropy.shape == expected.shape and (score.entropy >= 0).all()
        if context is TeacherContext.aligned:  # same model, T = 1: the student's distribution is the teacher's
            np.testing.assert_allclose(score.reverse_kl, 0.0, atol=1e-5)
        else:
            assert (score.reverse_kl >= -1e-6).all()


def test_resumable_and_topk(rolled, model, tmp_path):
    store, run_id = rolled
    tok = tiny_tokenizer()
    teacher = LoadedModel(model, tok, "t")
    config = ScoreConfig(run_ids=[run_id], topk=5, topk_dir=str(tmp_path), row_tokens=512)
    first = run_score(store, config, teacher=teacher)
    again = run_score(store, config, teacher=teacher)
    assert first.scored > 0 and again.scored == 0 and again.skipped == first.scored
    assert 0 < first.fill <= 1
    invs, _, got = scores_of(store, run_id, "t", TeacherContext.aligned)
    inv = invs[0]
    shard = load_file(got[inv.id].topk_path)
    ids = torch.tensor(np.concatenate([inv.prompt_ids, inv.output_ids]), dtype=torch.long)[None]
    with torch.no_grad():
        logp = torch.log_softmax(model(ids, use_cache=False).logits[0].float(), -1)[len(inv.prompt_ids) - 1 : -1]
    values, indices = logp.topk(5, -1)
    torch.testing.assert_close(shard[f"{inv.id}.logprobs"], values, atol=1e-4, rtol=0)
    assert torch.equal(shard[f"{inv.id}.indices"].long(), indices)
    assert got[inv.id].reverse_kl.size == 0  # no student given


def test_padded_embedding_is_cut_and_vocab_mismatch_is_an_error(rolled):
    store, run_id = rolled
    tok = tiny_tokenizer()
    padded = tiny_qwen2(vocab_size=len(tok) + 16)  # an output layer padded past the tokenizer
    result = run_score(store, ScoreConfig(run_ids=[run_id]), teacher=LoadedModel(padded, tok, "padded"))
    assert result.scored > 0
    other = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, eos_token="<|im_end|>")
    other.add_tokens(["<extra_token>"])
    with pytest.raises(ValueError, match="vocabularies differ"):
        run_score(store, ScoreConfig(run_ids=[run_id]), teacher=LoadedModel(padded, tok, "x"),
                  student=LoadedModel(padded, other, "y"))
    with pytest.raises(Exception, match="no run with id 'nopenope'"):
        run_score(store, ScoreConfig(run_ids=["nopenope"]), teacher=LoadedModel(padded, tok, "x"))


def test_temperature_applies_to_both_distributions_and_is_stored(rolled, model):
    """One convention: every stored quantity at ScoreConfig.temperature for teacher and student alike."""
    store, run_id = rolled
    tok = tiny_tokenizer()
    other = tiny_llama(seed=4)
    run_score(store, ScoreConfig(run_ids=[run_id], temperature=2.0), teacher=LoadedModel(model, tok, "t2"),
              student=LoadedModel(other, tok, "s"))
    invs, _, got = scores_of(store, run_id, "t2", TeacherContext.aligned)
    for inv in invs[:4]:
        ids = torch.tensor(np.concatenate([inv.prompt_ids, inv.output_ids]), dtype=torch.long)[None]
        with torch.no_grad():
            t = model(ids, use_cache=False).logits[0, len(inv.prompt_ids) - 1 : -1].float() / 2
            s = other(ids, use_cache=False).logits[0, len(inv.prompt_ids) - 1 : -1].float() / 2
        t_lp, s_lp = torch.log_softmax(t, -1), torch.log_softmax(s, -1)
        score = got[inv.id]
        assert score.temperature == 2.0
        np.testing.assert_allclose(score.token_logprobs,
                                   t_lp.gather(-1, torch.from_numpy(inv.output_ids.astype(np.int64))[:, None])[:, 0],
                                   atol=1e-4)
        np.testing.assert_allclose(score.reverse_kl, (s_lp.exp() * (s_lp - t_lp)).sum(-1), atol=1e-4)


def test_teacher_truncation_is_counted_in_the_result(rolled, model):
    store, run_id = rolled
    tok = tiny_tokenizer()
    config = ScoreConfig(run_ids=[run_id], context=TeacherContext.persistent, row_tokens=64)
    with pytest.raises(Exception, match="exceed the row budget of 64"):
        run_score(store, config, teacher=LoadedModel(model, tok, "cut"))
    result = run_score(store, config.model_copy(update={"teacher_truncation": TeacherTruncation.left}),
                       teacher=LoadedModel(model, tok, "cut"))
    assert result.teacher_truncated_calls >= 1 and result.teacher_truncated_tokens >= result.teacher_truncated_calls

"""Shared-prefix prefill in the transformers backend: same tokens and log-probs as the plain path."""

from __future__ import annotations

import pytest
import torch
from model_helpers import MEMORIES, chat, fresh_logprobs

from agentmem.backends import SamplingParams, TransformersBackend
from agentmem.backends.transformers_backend import (
    MIN_SHARED_PREFIX,
    plan_shared_prefixes,
    shared_prefix_groups,
)
from agentmem.records import FinishReason
from agentmem.testing.tiny_models import tiny_llama, tiny_qwen2, tiny_tokenizer

TASKS = [
    ("where does Bob live?", "The capital of France is Paris. Alice was born in Lyon and works in Berlin."),
    ("where was Alice born?", "Bob lives in Oslo. Alice works in Berlin. The capital of France is Paris."),
]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def siblings(tok):
    """Two tasks x G = 4: the siblings of a task differ only in their memory (the last part)."""
    return [chat(tok, q, c, m) for q, c in TASKS for m in MEMORIES]


@pytest.fixture(scope="module")
def mixed(tok, siblings):
    """The siblings interleaved with unrelated prompts, one short and one longer than any suffix."""
    lone = [tok.encode("Hi"), tok.encode("Question: where does Bob live? Memory: Bob lives in Oslo.")]
    return [siblings[0], lone[0], *siblings[1:6], lone[1], *siblings[6:]]


def backends(model, tok):
    return (TransformersBackend.from_model(model, tok, share_prefix=True),
            TransformersBackend.from_model(model, tok, share_prefix=False))


def assert_same(shared, plain):
    for got, want in zip(shared, plain, strict=True):
        assert got.output_ids == want.output_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5, rel=0)
        assert got.finish_reason is want.finish_reason


def test_the_prompts_share_long_prefixes(siblings):
    groups = [(rows, n) for rows, n in shared_prefix_groups(siblings, MIN_SHARED_PREFIX) if len(rows) > 1]
    # one group per task (not one group of all eight on the shorter common system prompt)
    assert [rows for rows, _ in groups] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    for rows, n in groups:
        assert n >= 0.7 * max(len(siblings[r]) for r in rows)
        assert all(siblings[r][:n] == siblings[rows[0]][:n] for r in rows)


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_greedy_shared_equals_unshared(make, attn, tok, mixed):
    shared, plain = backends(make(attn=attn), tok)
    params = SamplingParams(temperature=0, max_new_tokens=12)
    got = shared.generate(mixed, params)
    assert shared.last_stats.shared_groups == 2
    assert_same(got, plain.generate(mixed, params))


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
def test_sampled_logprobs_equal_a_fresh_forward(make, tok, mixed):
    model = make()
    shared, plain = backends(model, tok)
    params = SamplingParams(temperature=0.8, max_new_tokens=16, seed=5)
    gens = shared.generate(mixed, params)
    assert shared.last_stats.shared_groups == 2
    for prompt, gen in zip(mixed, gens, strict=True):
        ref = fresh_logprobs(model, prompt, gen.output_ids, 0.8)
        assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=1e-4, rtol=0)
    # rows keep their order, so the shared generator is drawn in the same order as without sharing
    assert [g.output_ids for g in gens] == [g.output_ids for g in plain.generate(mixed, params)]
    assert [g.output_ids for g in gens] == [g.output_ids for g in shared.generate(mixed, params)]


def test_counters_count_each_prefix_once(tok, siblings):
    shared, plain = backends(tiny_llama(), tok)
    params = SamplingParams(temperature=0, max_new_tokens=2)
    head = _common(siblings)  # the system turn and the question's first words: computed once, then kept
    assert head >= MIN_SHARED_PREFIX
    groups = shared_prefix_groups([p[head:] for p in siblings], MIN_SHARED_PREFIX)
    total = sum(map(len, siblings))
    once = head + sum(n for _, n in groups) + sum(len(siblings[r]) - head - n for rows, n in groups for r in rows)
    shared.generate(siblings, params)
    last = shared.last_stats
    assert (last.calls, last.prompts, last.shared_groups, last.head_reused) == (1, 8, 2, 0)
    assert (last.prefill_tokens_total, last.prefill_tokens_computed) == (total, once)
    shared.generate(siblings, params)  # the same prompts again: the head comes from the first call
    assert (shared.last_stats.prefill_tokens_computed, shared.last_stats.head_reused) == (once - head, 1)
    assert last.prefill_tokens_computed < total / 2
    plain.generate(siblings, params)
    assert (plain.last_stats.prefill_tokens_total, plain.last_stats.prefill_tokens_computed) == (total, total)
    assert plain.last_stats.prefill_tokens_padded == 8 * max(map(len, siblings))
    assert last.prefill_tokens_padded < plain.last_stats.prefill_tokens_padded
    # nothing shared (no common prefix of MIN_SHARED_PREFIX tokens): the plain path, whatever the flag
    lone = [tok.encode(chunk) for _, chunk in TASKS]
    shared.generate(lone, params)
    assert shared.last_stats.shared_groups == 0
    assert shared.last_stats.prefill_tokens_computed == shared.last_stats.prefill_tokens_total
    assert shared.stats.calls == 3 and shared.stats.head_reused == 1
    assert shared.stats.prefill_tokens_total == 2 * total + sum(map(len, lone))
    # G = 1 across tasks still shares what all prompts have in common (system prompt, question head): the kept head
    shared.generate(siblings[::4], params)
    assert shared.last_stats.head_reused == 1
    computed = sum(len(p) for p in siblings[::4]) - 2 * _common(siblings[::4])
    assert shared.last_stats.prefill_tokens_computed == computed


def _common(prompts):
    n = 0
    while all(len(p) > n + 1 and p[n] == prompts[0][n] for p in prompts):
        n += 1
    return n


def test_eos_and_max_new_tokens_as_before(tok, mixed):
    model = tiny_llama()
    params = SamplingParams(temperature=0, max_new_tokens=8)
    free = TransformersBackend.from_model(model, tok).generate(mixed, params)
    # Make one sibling's third greedy token an eos id: rows producing it stop there and leave the batch.
    stop_token = free[2].output_ids[2]
    model.generation_config.eos_token_id = [tok.eos_token_id, stop_token]
    shared, plain = backends(model, tok)
    got = shared.generate(mixed, params)
    assert_same(got, plain.generate(mixed, params))
    for gen, before in zip(got, free, strict=True):
        if stop_token in before.output_ids:
            assert gen.output_ids == before.output_ids[: before.output_ids.index(stop_token) + 1]
            assert gen.finish_reason is FinishReason.stop
        else:
            assert gen.output_ids == before.output_ids and gen.finish_reason is FinishReason.length
    assert {g.finish_reason for g in got} == {FinishReason.stop, FinishReason.length}
    for budget in (1, 3):
        short = shared.generate(mixed, SamplingParams(temperature=0, max_new_tokens=budget))
        assert shared.last_stats.shared_groups == 2
        assert_same(short, plain.generate(mixed, SamplingParams(temperature=0, max_new_tokens=budget)))
        assert all(len(g.output_ids) <= budget for g in short)


def test_identical_and_nested_prompts(tok, siblings):
    base = siblings[0]
    prompts = [base, base, base[:40], base + tok.encode(" Paris"), base, base[:40]]
    plan = plan_shared_prefixes(prompts)
    assert plan is not None
    assert all(0 < k < len(p) for p, k in zip(prompts, plan.split, strict=True))  # a suffix is never empty
    model = tiny_qwen2()
    shared, plain = backends(model, tok)
    for params in (SamplingParams(temperature=0, max_new_tokens=6),
                   SamplingParams(temperature=1.0, max_new_tokens=6, seed=2)):
        got = shared.generate(prompts, params)
        assert shared.last_stats.shared_groups >= 1
        assert_same(got, plain.generate(prompts, params))
        for prompt, gen in zip(prompts, got, strict=True):
            ref = fresh_logprobs(model, prompt, gen.output_ids, params.temperature)
            assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=1e-4, rtol=0)
    greedy = shared.generate(prompts, SamplingParams(temperature=0, max_new_tokens=6))
    assert greedy[0].output_ids == greedy[1].output_ids == greedy[4].output_ids
    assert greedy[2].output_ids == greedy[5].output_ids


def test_plan_only_shares_long_enough_prefixes():
    head = list(range(100, 100 + MIN_SHARED_PREFIX - 1))
    short = [head + [1, 2, 3], head + [4, 5, 6], head + [7, 8, 9]]
    assert plan_shared_prefixes(short) is None  # 15 common tokens: below the minimum
    assert plan_shared_prefixes([[1, 2, 3], [4, 5], [6]]) is None
    head = list(range(100, 140))
    long = [[7, *head, 1, 2], [7, *head, 3], [5, 6]]
    plan = plan_shared_prefixes(long)
    assert plan is not None and plan.groups == 1
    assert plan.prefixes == [[7, *head]] and plan.source == [0, 0, -1] and plan.split == [41, 41, 0]
    # sharing 16 tokens of 200 saves less than a tenth of the padded prefill: not worth a second pass
    assert plan_shared_prefixes([[*head[:16], *range(k, k + 184)] for k in (1000, 2000)]) is None
    assert plan_shared_prefixes([[*head[:16], *range(k, k + 24)] for k in (1000, 2000)]) is not None


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_a_kept_head_serves_later_calls_as_the_plain_path_would(make, attn, tok, siblings):
    model = make(attn=attn)
    shared, plain = backends(model, tok)
    head = _common(siblings)
    # the first call keeps its four prompts' common prefix (question and chunk); the second shares only the system
    # turn with it; the third parts ways three tokens before even that ends
    parted = [siblings[0][: head - 3] + tok.encode(f"{i} other question? Memory: none") for i in range(3)]
    assert head - 3 >= MIN_SHARED_PREFIX and _common(parted) < head
    for params in (SamplingParams(temperature=0, max_new_tokens=8),
                   SamplingParams(temperature=0.9, max_new_tokens=8, seed=3)):
        for prompts, reused in ((siblings[:4], None), (siblings[4:], 1), (parted, 1), (siblings[::4], 1)):
            got = shared.generate(prompts, params)
            if reused is not None:
                assert shared.last_stats.head_reused == reused
            assert_same(got, plain.generate(prompts, params))
            for prompt, gen in zip(prompts, got, strict=True):
                ref = fresh_logprobs(model, prompt, gen.output_ids, params.temperature)
                assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=1e-4, rtol=0)


def test_a_weight_change_makes_a_new_head(tok, siblings):
    """A trainer samples from its live weights: after an in-place update the kept head is stale and not used."""
    model = tiny_llama()
    shared, plain = backends(model, tok)
    params = SamplingParams(temperature=0, max_new_tokens=6)
    shared.generate(siblings[:4], params)
    before = shared.generate(siblings[4:], params)
    assert shared.last_stats.head_reused == 1
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.mul_(3.0)  # what an optimiser step does: in place
    got = shared.generate(siblings[4:], params)
    assert shared.last_stats.head_reused == 0
    assert shared.last_stats.prefill_tokens_computed > 0
    assert_same(got, plain.generate(siblings[4:], params))
    assert [g.logprobs for g in got] != [g.logprobs for g in before]  # the change reaches the outputs
    shared.generate(siblings[:4], params)
    assert shared.last_stats.head_reused == 1
    model.model.layers[1].mlp.up_proj.weight = torch.nn.Parameter(model.model.layers[1].mlp.up_proj.weight * 2)
    got = shared.generate(siblings[:4], params)  # a replaced parameter: a new storage
    assert shared.last_stats.head_reused == 0
    assert_same(got, plain.generate(siblings[:4], params))

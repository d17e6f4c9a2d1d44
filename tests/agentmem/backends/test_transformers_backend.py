"""Generation backends: batching under left padding, log-prob semantics, sampling, stopping."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from agentmem.backends import Generation, SamplingParams, ScriptedBackend, TransformersBackend
from agentmem.backends.transformers_backend import sample
from agentmem.backends.vllm_backend import VLLMBackend
from agentmem.records import FinishReason
from agentmem.testing.tiny_models import tiny_llama, tiny_qwen2, tiny_tokenizer

TEXTS = [
    "Question: where does Bob live?",
    "Hi",
    "The capital of France is Paris. Alice was born in Lyon and works in Berlin.",
    "Update the memory",
]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok.encode(t) for t in TEXTS]


@pytest.fixture(scope="module")
def backend(tok):
    return TransformersBackend.from_model(tiny_llama(), tok)


def reference_logprobs(model, prompt, output, temperature):
    """log_softmax(logits / T) of each output token from one unpadded fp32 forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logp.gather(-1, torch.tensor(output)[:, None]).squeeze(-1)


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_batched_greedy_equals_one_at_a_time(make, attn, tok, prompts):
    backend = TransformersBackend.from_model(make(attn=attn), tok)
    params = SamplingParams(temperature=0, max_new_tokens=10)
    batched = backend.generate(prompts, params)
    for prompt, got in zip(prompts, batched, strict=True):
        alone = backend.generate([prompt], params)[0]
        assert got.output_ids == alone.output_ids
        assert got.logprobs == pytest.approx(alone.logprobs, abs=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0, 1.5])
def test_logprobs_are_full_vocab_tempered(temperature, backend, prompts):
    gens = backend.generate(prompts, SamplingParams(temperature=temperature, max_new_tokens=12, seed=3))
    for prompt, gen in zip(prompts, gens, strict=True):
        assert len(gen.output_ids) == len(gen.logprobs) > 0
        ref = reference_logprobs(backend.model, prompt, gen.output_ids, temperature)
        assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=1e-3)


def test_top_p_restricts_sampling_but_not_the_logprob(backend, prompts):
    temperature, top_p = 0.8, 0.3
    gens = backend.generate(
        prompts, SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=16, seed=0)
    )
    renormalised_differs = False
    for prompt, gen in zip(prompts, gens, strict=True):
        ids = torch.tensor([prompt + gen.output_ids])
        with torch.no_grad():
            logits = backend.model(ids).logits[0, len(prompt) - 1 : -1].float()
        logp = torch.log_softmax(logits / temperature, dim=-1)
        for pos, token in enumerate(gen.output_ids):
            probs, order = logp[pos].exp().sort(descending=True)
            nucleus = order[(probs.cumsum(0) - probs) < top_p].tolist()
            assert token in nucleus
            assert gen.logprobs[pos] == pytest.approx(logp[pos, token].item(), abs=1e-3)
            mass = logp[pos, nucleus].exp().sum().item()
            renormalised_differs |= mass < 0.99
    assert renormalised_differs  # the check above would catch a nucleus-renormalised log-prob


def test_sample_top_p_keeps_the_most_likely_token():
    """Even a top_p that rounds to 0 in float32 (5e-324 failed with "invalid multinomial distribution")."""
    logits = torch.tensor([[5.0, 1.0, 0.0, -1.0]])
    for seed in range(5):
        for top_p in (0.01, 5e-324):
            tokens, _ = sample(
                logits, SamplingParams(temperature=1.0, top_p=top_p), torch.Generator().manual_seed(seed)
            )
            assert tokens.item() == 0


def test_seeded_sampling_is_reproducible(backend, prompts):
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7)
    first = backend.generate(prompts, params)
    again = backend.generate(prompts, params)
    other = backend.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=12, seed=8))
    assert [g.output_ids for g in first] == [g.output_ids for g in again]
    assert [g.logprobs for g in first] == [g.logprobs for g in again]
    assert [g.output_ids for g in first] != [g.output_ids for g in other]


def test_finish_reasons_and_eos_included(tok, prompts):
    model = tiny_llama()
    probe = TransformersBackend.from_model(model, tok)
    params = SamplingParams(temperature=0, max_new_tokens=8)
    free = probe.generate(prompts, params)
    # Make prompt 1's first greedy token an extra eos id of the generation config: that row finishes
    # at once and leaves the batch, the others must go on unaffected to max_new_tokens.
    stop_token = free[1].output_ids[0]
    model.generation_config.eos_token_id = [tok.eos_token_id, stop_token]
    backend = TransformersBackend.from_model(model, tok)
    assert backend.stop_ids == {tok.eos_token_id, stop_token}
    gens = backend.generate(prompts, params)
    for prompt, got, before in zip(prompts, gens, free, strict=True):
        if stop_token in before.output_ids:
            cut = before.output_ids.index(stop_token) + 1
            assert got.output_ids == before.output_ids[:cut]  # eos is kept, nothing after it
            assert got.finish_reason is FinishReason.stop
        else:
            assert got.output_ids == before.output_ids
            assert got.finish_reason is FinishReason.length
            assert len(got.output_ids) == params.max_new_tokens
        assert got.output_ids == backend.generate([prompt], params)[0].output_ids  # rows pruned correctly
        assert got.latency_s > 0
    assert {g.finish_reason for g in gens} == {FinishReason.stop, FinishReason.length}


def test_empty_and_invalid_inputs(backend):
    assert backend.generate([], SamplingParams()) == []
    with pytest.raises(ValueError):
        backend.generate([[]], SamplingParams())
    for bad in (dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(max_new_tokens=0)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_scripted_backend(tok):
    backend = ScriptedBackend(tok, ["Paris", "Bob lives in Oslo"])
    gens = backend.generate([[1, 2], [3]], SamplingParams(max_new_tokens=64))
    assert [tok.decode(g.output_ids, skip_special_tokens=True) for g in gens] == [
        "Paris",
        "Bob lives in Oslo",
    ]
    assert all(g.output_ids[-1] == tok.eos_token_id and g.finish_reason is FinishReason.stop for g in gens)
    assert all(g.logprobs == [0.0] * len(g.output_ids) for g in gens)
    assert backend.seen_prompts == [[1, 2], [3]]
    with pytest.raises(IndexError):
        backend.generate([[4]], SamplingParams())

    echo = ScriptedBackend(tok, lambda prompt: tok.decode(prompt))
    (gen,) = echo.generate([tok.encode("Alice was born in Lyon")], SamplingParams(max_new_tokens=2))
    assert isinstance(gen, Generation) and len(gen.output_ids) == 2
    assert gen.finish_reason is FinishReason.length


class FakeLLM:
    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def get_tokenizer(self):
        return None


def test_vllm_engine_turns_on_prefix_caching(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM))
    default = VLLMBackend("/models/x").llm.kwargs
    assert default["enable_prefix_caching"] is True
    assert default["logprobs_mode"] == "processed_logprobs" and default["model"] == "/models/x"
    off = VLLMBackend("/models/x", enable_prefix_caching=False, max_model_len=512).llm.kwargs
    assert off["enable_prefix_caching"] is False and off["max_model_len"] == 512

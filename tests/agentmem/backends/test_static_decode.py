"""The static-cache decode step: same greedy ids and log-probs as the generic transformers step, rows
leave the cache as they finish, fused weights follow in-place updates, unsupported models fall back."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model_helpers import fresh_logprobs, sample_prompts
from transformers import GPT2Config, GPT2LMHeadModel, MistralConfig, MistralForCausalLM

from agentmem.backends import SamplingParams, TransformersBackend
from agentmem.backends.static_decode import Linear, StaticDecoder, unsupported_reason
from agentmem.records import FinishReason
from agentmem.testing.tiny_models import tiny_llama, tiny_llama_vllm, tiny_qwen2, tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def prompts(tok):
    return sample_prompts(tok)


def pair(model, tok, **kw):
    return (TransformersBackend.from_model(model, tok, **kw),
            TransformersBackend.from_model(model, tok, static_decode=False, **kw))


def assert_same(got, want, atol=1e-5):
    for g, w in zip(got, want, strict=True):
        assert g.output_ids == w.output_ids
        assert g.logprobs == pytest.approx(w.logprobs, abs=atol, rel=0)
        assert g.finish_reason is w.finish_reason


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("share_prefix", [True, False])
def test_greedy_equals_the_generic_step(make, attn, share_prefix, tok, prompts):
    static, generic = pair(make(attn=attn), tok, share_prefix=share_prefix)
    assert static.decode_path == "static" and generic.decode_path == "generic (turned off)"
    params = SamplingParams(temperature=0, max_new_tokens=24)
    got = static.generate(prompts, params)
    assert static.last_stats.shared_groups == (1 if share_prefix else 0)
    assert_same(got, generic.generate(prompts, params))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_power_of_two_scale_rides_on_the_rotary_bitwise(dtype, tok, prompts):
    """head_dim 64: the softmax scale 1/8 is folded into the queries' rotary factors; the step's logits
    equal, bit for bit, those of the same step with the scale applied to the scores (head_dim 8 in the
    other tests takes that path: 1/sqrt(8) is not a power of two)."""
    from transformers import DynamicCache

    model = tiny_llama_vllm().to(dtype)
    ids = torch.tensor([prompts[1][:40], prompts[2][:40]])
    mask = torch.ones_like(ids)
    logits = []
    with torch.inference_mode():
        for fold in (True, False):
            cache = DynamicCache()
            out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
            dec = StaticDecoder(model)
            assert dec._scale_in_rotary == 0.125
            if not fold:
                dec._scale_in_rotary = None
            dec.start(cache, mask, 4)
            tokens, pos, steps = out.logits[:, -1].argmax(-1), torch.tensor([40, 40]), []
            for _ in range(4):
                steps.append(dec.step(tokens, pos))
                tokens, pos = steps[-1].argmax(-1), pos + 1
            logits.append(torch.stack(steps))
    assert torch.equal(logits[0], logits[1])


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_sampled_logprobs_equal_a_fresh_forward(make, temperature, tok, prompts):
    model = make()
    static, generic = pair(model, tok)
    params = SamplingParams(temperature=temperature, max_new_tokens=20, seed=11)
    gens = static.generate(prompts, params)
    for prompt, gen in zip(prompts, gens, strict=True):
        ref = fresh_logprobs(model, prompt, gen.output_ids, temperature)
        assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=1e-5, rtol=0)
    assert [g.output_ids for g in gens] == [g.output_ids for g in generic.generate(prompts, params)]


def test_finished_rows_leave_the_cache(tok, prompts, monkeypatch):
    model = tiny_llama()
    params = SamplingParams(temperature=0, max_new_tokens=10)
    free = TransformersBackend.from_model(model, tok).generate(prompts, params)
    # Make two rows' early greedy tokens eos ids: those rows stop there, the others decode on.
    stops = {free[0].output_ids[1], free[5].output_ids[3]}
    model.generation_config.eos_token_id = [tok.eos_token_id, *stops]
    static, generic = pair(model, tok)
    widths = []
    original = StaticDecoder.step

    def spy(self, tokens, positions):
        widths.append((len(tokens), self.keys.shape[1]))
        return original(self, tokens, positions)

    monkeypatch.setattr(StaticDecoder, "step", spy)
    got = static.generate(prompts, params)
    assert_same(got, generic.generate(prompts, params))
    finished = [i for i, g in enumerate(got) if g.finish_reason is FinishReason.stop]
    assert finished and len(finished) < len(prompts)
    assert all(n == rows for n, rows in widths)  # the cache always holds exactly the live rows
    # step s decodes exactly the rows that produce an (s+1)-th token
    assert [n for n, _ in widths] == [sum(len(g.output_ids) > s for g in got) for s in range(1, 10)]
    assert widths[-1][0] < len(prompts)
    timing = static.last_timing
    assert timing.decode_tokens == sum(len(g.output_ids) - 1 for g in got) and timing.decode_s > 0


def test_in_place_weight_updates_reach_the_fused_weights(tok, prompts):
    model = tiny_qwen2()
    static, generic = pair(model, tok)
    params = SamplingParams(temperature=0, max_new_tokens=12)
    before = static.generate(prompts, params)
    assert static.decoder.packs == 1 and static.decoder.pack_seconds > 0
    static.generate(prompts, params)
    assert static.decoder.packs == 1  # unchanged weights are not rebuilt
    with torch.no_grad():  # an optimiser step: in-place updates of the live parameters
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
    after = static.generate(prompts, params)
    assert static.decoder.packs == 2
    assert_same(after, generic.generate(prompts, params), atol=1e-4)  # stale weights: off by O(1)
    assert [g.output_ids for g in after] != [g.output_ids for g in before]


def tiny_gpt2(tok):
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=512,
                     eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return GPT2LMHeadModel(cfg).eval()


def tiny_mistral_sliding(tok):
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return MistralForCausalLM(cfg).eval()


def test_unsupported_models_take_the_generic_step(tok, prompts):
    for make, reason in ((tiny_gpt2, "model type 'gpt2'"), (tiny_mistral_sliding, "sliding-window")):
        model = make(tok)
        assert reason in unsupported_reason(model)
        backend = TransformersBackend.from_model(model, tok)
        assert backend.decoder is None and backend.decode_path.startswith("generic (")
        with pytest.raises(ValueError, match="does not support"):
            StaticDecoder(model)
        gens = backend.generate(prompts[:3], SamplingParams(temperature=0, max_new_tokens=5))
        assert all(len(g.output_ids) == 5 for g in gens)
    assert unsupported_reason(tiny_llama()) is None and unsupported_reason(tiny_qwen2()) is None


@pytest.mark.parametrize("rows", [1, 3, 8, 33])
def test_packed_linear_equals_f_linear(rows):
    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(96, 40, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(rows, 40, generator=gen)
    for b in (None, bias):
        lin = Linear(weight, b)
        assert lin.kind in ("mkl", "plain")
        assert torch.allclose(lin(x), F.linear(x, weight, b), atol=1e-5, rtol=1e-5)
    low = Linear(weight.bfloat16(), None)
    assert torch.allclose(low(x.bfloat16()).float(), F.linear(x.bfloat16(), weight.bfloat16()).float(),
                          atol=5e-2, rtol=2e-2)


def test_bf16_static_step_follows_a_fresh_bf16_forward(tok, prompts):
    model = tiny_llama().to(torch.bfloat16)
    backend = TransformersBackend.from_model(model, tok)
    gens = backend.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=12, seed=3))
    for prompt, gen in zip(prompts, gens, strict=True):
        ref = fresh_logprobs(model, prompt, gen.output_ids, 1.0)
        assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=0.1, rtol=0)

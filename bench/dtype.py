"""bf16 against fp32 on this CPU, for each job's hot loop, measured in one run.

The project's earlier figures disagreed (one measured bf16 at 1.6x fp32 for a single 2048-token forward;
the rollout benchmark measured it slower for 8 x 300 prefills). This measures, on the default model
(SmolLM2-135M-Instruct, the prepared folder), with the same inputs in both dtypes:

  score   teacher scoring: one packed row of ``--tokens`` tokens (512-token calls), logits at actions only
  train   a distill step's student forward + backward on the same row
  prefill rollout prefill: 8 prompts x 300 tokens, one left-padded batch
  decode  rollout decode: 8 rows, ``--steps`` steps with the KV cache after a 64-token prompt

and, for score and train, **mixed precision** (``DistillConfig.mixed_precision``): the float32 weights with the
decoder under bfloat16 autocast and the head in float32, what ``distill --mixed-precision`` runs.

Each figure is the best of ``--repeats`` interleaved rounds (the CPU may be shared). The last line is
``score_bf16_vs_fp32=<r> train_bf16_vs_fp32=<r> prefill_bf16_vs_fp32=<r> decode_bf16_vs_fp32=<r>
score_mixed_vs_fp32=<r> train_mixed_vs_fp32=<r>`` (above 1: faster than float32).

  python -m bench.dtype --threads 1
  python -m bench.dtype --smoke     # every phase on a tiny random model, in seconds; numbers mean nothing
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from agentmem.backends.model_files import load_model, prepare_default_model
from agentmem.records import Invocation
from agentmem.replay import pack, rebuild_aligned
from agentmem.training.collate import collate_rows
from agentmem.training.packed_attention import action_logits
from bench.common.tiny import tiny_model


def row(vocab: int, tokens: int):
    """One packed row of ``tokens`` tokens: calls of 512 tokens (452 prompt + 60 sampled)."""
    rng = np.random.default_rng(0)
    invs = [Invocation(id=f"i{k}", episode_id="e", step=k, kind="memory_update",
                       prompt_ids=rng.integers(0, vocab, 452), output_ids=rng.integers(0, vocab, 60),
                       output_logprobs=np.zeros(60)) for k in range(tokens // 512)]
    rows, _ = pack([rebuild_aligned(i) for i in invs], tokens)
    return collate_rows(rows[:1], 0)


def timed(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=2048, help="tokens of the scored / trained row (x512)")
    ap.add_argument("--steps", type=int, default=32, help="decode steps")
    ap.add_argument("--model", default=None, help="model folder (default: the prepared default model)")
    ap.add_argument("--smoke", action="store_true", help="a tiny random model, one short round: checks every phase")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.smoke:
        args.tokens, args.steps, args.repeats = 512, 2, 1
        args.model = args.model or tiny_model(Path(tempfile.mkdtemp(prefix="dtype-smoke-")))
    folder = args.model or prepare_default_model()
    models = {d: load_model(folder, dtype=d)[0] for d in ("float32", "bfloat16")}
    vocab = models["float32"].config.vocab_size
    batch = row(vocab, args.tokens)
    rng = np.random.default_rng(1)
    prompts = torch.tensor(rng.integers(0, vocab, (8, 300)), dtype=torch.long)
    mask = torch.ones_like(prompts)

    def score(m, mixed=False):
        with torch.inference_mode():
            action_logits(m, batch, "fast", mixed)

    def train(m, mixed=False):
        m.requires_grad_(True)
        logits = action_logits(m, batch, "fast", mixed)
        logits.float().logsumexp(-1).mean().backward()
        m.zero_grad(set_to_none=True)
        m.requires_grad_(False)

    def prefill(m):
        with torch.inference_mode():
            m(input_ids=prompts, attention_mask=mask, use_cache=True, logits_to_keep=1)

    def decode(m):
        with torch.inference_mode():
            out = m(input_ids=prompts[:, :64], attention_mask=mask[:, :64], use_cache=True, logits_to_keep=1)
            cache, am = out.past_key_values, mask[:, :64]
            tok = out.logits[:, -1].argmax(-1)
            for step in range(args.steps):
                am = torch.cat([am, am.new_ones((8, 1))], -1)
                out = m(input_ids=tok[:, None], attention_mask=am, past_key_values=cache, use_cache=True,
                        position_ids=torch.full((8, 1), 64 + step))
                cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1)

    work = {"score": (score, args.tokens), "train": (train, args.tokens), "prefill": (prefill, 8 * 300),
            "decode": (decode, 8 * args.steps)}
    # how each variant runs a piece of work; mixed only where a training job runs it (scoring and the step)
    variants = {"float32": lambda fn: fn(models["float32"]), "bfloat16": lambda fn: fn(models["bfloat16"]),
                "mixed": lambda fn: fn(models["float32"], True)}

    def runs(name: str) -> list[str]:
        return [v for v in variants if v != "mixed" or name in ("score", "train")]

    def call(fn, v: str) -> None:
        variants[v](fn)

    results: dict[str, dict[str, float]] = {k: {} for k in work}
    for name, (fn, _tokens) in work.items():  # warm-up of every shape and dtype
        for v in runs(name):
            t0 = time.perf_counter()
            call(fn, v)
            print(f"warm-up {name} {v}: {time.perf_counter() - t0:.2f}s", flush=True)
    for _ in range(args.repeats):  # interleaved rounds: a busy neighbour hits every variant alike
        for name, (fn, _tokens) in work.items():
            for v in runs(name):
                results[name][v] = min(results[name].get(v, float("inf")),
                                       timed(lambda fn=fn, v=v: call(fn, v), 1))
    print(f"{'tiny model (smoke)' if args.smoke else folder}, {args.threads} thread(s), best of {args.repeats}")
    print(f"{'work':<9}{'tokens':>8}{'fp32 s':>9}{'bf16 s':>9}{'mixed s':>9}{'fp32 tok/s':>12}{'bf16 tok/s':>12}"
          f"{'bf16/fp32':>11}{'mixed/fp32':>12}")
    ratios, mixed_ratios = {}, {}
    for name, (_fn, tokens) in work.items():
        f, b, x = results[name]["float32"], results[name]["bfloat16"], results[name].get("mixed")
        ratios[name] = f / b
        if x is not None:
            mixed_ratios[name] = f / x
        print(f"{name:<9}{tokens:>8}{f:>9.3f}{b:>9.3f}{x if x is not None else float('nan'):>9.3f}{tokens / f:>12.0f}"
              f"{tokens / b:>12.0f}{f / b:>11.2f}{f / x if x is not None else float('nan'):>12.2f}")
    print(" ".join([f"{k}_bf16_vs_fp32={v:.2f}" for k, v in ratios.items()]
                   + [f"{k}_mixed_vs_fp32={v:.2f}" for k, v in mixed_ratios.items()]))


if __name__ == "__main__":
    main()

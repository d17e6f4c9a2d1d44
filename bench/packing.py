"""Packed vs padded teacher scoring on the SmolLM2-135M shape (random init, no download).

Workload: the teacher-scoring forward (no grad) of memory-agent invocations, logits at action positions
only for every method, so the methods differ only in how tokens are batched:
  padded      batches of 8 in arrival order, right-padded, 2-D padding mask (the usual HF batch)
  padded-full the same, but the usual ``model(...).logits`` at every position (the naive scorer; shown
              to price the action-only head, not part of the headline ratio)
  packed-fast packed rows, flattened, per-segment SDPA (agentmem_segments: the CPU default kernel)
  packed-flex the same rows, compiled FlexAttention with the rows' BlockMask (agentmem_flex; compiled
              in a warm-up pass before the timed rounds, so compile time is not counted)
  packed-ref  packed rows, 4-D block-diagonal float mask over each padded row
  one-by-one  one invocation per forward, no padding, no mask
All lengths are packed (that packing's fill is the reported fill). The packed paths are timed on a
seeded sample of whole rows (the partially filled last row excluded); padded and one-by-one on
consecutive invocations in arrival order from a seeded start, about as many tokens. (Padding the rows'
own invocations would flatter padding: best-fit decreasing groups similar lengths.)
The CPU may be shared, so methods run in interleaved rounds (order rotated) and each keeps its fastest
(wall) round; ``cores`` is that round's CPU time over wall time: near ``--threads`` means it ran
undisturbed, well below means other processes took the cores and the figure is pessimistic.

  python -m bench.packing --quick            # 10 layers: 3-5 minutes on 2 shared cores
  python -m bench.packing                    # 30 layers: 8-12 minutes
  python -m bench.packing --lengths rollout_lengths.json   # [[prompt, output], ...]
  python -m bench.packing --smoke            # every method on a 1-layer, small-vocabulary model: seconds

The last line is ``packed_vs_padded=<tokens/s ratio> fill=<packing fill> flex_vs_sdpa=<packed-flex over
packed-fast tokens/s>``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentmem.records import Invocation, InvocationKind
from agentmem.replay import Sequence, pack, rebuild_aligned
from agentmem.training.collate import collate_rows
from agentmem.training.packed_attention import Kernel, action_logits, attention_kernel

VOCAB = 49152


def synth_lengths(n: int, seed: int) -> list[tuple[int, int]]:
    """Memory-agent calls: prompts 300-700 tokens (question + memory + chunk), outputs 30-200 (skewed)."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(300, 701, n)
    outputs = np.clip(rng.lognormal(np.log(80), 0.5, n), 30, 200).astype(int)
    return list(zip(prompts.tolist(), outputs.tolist(), strict=True))


def load_lengths(path: Path) -> list[tuple[int, int]]:
    """``[[prompt, output], ...]`` or ``[{"prompt_tokens": p, "output_tokens": o}, ...]``."""
    data = json.loads(path.read_text())
    return [(d["prompt_tokens"], d["output_tokens"]) if isinstance(d, dict) else (d[0], d[1]) for d in data]


def invocations(lengths: list[tuple[int, int]], seed: int, vocab: int = VOCAB) -> list[Invocation]:
    rng = np.random.default_rng(seed)
    return [
        Invocation(id=f"inv{i:05d}", episode_id=f"ep{i // 8}", step=i % 8, kind=InvocationKind.memory_update,
                   prompt_ids=rng.integers(0, vocab, p), output_ids=rng.integers(0, vocab, o),
                   output_logprobs=np.zeros(o))
        for i, (p, o) in enumerate(lengths)
    ]


def smollm2_135m_shape(layers: int, dtype: torch.dtype, vocab: int = VOCAB) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                      num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                      max_position_embeddings=8192, rope_theta=100000.0)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval().to(dtype)


def score_padded(model, seqs: list[Sequence], batch_size: int, full_logits: bool = False) -> None:
    for start in range(0, len(seqs), batch_size):
        batch = seqs[start : start + batch_size]
        width = max(len(s) for s in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        keep = torch.zeros(len(batch), width, dtype=torch.long)
        acts = torch.zeros(len(batch), width, dtype=torch.bool)
        for b, s in enumerate(batch):
            ids[b, : len(s)] = torch.from_numpy(s.input_ids)
            keep[b, : len(s)] = 1
            acts[b, : len(s)] = torch.from_numpy(s.action_mask)
        if full_logits:
            model(input_ids=ids, attention_mask=keep, use_cache=False).logits[acts]
            continue
        hidden = model.get_decoder()(input_ids=ids, attention_mask=keep, use_cache=False).last_hidden_state
        model.get_output_embeddings()(hidden[acts])


def score_single(model, seqs: list[Sequence]) -> None:
    for s in seqs:
        ids = torch.from_numpy(s.input_ids.astype(np.int64))[None]
        hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[0]
        model.get_output_embeddings()(hidden[torch.from_numpy(s.action_mask)])


def score_packed(model, batches, path: str, kernel: Kernel = "sdpa") -> None:
    with attention_kernel(kernel):
        for batch in batches:
            action_logits(model, batch, path)


def timed(fn) -> tuple[float, float]:
    """(CPU seconds of this process, wall seconds)."""
    cpu, wall = time.process_time(), time.perf_counter()
    with torch.inference_mode():
        fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=Path, help="JSON list of [prompt_tokens, output_tokens] per invocation")
    ap.add_argument("--invocations", type=int, default=512, help="synthetic invocations to pack (fill)")
    ap.add_argument("--row-tokens", type=int, default=8192,
                    help="8192: fill 0.988 on the synthetic lengths, 4096: 0.977 (no item is under 360 tokens)")
    ap.add_argument("--timed-rows", type=int, default=1, help="packed rows to time")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best one counts")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="float32: faster than bfloat16 in one probe here (109 vs 87 tokens/s, on a busy CPU)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--quick", action="store_true",
                    help="10 layers instead of 30 (per-token ratios barely depend on depth): 3-5 minutes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true",
                    help="1 layer, a 1024-token vocabulary, 12 calls, one round: checks that every method runs")
    args = ap.parse_args()
    vocab = VOCAB
    if args.quick:
        args.layers = 10
    if args.smoke:
        args.layers, args.invocations, args.row_tokens, args.rounds, args.timed_rows = 1, 12, 2048, 1, 1
        args.threads, vocab = 1, 1024
    torch.set_num_threads(args.threads)

    lengths = load_lengths(args.lengths) if args.lengths else synth_lengths(args.invocations, args.seed)
    seqs = [rebuild_aligned(inv) for inv in invocations(lengths, args.seed, vocab)]
    rows, stats = pack(seqs, args.row_tokens, over_budget="left")
    rng = np.random.default_rng(args.seed)
    full = max(len(rows) - 1, 1)
    chosen = sorted(rng.choice(full, size=min(args.timed_rows, full), replace=False).tolist())
    timed_rows = [rows[i] for i in chosen]
    tokens = {"packed": sum(len(r) for r in timed_rows)}
    start = int(rng.integers(0, len(seqs)))
    stream = seqs[start:] + seqs[:start]
    count = int(np.searchsorted(np.cumsum([len(s) for s in stream]), tokens["packed"])) + 1
    arrival = stream[: -(-count // args.batch_size) * args.batch_size]  # whole batches
    tokens["arrival"] = sum(len(s) for s in arrival)
    batches = [collate_rows([r], pad_id=0) for r in timed_rows]
    padded_slots = sum(
        len(arrival[i : i + args.batch_size]) * max(len(s) for s in arrival[i : i + args.batch_size])
        for i in range(0, len(arrival), args.batch_size)
    )
    print(f"packing: {stats.sequences} invocations, {stats.tokens} tokens -> {stats.rows} rows of "
          f"{args.row_tokens}, fill {stats.fill:.4f}, truncated {stats.truncated_sequences}")
    print(f"timed: {len(timed_rows)} rows ({tokens['packed']} tokens); {len(arrival)} invocations in arrival order "
          f"({tokens['arrival']} tokens); model: "
          f"SmolLM2-135M shape, {args.layers} layers, {args.dtype}, sdpa, {args.threads} threads, forward only")

    model = smollm2_135m_shape(args.layers, getattr(torch, args.dtype), vocab)
    timed(lambda: score_single(model, arrival[:1]))  # warm-up
    compile_s = timed(lambda: score_packed(model, batches, "fast", "flex"))[1]  # compiles every shape bucket
    print(f"packed-flex warm-up (compiling its shape buckets): {compile_s:.1f} s")
    first = arrival[: args.batch_size]  # one-by-one is slow and only a reference point: one batch's worth
    row_fill = tokens["packed"] / (len(timed_rows) * args.row_tokens)
    methods = {  # name: (run, fill, real tokens)
        "padded": (lambda: score_padded(model, arrival, args.batch_size), tokens["arrival"] / padded_slots,
                   tokens["arrival"]),
        "padded-full": (lambda: score_padded(model, arrival, args.batch_size, full_logits=True),
                        tokens["arrival"] / padded_slots, tokens["arrival"]),
        "packed-fast": (lambda: score_packed(model, batches, "fast"), row_fill, tokens["packed"]),
        "packed-flex": (lambda: score_packed(model, batches, "fast", "flex"), row_fill, tokens["packed"]),
        "packed-ref": (lambda: score_packed(model, batches, "reference"), row_fill, tokens["packed"]),
        "one-by-one": (lambda: score_single(model, first), 1.0, sum(len(s) for s in first)),
    }
    best = dict.fromkeys(methods, (float("inf"), 1.0))  # (wall, cpu)
    for r in range(args.rounds):
        names = list(methods)[r % len(methods) :] + list(methods)[: r % len(methods)]
        for name in names:
            cpu, wall = timed(methods[name][0])
            best[name] = min(best[name], (wall, cpu))
        print(f"round {r + 1}/{args.rounds} (best wall s): " + ", ".join(f"{k} {v[0]:.1f}" for k, v in best.items()),
              flush=True)
    rate = {name: methods[name][2] / wall for name, (wall, _) in best.items()}
    print(f"{'method':<12} {'wall s':>7} {'cores':>5} {'tokens/s':>9} {'fill':>6} {'vs padded':>9}")
    for name, (_, fill, _) in methods.items():
        wall, cpu = best[name]
        print(f"{name:<12} {wall:7.2f} {cpu / wall:5.2f} {rate[name]:9.1f} {fill:6.3f} {rate[name] / rate['padded']:8.2f}x")
    print(f"packed_vs_padded={rate['packed-fast'] / rate['padded']:.3f} fill={stats.fill:.4f} "
          f"flex_vs_sdpa={rate['packed-flex'] / rate['packed-fast']:.3f}")


if __name__ == "__main__":
    main()

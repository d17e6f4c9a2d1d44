"""Throughput of TransformersBackend: tokens/s by dtype, torch threads and batch size.

Each prompt is ~300 tokens (a chat-templated memory-update style request); each row decodes exactly
``--new-tokens`` tokens (eos is ignored for the measurement, so every configuration does the same
work). Reports generated tokens per second of wall time, prefill included, and the
process CPU seconds per generated token (robust to other processes sharing the cores: with one thread,
CPU time is what wall time would be on an idle core).

    OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 python -m bench.rollout_backends
    python -m bench.rollout_backends --smoke    # a tiny random model: every phase runs, in seconds
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from agentmem.backends import SamplingParams, TransformersBackend, resolve_model
from bench.common.tiny import tiny_model

CHUNK = (
    "Alice was born in Lyon in 1984 and moved to Berlin in 2010, where she worked as a nurse at the "
    "Charite hospital. Her brother Bob lives in Oslo and teaches mathematics. "
)


def make_prompt(tokenizer, target: int, salt: int) -> list[int]:
    body = f"Note {salt}. " + CHUNK * 20
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Question: where does Bob live?\nMemory: none\nChunk: {body}"}],
        add_generation_prompt=True,
        return_dict=False,
    )
    return ids[:target]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="model folder (default: the prepared default model)")
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--smoke", action="store_true", help="a tiny random model, 4 new tokens, batches 1 and 2")
    args = parser.parse_args()
    if args.smoke:
        args.prompt_tokens, args.new_tokens, args.dtypes, args.threads, args.batches = 40, 4, "float32", "1", "1,2"
        args.model = args.model or tiny_model(Path(tempfile.mkdtemp(prefix="backends-smoke-")))
    model = resolve_model(args.model)
    print(f"model {model}, prompt {args.prompt_tokens} tokens, {args.new_tokens} new tokens per row")
    print(
        f"{'dtype':>9} {'threads':>7} {'batch':>5} {'seconds':>8} {'tok/s':>7} {'ms/step':>8} {'cpu ms/tok':>10}"
    )
    for dtype in args.dtypes.split(","):
        backend = TransformersBackend(str(model), dtype=dtype)
        backend.stop_ids = set()  # decode the full budget in every row
        params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=0)
        for threads in map(int, args.threads.split(",")):
            torch.set_num_threads(threads)
            for batch in map(int, args.batches.split(",")):
                prompts = [make_prompt(backend.tokenizer, args.prompt_tokens, i) for i in range(batch)]
                backend.generate(prompts[:1], SamplingParams(max_new_tokens=4))  # warm-up
                start, cpu_start = time.perf_counter(), time.process_time()
                gens = backend.generate(prompts, params)
                elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
                tokens = sum(len(g.output_ids) for g in gens)
                print(
                    f"{dtype:>9} {threads:>7} {batch:>5} {elapsed:>8.2f} {tokens / elapsed:>7.1f} "
                    f"{1000 * elapsed / args.new_tokens:>8.1f} {1000 * cpu / tokens:>10.1f}"
                )


if __name__ == "__main__":
    main()

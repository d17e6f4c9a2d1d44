"""SFT speed: seconds of ``agentmem sft`` per 10k action tokens, fp32 against bf16, on the default model.

A throwaway SQLite store gets an oracle rollout of the synthetic environment (``policy: oracle``: outputs
written from each task's evidence and gold answer, no model runs; the default model's tokenizer and chat
template make the prompts), then ``run_sft`` trains SmolLM2-135M-Instruct (full fine-tuning, or LoRA with
``--lora-rank``) on those calls, once per dtype, on the same steps. The figure is the steady state: the
summed ``train_steps.seconds`` of every step but the first (warm-up), over the action tokens of those
steps, scaled to 10k; model loading and the final checkpoint save are printed apart.

``--tokens`` sets how many action tokens a dtype trains on (10k by default); ``--max-steps`` caps the steps
for a short run (the per-10k figure is then extrapolated from the steps run). The last line is
``fp32_s=<s> bf16_s=<s> bf16_over_fp32=<r> fp32_tokens_s=<n> fp32_of_limit=<f> bf16_of_limit=<f>`` (seconds per
10k action tokens, r < 1: bf16 is faster; tokens read per second; the step's matmul FLOP/s, 6 x weights x tokens,
over a GEMM's on the decoder's shapes measured in the same process, ``gemm_peak``).

  python -m bench.sft_speed --threads 2                 # the full 10k tokens per dtype
  python -m bench.sft_speed --threads 2 --max-steps 4   # a short run
  python -m bench.sft_speed --max-steps 3 --profile 20  # and the second step's top 20 ops (left out of the figure)
  python -m bench.sft_speed --smoke                     # a tiny random model, 2 steps: every phase runs
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shutil
import tempfile
import time
from pathlib import Path

import torch

from agentmem.config import AgentConfig, DType, PolicySource, RolloutConfig, SftConfig
from agentmem.jobs.rollout import run_rollout
from agentmem.jobs.sft import run_sft
from agentmem.records import TrainStep
from agentmem.runtime import Runtime
from bench.common.tiny import tiny_model
from store import repository as repo
from store.engine import make_engine, open_store
from store.migrations import upgrade


def oracle_store(work: Path, episodes: int, chunk_tokens: int, level: int | None, model: str = "default"):
    """A store holding one oracle rollout; returns (store, run id, its stored calls)."""
    url = f"sqlite:///{work / 'sft_speed.db'}"
    upgrade(make_engine(url))
    store = open_store(url)
    knobs = {} if level is None else {"level": level}
    config = RolloutConfig(env="synthetic", env_knobs=knobs, policy=PolicySource.oracle, model=model,
                           episodes=episodes, chunk_tokens=chunk_tokens, agent=AgentConfig(temperature=0.0))
    result = run_rollout(store, config)
    with store.session() as s:
        calls = list(repo.stream_invocations(s, run_ids=[result.run_id]))
    return store, result.run_id, calls


def gemm_peak(dtype: torch.dtype, tokens: int = 2048, d: int = 576, ff: int = 1536, repeats: int = 20) -> float:
    """FLOP/s of this process's matmuls on the decoder's own shapes ([tokens, d] @ [d, ff], SmolLM2-135M's MLP),
    best of ``repeats``: the ceiling a training step's matmuls can reach here, measured beside the step (on a
    shared machine both see the same load)."""
    a, b = torch.randn(tokens, d, dtype=dtype), torch.randn(d, ff, dtype=dtype)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * tokens * d * ff / best


def step_flops(model_path: str, tokens: float, actions: float) -> float:
    """FLOPs of one step's forward and backward: 6 x (weights but the embedding) x tokens read, plus 6 x the
    output head x action tokens (the head runs at the action positions only); attention's own is left out
    (rows of a few thousand tokens)."""
    from transformers import AutoConfig

    from agentmem.backends.model_files import resolve_model

    c = AutoConfig.from_pretrained(resolve_model(model_path))
    layer = 4 * c.hidden_size * c.hidden_size * (1 + c.num_key_value_heads / c.num_attention_heads) / 2 \
        + 3 * c.hidden_size * c.intermediate_size
    return 6 * c.num_hidden_layers * layer * tokens + 6 * c.hidden_size * c.vocab_size * actions


@contextlib.contextmanager
def step_profile(top: int, what: str):
    """With ``top`` > 0: ``torch.profiler`` over the second step (the first steady one; the caller calls the
    yielded function after each step), then its ``top`` ops by self CPU time, grouped by op name."""
    if top <= 0:
        yield lambda: None
        return
    from torch.profiler import ProfilerActivity, profile, schedule

    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True, acc_events=True,
                   schedule=schedule(wait=0, warmup=1, active=1))  # step 1 warms the profiler up
    prof.start()
    try:
        yield prof.step
    finally:
        prof.stop()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    print(f"profile of {what}: {total / 1e6:.2f} s of self CPU time over the ops; the top {top}:", flush=True)
    print(events.table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=48), flush=True)


def measure(store, run_id: str, dtype: DType, steps: int, args, work: Path, runtime: Runtime) -> dict:
    history: list[TrainStep] = []
    t0 = time.perf_counter()
    config = SftConfig(run_ids=[run_id], student=args.model, dtype=dtype, lora_rank=args.lora_rank, out=str(work / f"ckpt-{dtype}"), optim=dict(steps=steps, lr=1e-5), batch=dict(invocations_per_step=args.calls_per_step, row_tokens=args.row_tokens))
    with step_profile(args.profile if steps > 1 else 0, f"{dtype} step 2") as on_step:
        result = run_sft(store, config, runtime, on_step=lambda h: (history.append(h), on_step()))
    wall = time.perf_counter() - t0
    steady = [h for k, h in enumerate(history) if k > (1 if args.profile else 0)] or history  # not the profiled
    seconds, actions = sum(h.seconds for h in steady), sum(h.metrics["actions"] for h in steady)
    tokens = sum(h.tokens for h in steady)
    per_10k = seconds / actions * 10_000
    trained = sum(h.seconds for h in history)
    print(f"{dtype}: {len(history)} steps, {int(sum(h.metrics['actions'] for h in history))} action tokens "
          f"({tokens / max(actions, 1):.1f} tokens read per action token), steady {per_10k:.1f} s per 10k action "
          f"tokens; first step {history[0].seconds:.1f} s; load + save {wall - trained:.1f} s; "
          f"loss {history[0].loss:.3f} -> {history[-1].loss:.3f}", flush=True)
    flops = step_flops(args.model, tokens, actions) / seconds
    peak = gemm_peak(torch.float32 if dtype is DType.float32 else torch.bfloat16)
    print(f"{dtype}: {tokens / seconds:.0f} tokens/s read, {flops / 1e9:.1f} GFLOP/s of the step's matmuls against "
          f"{peak / 1e9:.1f} GFLOP/s of a {dtype} GEMM on the MLP's shapes here: {flops / peak:.0%} of the limit",
          flush=True)
    shutil.rmtree(Path(result.last_checkpoint.path).parent, ignore_errors=True)
    return {"per_10k": per_10k, "tokens_s": tokens / seconds, "fraction": flops / peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="default", help="student (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--tokens", type=int, default=10_000, help="action tokens to train on per dtype")
    ap.add_argument("--max-steps", type=int, default=None, help="cap the steps (a short run; extrapolated)")
    ap.add_argument("--calls-per-step", type=int, default=8)
    ap.add_argument("--row-tokens", type=int, default=4096)
    ap.add_argument("--chunk-tokens", type=int, default=512)
    ap.add_argument("--level", type=int, default=None, help="synthetic task ladder level (default: the env's)")
    ap.add_argument("--lora-rank", type=int, default=None)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--work", type=Path, default=None, help="folder for the store and checkpoints (default: temp)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="profile each dtype's second step (torch.profiler) and print its top N ops by self CPU time")
    ap.add_argument("--smoke", action="store_true", help="a tiny random model, 2 steps per dtype: every phase runs")
    args = ap.parse_args()
    runtime = Runtime.create(device="cpu", threads=1 if args.smoke else args.threads)
    work = args.work or Path(tempfile.mkdtemp(prefix="sft_speed-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        args.tokens, args.max_steps, args.calls_per_step, args.row_tokens, args.chunk_tokens, args.level = \
            100, 2, 2, 1024, 64, 0
        if args.model == "default":
            args.model = tiny_model(work)

    episodes = 8
    while True:  # enough stored calls that the steps draw ~--tokens action tokens without repeating an epoch
        folder = work / f"episodes-{episodes}"
        folder.mkdir(exist_ok=True)
        store, run_id, calls = oracle_store(folder, episodes, args.chunk_tokens, args.level, args.model)
        actions = sum(c.output_tokens for c in calls)
        if actions >= args.tokens or episodes >= 512:
            break
        episodes *= 2
    per_call = actions / len(calls)
    steps = math.ceil(args.tokens / (per_call * args.calls_per_step))
    prompt = sum(c.prompt_tokens for c in calls) / len(calls)
    print(f"oracle run {run_id}: {episodes} episodes, {len(calls)} calls, {actions} action tokens "
          f"({per_call:.1f} per call, {prompt:.0f} prompt tokens per call); {steps} steps of "
          f"{args.calls_per_step} calls make {args.tokens} action tokens"
          + (f"; running {args.max_steps}" if args.max_steps and args.max_steps < steps else ""), flush=True)
    steps = min(steps, args.max_steps or steps)
    torch.manual_seed(0)
    measured = {d: measure(store, run_id, DType(d), steps, args, work, runtime) for d in args.dtypes.split(",")}
    nan = {"per_10k": float("nan"), "tokens_s": float("nan"), "fraction": float("nan")}
    fp32, bf16 = measured.get("float32", nan), measured.get("bfloat16", nan)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print(f"fp32_s={fp32['per_10k']:.1f} bf16_s={bf16['per_10k']:.1f} "
          f"bf16_over_fp32={bf16['per_10k'] / fp32['per_10k']:.2f} fp32_tokens_s={fp32['tokens_s']:.0f} "
          f"fp32_of_limit={fp32['fraction']:.2f} bf16_of_limit={bf16['fraction']:.2f}")


if __name__ == "__main__":
    main()

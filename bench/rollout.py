"""Rollout and eval throughput through the real agent loop and store, side by side in one run: the
transformers backend's generic decode step ("old", float32: the jobs' default before the static step) and
its static-cache decode step ("new", in ``--dtype``; auto: the faster one measured on this CPU): a rollout
and a greedy eval at batch 8 on the same tasks by both, and a batch-1 rollout by the new one; plus the share of wall time spent
writing to the store. vLLM is measured too when it is importable (``--vllm``).

    python -m bench.rollout --quick            # 8 episodes, short contexts
    python -m bench.rollout --episodes 16
    python -m bench.rollout --smoke            # a tiny random model, 2 episodes: every phase runs, in seconds

Tokens/s counts generated tokens over the wall time of the whole rollout (prefill included). The last
line is exactly ``batch8_vs_batch1=<ratio> store_share=<fraction> new_vs_old_rollout_b8=<ratio>
new_vs_old_eval_b8=<ratio>`` (batch ratio and store share of the new batch-8 rollout; the last two are
wall-time speedups). Goals: batch 8 >= 3x batch 1; store time < 2% of wall time.
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

import torch

from agentmem import model_refs
from agentmem.backends.model_files import prepare_default_model
from agentmem.config import AgentConfig, EvalConfig, RolloutConfig
from agentmem.jobs.eval import run_eval
from agentmem.jobs.rollout import StoreSink, run_rollout
from agentmem.runtime import Runtime
from bench.common.tiny import tiny_model
from store.engine import open_store


class TimedSink(StoreSink):
    """The rollout's store writer, timing every write."""

    seconds = 0.0

    def invocations(self, invocations):
        t0 = time.perf_counter()
        super().invocations(invocations)
        self.seconds += time.perf_counter() - t0

    def episodes_finished(self, episodes):
        t0 = time.perf_counter()
        super().episodes_finished(episodes)
        self.seconds += time.perf_counter() - t0


def measure(label: str, backend_kind: str, dtype: str, model: str, batch: int, job: str, args, tmp: str) -> dict:
    store = open_store(f"sqlite:///{tmp}/bench-{label}-{job}-{batch}.db", create=True)
    knobs = {"context_tokens": args.context_tokens, "distractors": 2}
    agent = AgentConfig(memory_tokens=args.memory_tokens, answer_max_new_tokens=16,
                        temperature=1.0 if job == "rollout" else 0.0, max_batch=batch, seed=args.seed)
    cls = RolloutConfig if job == "rollout" else EvalConfig
    config = cls(env="synthetic", env_knobs=knobs, model=model, dtype=dtype, episodes=args.episodes,
                 chunk_tokens=args.chunk_tokens, seed=args.seed, agent=agent)
    runtime = Runtime.create("cpu", threads=args.threads)
    backend = model_refs.backend(backend_kind, model, dtype, runtime, static_decode=label != "old")
    policy = model_refs.register(store, model_refs.ModelRef(model, model, "SmolLM2-135M-Instruct"))
    sink = TimedSink(store)
    t0 = time.perf_counter()
    if job == "rollout":
        result = run_rollout(store, config, runtime, backend=backend, policy=policy, sink=sink)
        run_id = result.run_id
    else:
        run_id = run_eval(store, config, runtime, backend=backend, policy=policy).run_id
    wall = time.perf_counter() - t0
    with store.session() as s:
        from store import repository as repo

        invs = list(repo.stream_invocations(s, run_ids=[run_id]))
    out_tokens = sum(i.output_tokens for i in invs)
    prompt_tokens = sum(i.prompt_tokens for i in invs)
    return {"path": label, "dtype": dtype, "job": job, "batch": batch, "calls": len(invs), "prompt_tokens": prompt_tokens,
            "output_tokens": out_tokens, "wall": wall, "tps": out_tokens / wall, "store": sink.seconds / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 episodes, short contexts")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--context-tokens", type=int, default=512)
    ap.add_argument("--chunk-tokens", type=int, default=256)
    ap.add_argument("--memory-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="auto", help="dtype of the new path: auto, float32 or bfloat16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vllm", action="store_true", help="also measure the vLLM backend (if importable)")
    ap.add_argument("--smoke", action="store_true", help="a tiny random model, 2 short episodes: every phase runs")
    args = ap.parse_args()
    if args.quick:
        args.episodes, args.context_tokens = 8, 384
    if args.smoke:
        args.episodes, args.context_tokens, args.chunk_tokens, args.memory_tokens = 2, 160, 64, 8
    torch.set_num_threads(args.threads)
    model = tiny_model(Path(tempfile.mkdtemp(prefix="rollout-smoke-"))) if args.smoke else str(prepare_default_model())
    new_dtype = args.dtype
    if new_dtype == "auto":
        choice = model_refs.auto_dtype(None, model)
        print(f"--dtype auto: {choice.dtype} ({choice.reason})", flush=True)
        new_dtype = choice.dtype
    plan = [("old", "transformers", "float32"), ("new", "transformers", new_dtype)]
    if args.vllm and importlib.util.find_spec("vllm"):
        plan.append(("vllm", "vllm", new_dtype))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, kind, dtype in plan:
            # batch 1 only on the new path: the batch ratio is the new path's, and the old batch-1 rollout
            # alone takes minutes on a shared CPU
            for batch, job in ((1, "rollout"), (8, "rollout"), (8, "eval"))[label == "old":]:
                rows.append(measure(label, kind, dtype, model, batch, job, args, tmp))
                r = rows[-1]
                print(f"  done {label} {job} batch {batch}: {r['wall']:.1f}s", flush=True)
    print(f"{'tiny model (smoke)' if args.smoke else 'default model'}, {args.threads} thread(s), {args.episodes} synthetic episodes, "
          f"context {args.context_tokens} tokens, chunks {args.chunk_tokens}, memory {args.memory_tokens}")
    print(f"{'path':<6}{'dtype':>9}{'job':>8}{'batch':>6}{'calls':>7}{'prompt tok':>11}{'output tok':>11}"
          f"{'wall s':>8}{'out tok/s':>10}{'store %':>9}")
    for r in rows:
        print(f"{r['path']:<6}{r['dtype']:>9}{r['job']:>8}{r['batch']:>6}{r['calls']:>7}{r['prompt_tokens']:>11}"
              f"{r['output_tokens']:>11}{r['wall']:>8.1f}{r['tps']:>10.1f}{100 * r['store']:>9.3f}")

    def pick(label, job, batch):
        return next(r for r in rows if (r["path"], r["job"], r["batch"]) == (label, job, batch))

    b1, b8 = pick("new", "rollout", 1), pick("new", "rollout", 8)
    print(f"batch8_vs_batch1={b8['tps'] / b1['tps']:.2f} store_share={b8['store']:.4f} "
          f"new_vs_old_rollout_b8={pick('old', 'rollout', 8)['wall'] / b8['wall']:.2f} "
          f"new_vs_old_eval_b8={pick('old', 'eval', 8)['wall'] / pick('new', 'eval', 8)['wall']:.2f}")


if __name__ == "__main__":
    main()

"""The prompt-head cache of the transformers backend against the same backend without it, measured in one run.

Every prompt the agent sends begins with the same head: the chat template's system turn and the user turn's
first words (about 30 tokens with the default model's template). The backend keeps that head's keys and values across
calls (``TransformersBackend(keep_head=True)``, the default) and prefills only the rest of each prompt. This
benchmark builds calls as an evaluation makes them: one call per round over ``--tasks`` distinct held-out tasks
of the synthetic ladder (G = 1: the tasks share nothing but the head), with the real tokenizer:

  update   each task's first update call (chunk-first layout, empty memory, a chunk of ``--chunk-tokens``);
  answer   each task's answer call, its memory a span of the task's text around ``--memory`` tokens.

It times the prefill (``generate`` with one new token, greedy) with the head kept from an earlier call against
the backend with ``keep_head=False`` (its shared-prefix plan per call, as before), interleaved, best of
``--repeats``, one torch thread, and checks that both give the same first token and log-prob (to 1e-4 in
float32; bfloat16 may differ by round-off, reported as a count). Then a whole greedy evaluation (``run_eval``
of ``--tasks`` episodes at ``--level``, every call of every round, decoding included) with each backend,
interleaved, best of ``--repeats``: there the per-call plan often forms no group (one prompt whose question
starts with another word is left alone and the plan is dropped), and the kept head still serves.

    python -m bench.prompt_head                    # the default model, bfloat16 (the evaluations' dtype here)
    python -m bench.prompt_head --dtype float32
    python -m bench.prompt_head --smoke            # a tiny random model: every phase, seconds

``--batches 12,36`` (the default) also times, with nothing shared, distinct update prompts' prefill per row and the
decode per row-token (``--new-tokens`` greedy tokens, end-of-sequence ignored) at each batch size: whether one
batch of 36 (three held-out levels together) would cost less per episode than three of 12.

Last line: ``update_kept_vs_plain=<r> answer_kept_vs_plain=<r> eval_kept_vs_plain=<r> head_tokens=<n>``
(time ratios, > 1 is faster with the head kept).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from agentmem.agent.overwrite import OverwritePolicy, OverwriteState
from agentmem.agent.prompts import answer_prompt
from agentmem.backends.model_files import load_model, prepare_default_model
from agentmem.backends.transformers_backend import TransformersBackend
from agentmem.backends.types import SamplingParams
from agentmem.config import AgentConfig, DType, EvalConfig
from agentmem.jobs.eval import run_eval
from agentmem.model_refs import register, resolve
from agentmem.runtime import CPU
from bench.common.tiny import tiny_model
from envs import load_env
from store.engine import open_store


def calls(tok, tasks: int, chunk_tokens: int, memory: int, level: int, seed: int) -> dict[str, list[list[int]]]:
    """Per call kind, ``tasks`` prompts (token ids) of distinct held-out ladder tasks, as one evaluation round."""
    count = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    env = load_env("synthetic", seed=seed, chunk_tokens=chunk_tokens, count_tokens=count, level=level, names="heldout")
    policy = OverwritePolicy(tok, AgentConfig(memory_tokens=memory, prompt_layout="chunk-first"))
    rng = np.random.default_rng(seed)
    out: dict[str, list[list[int]]] = {"update": [], "answer": []}
    for task in env.tasks(tasks):
        out["update"].append(policy.next_call(OverwriteState("", 0), task).prompt.ids)
        text = tok(" ".join(task.chunks), add_special_tokens=False)["input_ids"]
        m = int(np.clip(rng.normal(memory * 0.8, memory * 0.15), 4, memory))
        lo = int(rng.integers(max(1, len(text) - m)))
        out["answer"].append(answer_prompt(tok, task.question, tok.decode(text[lo : lo + m]).strip()).ids)
    return out


def measure(kept: TransformersBackend, plain: TransformersBackend, prompts: list[list[int]], repeats: int,
            tol: float) -> dict:
    params = SamplingParams(temperature=0.0, max_new_tokens=1)
    times: dict[str, list[float]] = {"kept": [], "plain": []}
    for _ in range(repeats):  # interleaved rounds
        for name, backend in (("kept", kept), ("plain", plain)):
            t0 = time.perf_counter()
            gens = backend.generate(prompts, params)
            times[name].append(time.perf_counter() - t0)
            if name == "kept":
                stats, got = backend.last_stats, gens
            else:
                want = gens
    differ = sum(g.output_ids != w.output_ids or abs(g.logprobs[0] - w.logprobs[0]) > tol
                 for g, w in zip(got, want, strict=True))
    best = {k: min(v) for k, v in times.items()}
    return {"tokens": sum(map(len, prompts)), "computed": stats.prefill_tokens_computed,
            "reused": stats.head_reused, "kept_s": best["kept"], "plain_s": best["plain"],
            "ratio": best["plain"] / best["kept"], "differ": differ}


def evaluation(path: str, backends: dict, args) -> dict:
    """A whole greedy evaluation with each backend, interleaved, best of ``args.repeats``; each one's mean F1."""
    store = open_store(f"sqlite:///{tempfile.mkdtemp(prefix='prompt-head-')}/bench.db", create=True)
    policy = register(store, resolve(store, path))
    config = EvalConfig(env="synthetic", env_knobs={"level": args.level, "names": "heldout"}, episodes=args.tasks,
                        seed=1000 + args.level, chunk_tokens=args.chunk_tokens, model=path, dtype=DType(args.dtype),
                        agent=AgentConfig(memory_tokens=args.memory, answer_max_new_tokens=16, temperature=0.0, seed=0,
                                          max_batch=32))
    times: dict[str, list[float]] = {name: [] for name in backends}
    f1: dict[str, float] = {}
    for _ in range(args.repeats):
        for name, backend in backends.items():
            t0 = time.perf_counter()
            row = run_eval(store, config, CPU, backend=backend, policy=policy)
            times[name].append(time.perf_counter() - t0)
            f1[name] = row.f1
    best = {k: min(v) for k, v in times.items()}
    return {"kept_s": best["kept"], "plain_s": best["plain"], "ratio": best["plain"] / best["kept"],
            "f1_kept": f1["kept"], "f1_plain": f1["plain"]}


def batch_costs(backend: TransformersBackend, prompts: list[list[int]], sizes: list[int], new_tokens: int,
                repeats: int) -> list[dict]:
    """Per batch size: prefill ms per row and decode ms per row-token (best of ``repeats``), eos ignored."""
    stop, backend.stop_ids = backend.stop_ids, {-1}  # no token stops a row: every size decodes the same tokens
    try:
        out = []
        for size in sizes:
            rows = prompts[:size]
            best = None
            for _ in range(repeats):
                backend.generate(rows, SamplingParams(temperature=0.0, max_new_tokens=new_tokens))
                t = backend.last_timing
                best = t if best is None or t.prefill_s + t.decode_s < best.prefill_s + best.decode_s else best
            out.append({"batch": size, "prefill_ms_row": 1000 * best.prefill_s / size,
                        "decode_ms_row_token": 1000 * best.decode_s / max(best.decode_tokens, 1)})
        return out
    finally:
        backend.stop_ids = stop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=12, help="distinct tasks per call (the quick plan's eval: 12)")
    ap.add_argument("--level", type=int, default=2, help="ladder level of the tasks")
    ap.add_argument("--chunk-tokens", type=int, default=128)
    ap.add_argument("--memory", type=int, default=48, help="memory budget (tokens)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", default="12,36", help="batch sizes of the per-row cost table ('' skips it)")
    ap.add_argument("--new-tokens", type=int, default=24, help="decode steps per row in the batch table")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=None, help="model folder (default: the prepared default model)")
    ap.add_argument("--smoke", action="store_true", help="a tiny random model, 3 tasks, one round")
    args = ap.parse_args()
    if args.smoke:
        args.tasks, args.repeats, args.chunk_tokens, args.memory, args.batches, args.new_tokens = 3, 1, 48, 8, "2,4", 4
        args.model = args.model or tiny_model(Path(tempfile.mkdtemp(prefix="prompt-head-smoke-")))
    torch.set_num_threads(1)
    path = str(args.model or prepare_default_model())
    model, tok = load_model(path, dtype=args.dtype)
    kept = TransformersBackend.from_model(model, tok)
    plain = TransformersBackend.from_model(model, tok, keep_head=False)
    by_kind = calls(tok, args.tasks * 2, args.chunk_tokens, args.memory, args.level, args.seed)
    # the first half of the tasks warms both backends (and makes the kept head); the second half is measured
    for prompts in by_kind.values():
        for backend in (kept, plain):
            backend.generate(prompts[: args.tasks], SamplingParams(temperature=0.0, max_new_tokens=1))
    tol = 1e-4 if args.dtype == "float32" else float("inf")
    rows = {kind: measure(kept, plain, prompts[args.tasks :], args.repeats, tol) for kind, prompts in by_kind.items()}
    head = len(kept.head.tokens) if kept.head is not None else 0
    whole = evaluation(path, {"kept": kept, "plain": plain}, args)
    sizes = [int(b) for b in args.batches.split(",") if b]
    distinct = calls(tok, max(sizes, default=0), args.chunk_tokens, args.memory, args.level, args.seed + 1)["update"]
    unshared = TransformersBackend.from_model(model, tok, share_prefix=False)  # nothing shared: batch size alone
    costs = batch_costs(unshared, distinct, sizes, args.new_tokens, args.repeats)
    print(f"{args.model or 'default model'}, {args.dtype}, 1 thread, level {args.level}, {args.tasks} tasks per call, "
          f"chunks {args.chunk_tokens}, memory {args.memory}, best of {args.repeats}; kept head {head} tokens")
    print(f"{'call':>7}{'tokens':>8}{'computed':>10}{'reused':>8} | {'plain s':>8}{'kept s':>8}{'x':>6} | {'differ':>6}")
    for kind, r in rows.items():
        print(f"{kind:>7}{r['tokens']:>8}{r['computed']:>10}{r['reused']:>8} | {r['plain_s']:>8.2f}{r['kept_s']:>8.2f}"
              f"{r['ratio']:>6.2f} | {r['differ']:>6}")
    print("differ: prompts whose first greedy token or its log-prob (float32: beyond 1e-4) differ between the two")
    print(f"whole evaluation ({args.tasks} episodes, level {args.level}): plain {whole['plain_s']:.2f} s, kept "
          f"{whole['kept_s']:.2f} s, {whole['ratio']:.2f}x; F1 plain {whole['f1_plain']:.3f}, kept {whole['f1_kept']:.3f}")
    for c in costs:
        print(f"batch {c['batch']:>3} (distinct update prompts, nothing shared): prefill {c['prefill_ms_row']:.0f} ms per row, decode "
              f"{c['decode_ms_row_token']:.2f} ms per row-token")
    print(f"update_kept_vs_plain={rows['update']['ratio']:.2f} answer_kept_vs_plain={rows['answer']['ratio']:.2f} "
          f"eval_kept_vs_plain={whole['ratio']:.2f} head_tokens={head}")
    if args.dtype == "float32" and any(r["differ"] for r in rows.values()):
        raise SystemExit("the kept head changed a float32 output beyond round-off")


if __name__ == "__main__":
    main()

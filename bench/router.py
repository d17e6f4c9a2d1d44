"""The Router-Mem benchmark: F1 and model time of the ``routed`` memory policy against the full overwrite pass,
as a curve over router thresholds (accuracy against time saved), on held-out synthetic tasks.

    python -m bench.router                          # the default model, 16 tasks of level 2 (minutes on 2 cores)
    python -m bench.router --model PATH --episodes 4   # any local model folder
    python -m bench.router --smoke                  # a tiny random model, 2 tasks: every phase runs, in seconds

Two arms run through the real agent loop, greedy (temperature 0), one call at a time (``max_batch`` 1, so each
call's ``latency_s`` is its own model time):
  full    ``--memory overwrite``: one ``memory_update`` per chunk, then the answer from memory;
  router  ``--memory routed --memory-option threshold=0``: the route call, then the answer from the top-k
          retrieved chunks, for every task.
For a threshold t, ``routed`` answers a task from the retrieved chunks when the router's P(yes) >= t and
otherwise runs overwrite's full pass with overwrite's own prompts: under greedy decoding its calls and outputs
are exactly the two arms' calls, so the curve combines them per task (F1: the retrieved answer's or the full
pass's; time: route + retrieved answer, or route + full pass) instead of re-running the rollout per threshold.
P(yes) is the routed policy's (``agent.routed_memory.p_yes``, from the sampled token's log-prob).

Time saved at t is ``1 - time(routed at t) / time(full)``; the best threshold is the one that saves the most
time while its F1 stays within ``--f1-tolerance`` of the full pass's (ties: the higher F1, then the lower
threshold). The router's agreement with the evidence label (``router_label``: yes when the retrieved chunks
cover the gold evidence) is printed too. The last line is exactly
``threshold_best=<t> f1=<x> time_saved=<r>``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from agentmem import model_refs
from agentmem.agent.loop import AgentLoop, ListSink
from agentmem.agent.routed_memory import ROUTE, RoutedOptions, RoutedPolicy, p_yes, router_label
from agentmem.config import HELD_OUT_SEED, AgentConfig
from agentmem.records import Episode
from agentmem.runtime import Runtime
from bench.common.tiny import tiny_model
from envs import load_env

THRESHOLDS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.01)


def run_arm(backend, agent: AgentConfig, env, tasks) -> tuple[dict, dict, float]:
    """(episode by task id, that episode's calls by task id, wall seconds) of one arm."""
    loop = AgentLoop(backend, agent, env.score)
    sink = ListSink()
    episodes = [Episode(run_id="bench", env=env.name, task_id=t.task_id, question=t.question, gold_answers=t.answers)
                for t in tasks]
    t0 = time.perf_counter()
    loop.run([loop.start(e, t) for e, t in zip(episodes, tasks, strict=True)], sink)
    wall = time.perf_counter() - t0
    by_id = {e.id: e.task_id for e in episodes}
    calls: dict[str, list] = {t.task_id: [] for t in tasks}
    for inv in sink.all_invocations:
        calls[by_id[inv.episode_id]].append(inv)
    return {e.task_id: e for e in sink.finished}, calls, wall


def seconds(calls) -> float:
    return sum(c.latency_s for c in calls)


def curve(tasks, full, router, thresholds):
    """One row per threshold: (t, mean F1, model seconds, share answered from retrieved chunks)."""
    full_eps, full_calls, _ = full
    fast_eps, fast_calls, _ = router
    rows = []
    for t in thresholds:
        f1s, secs, now = [], 0.0, 0
        for task in tasks:
            route, answer = fast_calls[task.task_id]
            p = p_yes(route.output_text, None if route.output_logprobs is None else float(route.output_logprobs[0]))
            secs += seconds([route])
            if p >= t:
                f1s.append(fast_eps[task.task_id].f1 or 0.0)
                secs += seconds([answer])
                now += 1
            else:
                f1s.append(full_eps[task.task_id].f1 or 0.0)
                secs += seconds(full_calls[task.task_id])
        rows.append((t, sum(f1s) / len(f1s), secs, now / len(tasks)))
    return rows


def best(rows, full_f1: float, full_secs: float, tolerance: float):
    ok = [r for r in rows if r[1] >= full_f1 - tolerance] or rows
    return max(ok, key=lambda r: (round(1 - r[2] / full_secs, 6), r[1], -r[0]))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", help="model folder, hub name or 'default'")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--level", type=int, default=2, help="synthetic ladder level")
    ap.add_argument("--chunk-tokens", type=int, default=128)
    ap.add_argument("--memory-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=2, help="chunks the router retrieves")
    ap.add_argument("--f1-tolerance", type=float, default=0.02)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--thresholds", default=",".join(map(str, THRESHOLDS)))
    ap.add_argument("--smoke", action="store_true", help="a tiny random model, 2 tasks of level 1: every phase runs")
    args = ap.parse_args(argv)
    if args.smoke:
        args.episodes, args.level, args.memory_tokens = 2, 1, 8
        if args.model == "default":
            args.model = tiny_model(Path(tempfile.mkdtemp(prefix="router-smoke-")))

    runtime = Runtime.create("cpu", threads=args.threads)
    ref = model_refs.resolve(None, args.model)
    backend = model_refs.backend("transformers", ref.path, "float32", runtime)
    tok = backend.tokenizer
    env = load_env("synthetic", seed=HELD_OUT_SEED, chunk_tokens=args.chunk_tokens, level=args.level,
                   count_tokens=lambda s: len(tok(s, add_special_tokens=False)["input_ids"]))
    tasks = env.tasks(args.episodes)
    base = dict(memory_tokens=args.memory_tokens, answer_max_new_tokens=16, temperature=0.0, max_batch=1,
                seed=HELD_OUT_SEED)
    full = run_arm(backend, AgentConfig(**base), env, tasks)
    router = run_arm(backend, AgentConfig(memory_policy="routed", memory_options={"threshold": 0.0, "k": args.k},
                                          **base), env, tasks)
    assert all([c.kind for c in router[1][t.task_id]] == [ROUTE, "answer"] for t in tasks)

    full_f1 = sum(e.f1 or 0.0 for e in full[0].values()) / len(tasks)
    full_secs = sum(seconds(c) for c in full[1].values())
    policy = RoutedPolicy(tok, AgentConfig(memory_tokens=args.memory_tokens), RoutedOptions(k=args.k))
    labels = [router_label(t, policy.retrieve(t)) for t in tasks]
    says_yes = [p_yes(router[1][t.task_id][0].output_text, float(router[1][t.task_id][0].output_logprobs[0])) >= 0.5
                for t in tasks]
    agree = sum(a == b for a, b in zip(labels, says_yes, strict=True)) / len(tasks)
    print(f"model={ref.path} tasks={len(tasks)} level={args.level} chunk_tokens={args.chunk_tokens} k={args.k} "
          f"chunks/task={sum(len(t.chunks) for t in tasks) / len(tasks):.1f}")
    print(f"full pass: F1 {full_f1:.3f}, model time {full_secs:.1f} s (wall {full[2]:.1f} s); evidence-covered "
          f"(label yes) {sum(labels)}/{len(tasks)}; router agrees with the label at 0.5: {agree:.2f}")
    rows = curve(tasks, full, router, [float(x) for x in args.thresholds.split(",")])
    print("| threshold | F1 | model s | time saved | answered from retrieved |")
    print("|---:|---:|---:|---:|---:|")
    for t, f1, secs, now in rows:
        print(f"| {t:.2f} | {f1:.3f} | {secs:.1f} | {1 - secs / full_secs:.3f} | {now:.2f} |")
    t, f1, secs, _ = best(rows, full_f1, full_secs, args.f1_tolerance)
    print(f"threshold_best={t:g} f1={f1:.3f} time_saved={1 - secs / full_secs:.3f}")


if __name__ == "__main__":
    main()

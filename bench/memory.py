"""The memory benchmark: every memory system on the same held-out tasks, at equal model size and budget.

Each arm is a memory policy with its options (``agentmem rollout --memory NAME --memory-option K=V``). Every arm
starts from the default model (SmolLM2-135M-Instruct), is trained the same way, ``sft``: ``agentmem rollout
--policy oracle`` on training tasks with that memory policy, then ``steps`` SFT steps of ``calls_per_step``
stored calls (the recipe that trains best in docs/learning.md), and is evaluated greedily on the same held-out
tasks (synthetic ladder, unseen seed). Reported per arm: F1 with its 95% bootstrap interval, tokens read
per episode (prompt tokens of all its calls), calls per episode and wall time per episode of the evaluation,
for the base model (``--untrained`` adds its row) and the trained one.

The ``teacher`` arm's memories are built from the ``overwrite`` arm's oracle run (``agentmem memories build
--writer oracle``); the ``routed`` arm trains its router on oracle labels (retrieved chunks cover the evidence).

Everything goes to ``WORK/memory.db``; finished phases are recorded in ``WORK/state.json`` and skipped when the
benchmark runs again on the same folder. Outputs: ``WORK/memory.md`` (the table) and the last line
``best_memory=<arm> f1=<x> tokens_vs_overwrite=<r>`` (tokens read per episode, relative to overwrite).

    python -m bench.memory --quick --work /tmp/memory-quick
    python -m bench.memory --smoke       # every arm and phase on a tiny random model; numbers mean nothing
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agentmem import model_refs
from agentmem.config import HELD_OUT_SEED, AgentConfig, EvalConfig, PolicySource, RolloutConfig, SftConfig
from agentmem.jobs.eval import run_eval
from agentmem.jobs.rollout import run_rollout
from agentmem.jobs.sft import run_sft
from agentmem.records import Checkpoint
from agentmem.runtime import Runtime
from bench.common.phases import State, say
from bench.common.tiny import tiny_model
from store import repository as repo
from store.engine import open_store

ROOT = Path(__file__).resolve().parents[1]

# arm name -> (memory policy, memory options)
ARMS: dict[str, tuple[str, dict]] = {
    "overwrite": ("overwrite", {}),
    "log": ("log", {"condition": "full-log", "searches": 2}),
    "log_windowed": ("log", {"condition": "windowed-log", "window": 4, "searches": 2}),
    "log_in_prompt": ("log", {"condition": "in-prompt"}),
    "events": ("events", {"recorder": "rules"}),
    "routed": ("routed", {"threshold": 0.5}),
    "teacher": ("teacher", {"k": 1}),
}


@dataclass(frozen=True)
class Plan:
    steps: int
    calls_per_step: int
    train_tasks: int
    heldout: int
    level: int = 1
    lr: float = 5e-5
    chunk_tokens: int = 128
    memory_tokens: int = 32
    answer_tokens: int = 8
    seed: int = 0
    model: str = "default"  # the base model every arm starts from

    def agent(self, policy: str, options: dict, temperature: float, seed: int) -> AgentConfig:
        return AgentConfig(memory_tokens=self.memory_tokens, answer_max_new_tokens=self.answer_tokens,
                           temperature=temperature, seed=seed, max_batch=32, memory_policy=policy,
                           memory_options=options)


def options_for(arm: str, store, plan: Plan, state: State, runtime: Runtime) -> dict:
    """The arm's memory options; ``teacher`` gets the memory bank built from overwrite's oracle run."""
    policy, options = ARMS[arm]
    if policy != "teacher":
        return options
    build = state.get("memories")
    if build is None:
        from agentmem.jobs.memories import MemoriesConfig, build_memories

        source = oracle_run(store, "overwrite", plan, state, runtime)
        build = build_memories(store, MemoriesConfig(run=source, min_f1=1.0), runtime).run_id
        say(f"teacher: memories built from the overwrite oracle run, build run {build[:8]}")
        state.put("memories", build)
    return {**options, "memories": build}


def oracle_run(store, arm: str, plan: Plan, state: State, runtime: Runtime) -> str:
    key = f"oracle/{arm}"
    if state.get(key) is None:
        policy, _ = ARMS[arm]
        options = options_for(arm, store, plan, state, runtime)
        config = RolloutConfig(env="synthetic", env_knobs={"level": plan.level}, policy=PolicySource.oracle,
                               model=plan.model, episodes=plan.train_tasks, seed=plan.seed, chunk_tokens=plan.chunk_tokens,
                               agent=plan.agent(policy, options, 1.0, plan.seed))
        result = run_rollout(store, config, runtime)
        say(f"{arm}: oracle rollout {result.run_id[:8]}, F1 {np.mean([e.f1 or 0 for e in result.episodes]):.3f}")
        state.put(key, result.run_id)
    return state.get(key)


def train(store, arm: str, plan: Plan, state: State, runtime: Runtime, work: Path) -> dict:
    key = f"sft/{arm}"
    if state.get(key) is None:
        oracle = oracle_run(store, arm, plan, state, runtime)
        result = run_sft(store, SftConfig(run_ids=[oracle], student=plan.model, seed=plan.seed, out=str(work / "ckpt" / arm), optim=dict(steps=plan.steps, lr=plan.lr), batch=dict(invocations_per_step=plan.calls_per_step)), runtime)
        with store.session() as s:
            last = repo.list_checkpoints(s, result.run_id)[-1]
        state.put(key, {"id": last.id, "path": last.path, "step": last.step})
    return state.get(key)


def evaluate(store, arm: str, ckpt: Checkpoint, plan: Plan, state: State, runtime: Runtime, label: str) -> dict:
    key = f"eval/{arm}/{label}"
    if state.get(key) is None:
        policy, _ = ARMS[arm]
        options = options_for(arm, store, plan, state, runtime)
        config = EvalConfig(env="synthetic", env_knobs={"level": plan.level}, episodes=plan.heldout,
                            chunk_tokens=plan.chunk_tokens, model=ckpt.path,
                            agent=plan.agent(policy, options, 0.0, HELD_OUT_SEED))
        backend = model_refs.backend("transformers", ckpt.path, "float32", runtime)
        t0 = time.perf_counter()
        row = run_eval(store, config, runtime, backend=backend, policy=ckpt)
        seconds = time.perf_counter() - t0
        with store.session() as s:
            episodes = sorted(repo.list_episodes(s, row.run_id), key=lambda e: e.task_id)
            calls = {e.id: repo.episode_invocations(s, e.id) for e in episodes}
        f1 = [float(e.f1 or 0.0) for e in episodes]
        state.put(key, {"f1": f1, "tokens": [sum(i.prompt_tokens for i in calls[e.id]) for e in episodes],
                        "calls": [len(calls[e.id]) for e in episodes], "seconds": seconds, "run": row.run_id})
        say(f"{arm} ({label}): F1 {np.mean(f1):.3f} in {seconds:.0f} s")
    return state.get(key)


def ci(values: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    a = np.asarray(values, dtype=float)
    means = a[rng.integers(0, len(a), (n, len(a)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def table(results: dict[tuple[str, str], dict]) -> str:
    lines = ["| arm | model | F1 [95%] | tokens read / episode | calls / episode | s / episode |",
             "|---|---|---|---:|---:|---:|"]
    for (arm, label), r in results.items():
        lo, hi = ci(r["f1"])
        n = len(r["f1"])
        lines.append(f"| {arm} | {label} | {np.mean(r['f1']):.3f} [{lo:.3f}, {hi:.3f}] | {np.mean(r['tokens']):,.0f} | "
                     f"{np.mean(r['calls']):.1f} | {r['seconds'] / n:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8 SFT steps, 24 held-out tasks")
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny random model, 2 steps, 2 held-out tasks, in a temporary folder: every phase runs")
    ap.add_argument("--untrained", action="store_true", help="also evaluate the base model with each memory")
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of: " + ", ".join(ARMS))
    ap.add_argument("--work", type=Path, default=None, help="work folder (default: memory-bench)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown or "overwrite" not in arms:
        raise SystemExit(f"--arms: unknown {unknown}" if unknown else "--arms must include overwrite (the yardstick)")
    work = (args.work or (Path(tempfile.mkdtemp(prefix="memory-smoke-")) if args.smoke else Path("memory-bench")))
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        args.threads = 1
        plan = Plan(steps=2, calls_per_step=4, train_tasks=4, heldout=2, level=0, memory_tokens=8, answer_tokens=4,
                    model=tiny_model(work))
    elif args.quick:
        plan = Plan(steps=8, calls_per_step=8, train_tasks=24, heldout=24)
    else:
        plan = Plan(steps=16, calls_per_step=8, train_tasks=48, heldout=70)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    state = State(work / "state.json", plan)
    runtime = Runtime.create("cpu", args.threads)
    store = open_store(f"sqlite:///{work / 'memory.db'}", create=True)
    base = model_refs.register(store, model_refs.resolve(store, plan.model))
    t0 = time.perf_counter()
    results: dict[tuple[str, str], dict] = {}
    for arm in arms:
        if args.untrained:
            results[(arm, "base")] = evaluate(store, arm, base, plan, state, runtime, "base")
        c = train(store, arm, plan, state, runtime, work)
        with store.session() as s:
            ckpt = repo.get_checkpoint(s, c["id"])
        results[(arm, f"sft-{plan.steps}")] = evaluate(store, arm, ckpt, plan, state, runtime, "sft")
    text = table(results)
    (work / "memory.md").write_text(text + "\n")
    print(text)
    trained = {arm: r for (arm, label), r in results.items() if label != "base"}
    best = max(trained, key=lambda a: np.mean(trained[a]["f1"]))
    ratio = np.mean(trained[best]["tokens"]) / np.mean(trained["overwrite"]["tokens"])
    say(f"done in {(time.perf_counter() - t0) / 60:.1f} min; outputs in {work}")
    print(f"best_memory={best} f1={np.mean(trained[best]['f1']):.3f} tokens_vs_overwrite={ratio:.2f}")


if __name__ == "__main__":
    main()

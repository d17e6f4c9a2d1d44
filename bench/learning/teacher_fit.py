"""Fit a teacher once: LoRA SFT under its own prompt until it passes its gate, then commit the adapter.

``python -m bench.learning.teacher_fit --context hint`` trains the student's base model on the ladder's oracle
calls under the hint prompt (``sft --context hint --lora-rank R``), in stages of ``--stage`` (64) steps at a constant
learning rate (a stage resumes the last one, so the run to step N is the run a single N-step job makes). After
each stage the candidate is validated greedily on ``--val`` episodes under its prompt (``check_teacher``) and
gated against the seed-0 warm start on the same episodes (``teachers.gate``): F1 at least the warm start's +
0.10, a first-read decision gap of at least 0.5, at most 2% empty outputs and first-token EOS mass at most 0.05
on every call kind, and a paired 95% interval of (teacher - warm start) F1 above 0. The first candidate that
passes is the teacher: its adapter (peft's ``adapter_model.safetensors`` and ``adapter_config.json``) and the
record of every stage go to ``bench/results/learning/teacher/CONTEXT/``. No candidate by ``--max-steps``: the
record says why, and nothing is picked.

The teacher depends on no training seed, so one fit serves every seed and machine. Phases are kept in
``WORK/state.json``: a killed fit goes on at its first unfinished phase.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from agentmem import model_refs
from agentmem.config import DType, EvalConfig, LrSchedule, RolloutConfig, SftConfig
from agentmem.config.choices import PolicySource
from agentmem.jobs.eval import first_read_skips
from agentmem.jobs.rollout import build_env, run_rollout
from agentmem.jobs.sft import run_sft
from agentmem.jobs.teacher_check import check_teacher
from agentmem.records import SamplingContext
from agentmem.runtime import Runtime
from agentmem.training.lora import ADAPTER_DIR
from bench.common.phases import State, say
from bench.learning import records
from bench.learning.campaign import ORACLE_SEED, VALIDATION_SEED
from store import repository as repo
from store.engine import open_store

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "learning" / "teacher"
ADAPTER_LIMIT = 25 * 2**20  # bytes: the committed adapter's budget


@dataclass(frozen=True)
class GateLimits:
    """What a teacher must show on validation before an arm may distil from it (docs/learning.md, the
    thresholds): F1 at least ``f1_margin`` above the warm start's on the same episodes, a first-read decision
    gap (the ``(empty)`` rate on other reads minus the rate on evidence reads) of at least ``min_gap``, an
    empty-output rate of at most ``max_empty`` and a first-token EOS mass of at most ``max_eos_first`` on every
    call kind. None turns a check off (``--smoke``, whose tiny model measures nothing)."""

    f1_margin: float | None = 0.10
    min_gap: float | None = 0.5
    max_empty: float = 0.02
    max_eos_first: float = 0.05


def decision_gap(first_reads: dict[str, float] | None) -> float | None:
    """The first-read decision gap: the share of other reads that write ``(empty)`` minus the share of evidence
    reads that do (``first_read_skips``); None when either kind of read is missing."""
    if not first_reads or "other" not in first_reads or "evidence" not in first_reads:
        return None
    return first_reads["other"] - first_reads["evidence"]


def gate(check: dict, warm_f1: float, limits: GateLimits = GateLimits()) -> dict:
    """A teacher's gate on its validation ``check`` (``f1``, ``empty_by_kind``, ``eos_first_by_kind`` and
    ``first_reads``, as ``teacher`` stores them) against the warm start's validation F1 ``warm_f1``: the
    measured values, the reasons it fails (empty when it passes) and ``passed``. Pure: it reads nothing."""
    gap = decision_gap(check.get("first_reads"))
    empty = max(check.get("empty_by_kind", {}).values(), default=0.0)
    eos = max(check.get("eos_first_by_kind", {}).values(), default=0.0)
    headroom = check["f1"] - warm_f1
    fails = []
    if limits.f1_margin is not None and headroom < limits.f1_margin - 1e-12:
        fails.append(f"validation F1 {check['f1']:.3f} is {headroom:+.3f} over the warm start's {warm_f1:.3f} "
                     f"(needs {limits.f1_margin:+.2f})")
    if limits.min_gap is not None and (gap is None or gap < limits.min_gap - 1e-12):
        fails.append("no first-read decision gap measured" if gap is None else
                     f"first-read decision gap {gap:.2f} (needs {limits.min_gap:.2f})")
    if empty > limits.max_empty:
        fails.append(f"empty-output rate {empty:.3f} (at most {limits.max_empty})")
    if eos > limits.max_eos_first:
        fails.append(f"first-token EOS mass {eos:.3f} (at most {limits.max_eos_first})")
    return {"f1": check["f1"], "warm_f1": warm_f1, "headroom": headroom, "decision_gap": gap, "max_empty": empty,
            "max_eos_first": eos, "passed": not fails, "fails": fails}


@dataclass(frozen=True)
class FitPlan:
    """Every knob of one teacher fit (stored in ``state.json``; a resumed fit must match it)."""

    context: str = "hint"
    model: str = "default"
    train_levels: list[int] = field(default_factory=lambda: [1, 2, 3])
    val_level: int = 2
    val_episodes: int = 64
    # first-token EOS mass on this many prompts of each call kind: a forward pass each, 5 s apiece on 2 busy AVX2
    # cores (64 a kind took 10 minutes, as long as the greedy evaluation itself)
    eos_prompts: int = 24
    stage: int = 64  # SFT steps between validations (a 64-episode validation costs about as much as 64 steps)
    max_steps: int = 256
    calls_per_step: int = 8
    lr: float = 5e-4
    warmup: int = 4
    lora_rank: int = 16
    lora_alpha: float = 32.0
    warm_steps: int = 16  # the seed-0 warm start the gate compares with (the learning plan's)
    warm_lr: float = 5e-5
    chunk_tokens: int = 128
    memory_tokens: int = 48
    answer_tokens: int = 16
    forms: str = "mixed"
    limits: GateLimits = GateLimits()

    @property
    def oracle_tasks(self) -> int:
        return max(16, self.max_steps * self.calls_per_step // len(self.train_levels))


def agent(plan: FitPlan, temperature: float, seed: int):
    from agentmem.config import AgentConfig

    return AgentConfig(memory_tokens=plan.memory_tokens, answer_max_new_tokens=plan.answer_tokens,
                       temperature=temperature, seed=seed, max_batch=32)


def ladder(plan: FitPlan, level: int) -> dict:
    return {"level": level, "names": "train", "forms": plan.forms}


def validation(plan: FitPlan, context: SamplingContext) -> EvalConfig:
    """The validation episodes: ``val_episodes`` training-name tasks of ``val_level`` with a seed of their own
    (the learning plan's ``teachers.validation``), greedy, float32, under ``context``."""
    return EvalConfig(env="synthetic", env_knobs=ladder(plan, plan.val_level), episodes=plan.val_episodes,
                      seed=VALIDATION_SEED + plan.val_level, chunk_tokens=plan.chunk_tokens, model=plan.model,
                      agent=agent(plan, 0.0, VALIDATION_SEED), dtype=DType.float32, context=context)


class Fit:
    def __init__(self, work: Path, plan: FitPlan, threads: int):
        self.work, self.plan = work, plan
        work.mkdir(parents=True, exist_ok=True)
        self.store = open_store(f"sqlite:///{work / 'fit.db'}", create=True)
        self.runtime = Runtime(device="cpu", threads=threads)
        self.state = State(work / "state.json", plan)

    def oracle_runs(self) -> list[str]:
        p = self.plan
        out = []
        for level in p.train_levels:
            def make(level: int = level) -> str:
                config = RolloutConfig(env="synthetic", env_knobs=ladder(p, level), model=p.model,
                                       policy=PolicySource.oracle, episodes=p.oracle_tasks, seed=ORACLE_SEED + level,
                                       chunk_tokens=p.chunk_tokens, agent=agent(p, 1.0, ORACLE_SEED))
                run = run_rollout(self.store, config, self.runtime).run_id
                say(f"oracle rollout level {level}: {run}")
                return run
            out.append(self.state.once(f"oracle/{level}", make))
        return out

    def checkpoint(self, run_id: str) -> dict:
        with self.store.session() as s:
            c = repo.list_checkpoints(s, run_id)[-1]
        return {"id": c.id, "path": c.path, "step": c.step}

    def warm(self) -> dict:
        p = self.plan

        def make() -> dict:
            config = SftConfig(run_ids=self.oracle_runs(), student=p.model, seed=0, out=str(self.work / "ckpt" / "warm-0"), optim=dict(steps=p.warm_steps, lr=p.warm_lr, warmup_steps=1, schedule=LrSchedule.cosine), batch=dict(invocations_per_step=p.calls_per_step))
            return self.checkpoint(run_sft(self.store, config, self.runtime).run_id)
        return self.state.once("warm/0", make)

    def validate(self, name: str, ckpt: dict, context: SamplingContext) -> dict:
        def make() -> dict:
            with self.store.session() as s:
                teacher = repo.get_checkpoint(s, ckpt["id"])
            config = validation(self.plan, context)
            report = check_teacher(self.store, teacher, config, self.runtime, eos_prompts=self.plan.eos_prompts)
            say(f"{name}: {report.line()}")
            tokenizer = model_refs.load_tokenizer(teacher.path)
            tasks = {t.task_id: t for t in build_env(config, tokenizer).tasks(config.episodes)}
            with self.store.session() as s:
                calls = list(repo.stream_invocations(s, run_ids=[report.eval_run_id]))
                episodes = repo.list_episodes(s, report.eval_run_id)
            scores = {ep.task_id: float(ep.f1 or 0.0) for ep in episodes}
            return {**asdict(report), "first_reads": first_read_skips(calls, {e.id: tasks[e.task_id] for e in episodes}),
                    "scores": scores}
        return self.state.once(f"check/{name}", make)

    def stage(self, steps: int) -> dict:
        """The teacher's LoRA SFT run to ``steps`` (resuming the previous stage's run)."""
        p = self.plan

        def make() -> dict:
            started = time.monotonic()
            prev = self.state.get(f"teacher/{steps - p.stage}") if steps > p.stage else None
            if prev is None:
                config = SftConfig(run_ids=self.oracle_runs(), student=p.model, seed=0, context=SamplingContext(p.context), lora_rank=p.lora_rank, lora_alpha=p.lora_alpha, keep_optimizer=True, out=str(self.work / "ckpt" / f"teacher-{p.context}"), optim=dict(steps=steps, lr=p.lr, warmup_steps=p.warmup, schedule=LrSchedule.constant), batch=dict(invocations_per_step=p.calls_per_step))
                result = run_sft(self.store, config, self.runtime, on_step=self.log_step)
            else:
                result = run_sft(self.store, None, self.runtime, resume=prev["run_id"], steps=steps,
                                 on_step=self.log_step)
            return {**self.checkpoint(result.run_id), "run_id": result.run_id,
                    "seconds": round(time.monotonic() - started, 1)}
        return self.state.once(f"teacher/{steps}", make)

    def log_step(self, step) -> None:
        say(f"teacher step {step.step}: loss {step.loss:.4f}")

    def losses(self, run_id: str) -> list[dict]:
        with self.store.session() as s:
            return [{"step": t.step, "loss": round(float(t.loss), 5)} for t in repo.list_train_steps(s, run_id)]


def paired_interval(a: dict[str, float], b: dict[str, float], n: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of a - b over the tasks both scored, with a percentile bootstrap 95% interval (tasks resampled)."""
    keys = sorted(set(a) & set(b))
    diff = np.array([a[k] - b[k] for k in keys])
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, diff.size, size=(n, diff.size))].mean(axis=1)
    lo, hi = np.quantile(means, [0.025, 0.975])
    return float(diff.mean()), float(lo), float(hi)


def judge(check: dict, warm: dict, limits: GateLimits) -> dict:
    """The gate of one candidate (``teachers.gate``) plus the paired interval of its F1 over the warm start's;
    passing needs both."""
    result = gate(check, warm["f1"], limits)
    mean, lo, hi = paired_interval(check["scores"], warm["scores"])
    result["paired_f1"] = [round(mean, 4), round(lo, 4), round(hi, 4)]
    if limits.f1_margin is not None and lo <= 0:  # no F1 check (--smoke): no interval check either
        result["fails"].append(f"paired F1 gain {mean:+.3f} [{lo:+.3f}, {hi:+.3f}] does not exclude 0")
        result["passed"] = False
    return result


def export(folder: Path, ckpt: dict) -> dict:
    """Copy the picked candidate's adapter (peft's two files) into ``folder``; its sizes and hash."""
    src = Path(ckpt["path"]) / ADAPTER_DIR
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        shutil.copyfile(src / name, folder / name)
        out[name] = {"bytes": (folder / name).stat().st_size,
                     "sha256": hashlib.sha256((folder / name).read_bytes()).hexdigest()}
    total = sum(v["bytes"] for v in out.values())
    if total > ADAPTER_LIMIT:
        raise SystemExit(f"the adapter is {total / 2**20:.1f} MiB, over the {ADAPTER_LIMIT / 2**20:.0f} MiB budget")
    return out


def run(work: Path, plan: FitPlan, threads: int, out: Path) -> dict:
    fit = Fit(work, plan, threads)
    context = SamplingContext(plan.context)
    warm = fit.validate("warm-0", fit.warm(), SamplingContext.aligned)
    stages, picked = [], None
    for steps in range(plan.stage, plan.max_steps + 1, plan.stage):
        ckpt = fit.stage(steps)
        check = fit.validate(f"teacher-{steps}", ckpt, context)
        result = judge(check, warm, plan.limits)
        stages.append({"step": steps, "checkpoint": ckpt["id"], "train_seconds": ckpt["seconds"],
                       "f1": check["f1"], "empty_by_kind": check["empty_by_kind"],
                       "eos_first_by_kind": check["eos_first_by_kind"], "out_len_by_kind": check["out_len_by_kind"],
                       "first_reads": check["first_reads"], "gate": result})
        say(f"teacher step {steps}: F1 {check['f1']:.3f} (warm {warm['f1']:.3f}), paired {result['paired_f1']}, "
            f"gap {result['decision_gap']}, {'passed' if result['passed'] else '; '.join(result['fails'])}")
        if result["passed"]:
            picked = {"step": steps, **ckpt}
            break
    last = fit.state.get(f"teacher/{stages[-1]['step']}")
    record = {"kind": "teacher_fit", "plan": asdict(plan), "commit": records.commit(), "cpu": records.cpu(),
              "threads": threads, "warm": {k: warm[k] for k in ("f1", "empty_by_kind", "eos_first_by_kind",
                                                                  "first_reads")},
              "stages": stages, "losses": fit.losses(last["run_id"]), "picked": picked["step"] if picked else None,
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    folder = out / plan.context
    folder.mkdir(parents=True, exist_ok=True)
    if picked:
        record["adapter"] = export(folder, picked)
    (folder / "record.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.learning.teacher_fit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", choices=("hint", "privileged"), default="hint")
    ap.add_argument("--work", type=Path, default=Path("/tmp/agentmem-teacher-fit"),
                    help="folder of the fit's store, checkpoints and state.json (a killed fit resumes there)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the adapter and record go (a folder per context)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count() or 1)
    ap.add_argument("--max-steps", type=int, default=FitPlan.max_steps)
    ap.add_argument("--stage", type=int, default=FitPlan.stage)
    ap.add_argument("--val", type=int, default=FitPlan.val_episodes, help="validation episodes (at least 64 for a "
                    "committed teacher)")
    ap.add_argument("--lr", type=float, default=FitPlan.lr)
    ap.add_argument("--lora-rank", type=int, default=FitPlan.lora_rank)
    ap.add_argument("--smoke", action="store_true", help="a tiny random model, 2 stages of 1 step, no gate")
    args = ap.parse_args(argv)
    plan = FitPlan(context=args.context, max_steps=args.max_steps, stage=args.stage, val_episodes=args.val, lr=args.lr,
                   lora_rank=args.lora_rank)
    if args.smoke:
        from bench.common.tiny import tiny_model

        model = tiny_model(args.work)
        plan = FitPlan(context=args.context, model=model, max_steps=2, stage=1, val_episodes=2, calls_per_step=2,
                       warm_steps=1, lora_rank=2, lora_alpha=4.0, chunk_tokens=48, memory_tokens=8, answer_tokens=4,
                       limits=GateLimits(None, None, 1.0, 1.0))
    record = run(args.work, plan, args.threads, args.out)
    print(f"teacher={plan.context} picked_step={record['picked']} stages={len(record['stages'])} "
          f"f1={record['stages'][-1]['f1']:.3f} warm_f1={record['warm']['f1']:.3f}")


if __name__ == "__main__":
    main()

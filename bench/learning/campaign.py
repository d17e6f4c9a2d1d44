"""The driver: one seed of a suite per unit of work, run through the product's own jobs.

For training seed N a unit makes the seed's warm start (``agentmem sft`` on the oracle calls, keeping its AdamW
state), then trains each arm as ``agentmem train --config examples/learning/ARM.yaml --student WARM --seed N
--rounds S/2`` builds it (``cli.config_show.effective_config``: the same spec, so a user reproduces an arm with
that command), evaluates each arm's checkpoints at ``eval_steps`` on the held-out ladder, and writes one record
per arm-seed (``records``). Models no seed changes (the base model, the teacher) are evaluated once. Every
finished phase is in ``WORK/state.json``; a killed unit goes on at its first unfinished phase (a train run that
was cut is resumed with ``run_train(resume=...)``). There is no training loop here.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agentmem import model_refs
from agentmem.config import DType, EvalConfig, LrSchedule, RolloutConfig, SftConfig, TrainConfig
from agentmem.config.choices import PolicySource
from agentmem.jobs.eval import first_read_skips, run_eval
from agentmem.jobs.rollout import build_env, run_rollout
from agentmem.jobs.sft import run_sft
from agentmem.jobs.train import load_train_config, load_train_state, run_train
from agentmem.records import RunKind, SamplingContext
from agentmem.runtime import Runtime
from bench.common.phases import State, say
from bench.learning import records, suite
from bench.learning.suite import Arm
from cli.config_show import effective_config
from store import repository as repo
from store.engine import open_store

ROOT = Path(__file__).resolve().parents[2]
TEACHER = "bench/results/learning/teacher/hint"  # the committed hint teacher (bench.learning.teacher_fit)
ORACLE_SEED = 7000
HELD_OUT_SEED = 1000  # agentmem's own held-out seeds: level L's questions are seed 1000 + L, held-out names
VALIDATION_SEED = 9000  # picks (a swept coefficient) on training names with seeds of their own


@dataclass(frozen=True)
class Plan:
    """What a record measures (stored in ``state.json``, hashed into the records' folder name): the student
    steps S of every trained arm, the steps along each run at which it is evaluated, the held-out and
    validation sizes, the warm start, the teacher adapter and the host's float kind (bf16 and float32 hosts keep
    separate records). ``train_args``: extra ``agentmem train`` flags for every arm (``--smoke``: a tiny model)."""

    steps: int = 24
    eval_steps: list[int] = field(default_factory=lambda: [24])
    heldout_levels: list[int] = field(default_factory=lambda: [1, 2, 3])
    heldout_per_level: int = 32
    validation: int = 32
    warm_steps: int = 16
    warm_lr: float = 5e-5
    warm_calls: int = 8
    oracle_tasks: int = 64
    model: str = "default"
    teacher: str = TEACHER
    host: str = "float32"
    eval_dtype: str = "float32"
    train_args: list[str] = field(default_factory=list)

    @property
    def rounds(self) -> int:
        return self.steps // 2


def host_kind(device: str = "cpu") -> str:
    """``cuda`` on a GPU; on a CPU ``bf16`` where it has native bfloat16 (AMX or AVX512-BF16), else ``float32``."""
    if device.startswith("cuda"):
        return "cuda"
    flags = set(records.cpu()["flags"])
    return "bf16" if flags & {"avx512_bf16", "amx_bf16"} else "float32"


class Campaign:
    def __init__(self, work: Path, plan: Plan, threads: int, records_dir: Path | None = records.RECORDS,
                 device: str = "cpu", keep_checkpoints: bool = False):
        self.work, self.plan, self.records_dir = work, plan, records_dir
        self.keep_checkpoints = keep_checkpoints
        work.mkdir(parents=True, exist_ok=True)
        # the pilot and the seeds share a folder: the warm starts and the evaluations of the models no arm trains
        # (base, warm, the teacher) are made once; an arm's training is named by its steps
        self.state = State(work / "state.json", plan, free=("steps", "eval_steps"))
        self.store = open_store(f"sqlite:///{work / 'learning.db'}", create=True)
        self.runtime = Runtime.create(device, threads)
        self.recipe: TrainConfig = effective_config("train", ["--config", str(suite.OVERLAYS / "base.yaml"),
                                                              *plan.train_args])

    # -- the starting points ---------------------------------------------------------------------------------

    def teacher_path(self) -> str:
        path = Path(self.plan.teacher)
        return str(path if path.is_absolute() else ROOT / path)

    def oracle_runs(self) -> list[str]:
        r = self.recipe.rollout
        out = []
        for level in self.plan.heldout_levels:
            def make(level: int = level) -> str:
                config = RolloutConfig(env="synthetic", env_knobs={**r.env_knobs, "level": level}, model=self.plan.model,
                                       policy=PolicySource.oracle, episodes=self.plan.oracle_tasks,
                                       seed=ORACLE_SEED + level, chunk_tokens=r.chunk_tokens,
                                       agent=r.agent.model_copy(update={"seed": ORACLE_SEED}))
                return run_rollout(self.store, config, self.runtime).run_id
            out.append(self.state.once(f"oracle/{level}", make))
        return out

    def warm(self, seed: int) -> dict:
        p = self.plan

        def make() -> dict:
            say(f"warm start, seed {seed}: {p.warm_steps} SFT steps on the oracle calls")
            config = SftConfig(run_ids=self.oracle_runs(), student=p.model, seed=seed, keep_optimizer=True, out=str(self.work / "ckpt" / f"warm-{seed}"), optim=dict(steps=p.warm_steps, lr=p.warm_lr, warmup_steps=1, schedule=LrSchedule.cosine), batch=dict(invocations_per_step=p.warm_calls))
            started = time.monotonic()
            result = run_sft(self.store, config, self.runtime)
            assert result.last_checkpoint is not None
            return {"id": result.last_checkpoint.id, "path": result.last_checkpoint.path, "run": result.run_id,
                    "seconds": round(time.monotonic() - started, 1)}
        return self.state.once(f"warm/{seed}", make)

    # -- evaluation --------------------------------------------------------------------------------------------

    def heldout(self) -> list[tuple[str, EvalConfig]]:
        r = self.recipe.rollout
        agent = r.agent.model_copy(update={"temperature": 0.0, "seed": HELD_OUT_SEED})
        return [(f"level{lv}", EvalConfig(env="synthetic", env_knobs={**r.env_knobs, "names": "heldout", "level": lv},
                                          episodes=self.plan.heldout_per_level, seed=HELD_OUT_SEED + lv,
                                          chunk_tokens=r.chunk_tokens, agent=agent, dtype=DType(self.plan.eval_dtype)))
                for lv in self.plan.heldout_levels]

    def evaluate(self, key: str, model: str, context: SamplingContext = SamplingContext.aligned,
                 sets: list[tuple[str, EvalConfig]] | None = None) -> dict:
        """Per component: F1 per question (sorted by task id, so arms pair up), the greedy empty rate and mean
        output length per call kind, ``(empty)`` after evidence, and the first-read shares."""
        def make() -> dict:
            say(f"evaluate {key}")
            ref = model_refs.resolve(self.store, model)
            ckpt = model_refs.register(self.store, ref)
            backend = model_refs.backend("transformers", ref.path, self.plan.eval_dtype, self.runtime)
            out: dict = {"scores": {}, "empty": {}, "length": {}, "forgot": {}, "first_reads": {}, "runs": {}}
            for name, config in sets or self.heldout():
                config = config.model_copy(update={"model": ref.path, "context": context})
                row = run_eval(self.store, config, self.runtime, backend=backend, policy=ckpt)
                tasks = {t.task_id: t for t in build_env(config, backend.tokenizer).tasks(config.episodes)}
                with self.store.session() as s:
                    episodes = sorted(repo.list_episodes(s, row.run_id), key=lambda e: (e.task_id, e.sample_index))
                    calls = list(repo.stream_invocations(s, run_ids=[row.run_id]))
                out["scores"][name] = [float(e.f1 or 0.0) for e in episodes]
                out["empty"][name] = row.metrics.get("empty_by_kind", {})
                out["length"][name] = row.metrics.get("out_len_by_kind", {})
                out["forgot"][name] = row.metrics.get("empty_after_evidence")
                out["first_reads"][name] = first_read_skips(calls, {e.id: tasks[e.task_id] for e in episodes})
                out["runs"][name] = row.run_id
            return out
        return self.state.once(f"eval/{key}", make)

    # -- arms --------------------------------------------------------------------------------------------------

    def train_args(self, arm: Arm, seed: int, warm: dict, extra: list[str] = ()) -> list[str]:
        """The ``agentmem train`` command line of an arm-seed (after ``agentmem train``)."""
        args = ["--config", str(arm.path), "--seed", str(seed), "--student", warm["id"],
                "--rounds", str(self.plan.rounds),
                "--out", str(self.work / "ckpt" / f"{arm.name}-{seed}-S{self.plan.steps}"),
                *self.plan.train_args]
        if arm.teacher == "hint":
            args += ["--teacher", self.teacher_path()]
        elif arm.teacher == "warm":
            args += ["--teacher", warm["id"]]
        elif arm.teacher == "base":
            args += ["--teacher", self.plan.model]
        return [*args, *extra]

    def train(self, arm: Arm, seed: int, extra: list[str] = (), tag: str = "") -> dict:
        """Train an arm-seed through ``jobs.train`` (resuming a train run that a kill cut), and return its
        rounds' checkpoints, its distill runs and its wall seconds."""
        warm = self.warm(seed)
        name = f"{arm.name}{tag}"

        def make() -> dict:
            args = self.train_args(arm, seed, warm, list(extra))
            if tag:
                args[args.index("--out") + 1] += tag
            config: TrainConfig = effective_config("train", args)
            say(f"train {name} seed {seed}: agentmem train {' '.join(args)}")
            started = time.monotonic()
            cut = self._cut_train_run(config)
            if cut is not None:
                say(f"{name} seed {seed}: resuming train run {cut}")
            run_id, rounds = run_train(self.store, None if cut else config, self.runtime, resume=cut, on_phase=say)
            return {"train_run": run_id, "command": ["agentmem", "train", *args],
                    "rounds": [{"step": (r.round + 1) * config.distill.optim.steps, "id": r.checkpoint.id,
                                "path": r.checkpoint.path, "distill_run": r.distill_run_id,
                                "rollout_run": r.rollout_run_id} for r in rounds],
                    "seconds": round(time.monotonic() - started, 1)}
        return self.state.once(f"arm/{name}/{seed}/S{self.plan.steps}", make)

    def _cut_train_run(self, config: TrainConfig) -> str | None:
        """A train run of this config that a kill cut (same config, not finished), or None."""
        with self.store.session() as s:
            runs = [r.run for r in repo.list_runs(s) if r.run.kind is RunKind.train
                    and load_train_config(r.run) == config]
        cut = [r for r in runs if len(load_train_state(self.store, r.id).finished) < config.rounds]
        return max(cut, key=lambda r: r.created_at).id if cut else None

    def swept(self, arm: Arm, seed: int) -> tuple[list[str], dict | None]:
        """The flags of an arm with a swept coefficient: the value picked on validation by the first seed that
        ran it (one run per value, each evaluated on ``validation`` training-name episodes of level 2), reused
        by later seeds; none for an arm without a sweep."""
        if arm.sweep is None:
            return [], None
        flag, values = arm.sweep
        pick = self.state.get(f"sweep/{arm.name}/S{self.plan.steps}")
        if pick is None:
            r = self.recipe.rollout
            agent = r.agent.model_copy(update={"temperature": 0.0, "seed": VALIDATION_SEED})
            val = [("val", EvalConfig(env="synthetic", env_knobs={**r.env_knobs, "level": 2},
                                      episodes=self.plan.validation, seed=VALIDATION_SEED + 2,
                                      chunk_tokens=r.chunk_tokens, agent=agent, dtype=DType.float32))]
            f1 = {}
            for v in values:
                trained = self.train(arm, seed, [flag, str(v)], tag=f"-c{v}")
                scores = self.evaluate(f"val/{arm.name}-c{v}of{self.plan.steps}/{seed}", trained["rounds"][-1]["id"],
                                       sets=val)
                f1[v] = sum(scores["scores"]["val"]) / len(scores["scores"]["val"])
            best = max(values, key=lambda v: (f1[v], -v))
            pick = {"flag": flag, "value": best, "f1": {str(v): f for v, f in f1.items()}, "seed": seed}
            self.state.put(f"sweep/{arm.name}/S{self.plan.steps}", pick)
            say(f"{arm.name}: {flag} {best} (validation F1 {pick['f1']})")
        return [flag, str(pick["value"])], pick

    def run_arm(self, arm: Arm, seed: int) -> dict:
        """Train (when the arm trains) and evaluate one arm-seed, and write its record."""
        warm = self.warm(seed)
        extra, pick = self.swept(arm, seed)
        if not arm.trained:
            model = {"base": self.plan.model, "warm": warm["id"], "teacher_hint": self.teacher_path()}[arm.name]
            context = SamplingContext.hint if arm.name == "teacher_hint" else SamplingContext.aligned
            once = "once" in arm.tags
            evaluation = self.evaluate(f"{arm.name}/{0 if once else seed}", model, context)
            trained = {"rounds": [], "seconds": warm["seconds"] if arm.name == "warm" else 0.0}
            along = {}
        else:
            trained = self.train(arm, seed, extra, tag=f"-c{pick['value']}" if pick else "")
            by_step = {r["step"]: r for r in trained["rounds"]}
            along = {step: self.evaluate(f"{arm.name}@{step}of{self.plan.steps}/{seed}", by_step[step]["id"])
                     for step in self.plan.eval_steps if step in by_step}
            evaluation = along[max(along)]
        record = self.record(arm, 0 if "once" in arm.tags else seed, trained, evaluation, along, pick)
        if self.records_dir is not None:
            records.write(self.records_dir, record)
        if arm.trained and not self.keep_checkpoints:
            self.drop_checkpoints(trained)
        return record

    def drop_checkpoints(self, trained: dict) -> None:
        """Delete an evaluated arm's ``--out`` folder: about 2 GB an arm at S = 8 (weights and AdamW each round),
        so 5 seeds of the core suite would need some 95 GB. Its record and state.json keep all the report reads.
        The warm starts stay: every arm of their seed starts from one."""
        args = trained.get("command") or []
        if "--out" not in args:
            return
        out = Path(args[args.index("--out") + 1]).resolve()
        if out.parent != (self.work / "ckpt").resolve():
            raise ValueError(f"{out} is not an arm's checkpoint folder under {self.work / 'ckpt'}: not deleted")
        shutil.rmtree(out, ignore_errors=True)

    def record(self, arm: Arm, seed: int, trained: dict, evaluation: dict, along: dict, pick: dict | None) -> dict:
        distills = [r["distill_run"] for r in trained["rounds"]]
        with self.store.session() as s:
            steps = [st for rid in distills for st in repo.list_train_steps(s, rid)]
            rollouts = [r["rollout_run"] for r in trained["rounds"]]
            rollout_tokens = sum(i.prompt_tokens + i.output_tokens for i in repo.stream_invocations(s, run_ids=rollouts)
                                 if i.role == "model") if rollouts else 0
        ledger = {"steps": len(steps), "rollout_tokens": rollout_tokens,
                  "teacher_forward_tokens": int(sum(st.metrics.get("teacher_tokens", 0) for st in steps)),
                  "student_tokens": int(sum(st.tokens for st in steps)), "wall_seconds": trained["seconds"]}
        extra = {"empty": evaluation["empty"], "empty_after_evidence": evaluation["forgot"],
                 "first_reads": evaluation["first_reads"], "length": evaluation["length"],
                 "along": {str(step): ev["scores"] for step, ev in along.items()}, "sweep": pick,
                 "command": trained.get("command"), "steps_dynamics": [st.metrics for st in steps]}
        return records.arm_record(asdict(self.plan), arm.name, seed, teacher=arm.teacher, scores=evaluation["scores"],
                                  dynamics=records.dynamics([st.metrics for st in steps]), ledger=ledger,
                                  once="once" in arm.tags, extra=extra)

    def commands(self, seed: int, arms: list[str]) -> list[str]:
        """The ``agentmem train`` command line of each trained arm of a unit (the warm start as WARM), each
        checked by building its config: what ``--dry-run`` prints."""
        out = []
        for name in arms:
            a = suite.arm(name)
            if a.trained:
                args = self.train_args(a, seed, {"id": "WARM"})
                effective_config("train", args)
                out.append("agentmem train " + " ".join(args))
        return out

    def unit(self, seed: int, arms: list[str]) -> float:
        """One seed of ``arms`` (the models evaluated once, only where their record is missing); returns its
        minutes and writes them as the seed's unit record."""
        started = time.monotonic()
        whole = self.state.get(f"warm/{seed}") is None  # else an earlier process did part of this unit
        for name in arms:
            a = suite.arm(name)
            if "once" in a.tags and self.state.get(f"eval/{a.name}/0") is not None and seed > 0:
                continue
            self.run_arm(a, seed)
        minutes = (time.monotonic() - started) / 60
        key = f"unit/{seed}/S{self.plan.steps}/{','.join(map(str, self.plan.eval_steps))}"
        done = self.state.get(key) or {}
        total = done.get("minutes", 0.0) + minutes  # a resumed unit adds its parts
        whole = done.get("whole", False) if done else whole  # a rerun of a finished unit keeps its kind
        self.state.put(key, {"minutes": round(total, 1), "arms": arms, "whole": whole})
        if self.records_dir is not None:
            records.write(self.records_dir, records.unit_record(asdict(self.plan), seed, arms, total, whole))
        return total

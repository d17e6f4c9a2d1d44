"""The arms: the warm start, the methods after it, their training and their greedy evaluations."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from agentmem import model_refs
from agentmem.config import (
    HELD_OUT_SEED,
    DistillConfig,
    Divergence,
    DType,
    EvalConfig,
    KdForm,
    LrSchedule,
    Oversize,
    PolicySource,
    ReplayConfig,
    RewardKind,
    RLKind,
    RolloutConfig,
    SftConfig,
    TeacherTruncation,
)
from agentmem.jobs.distill import run_distill
from agentmem.jobs.eval import first_read_skips, run_eval
from agentmem.jobs.replay import run_replay
from agentmem.jobs.rollout import build_env, run_rollout
from agentmem.jobs.sft import run_sft
from agentmem.records import Checkpoint, SamplingContext
from agentmem.runtime import Runtime
from agentmem.training.checkpoints import carry_trainer_state, save_checkpoint
from agentmem.training.dynamics import round_warnings
from agentmem.training.schedule import lr_at
from bench.common.phases import State, say
from bench.learning import records, teachers
from bench.learning.plan import (
    ON_POLICY,
    ONCE,
    ORACLE_SEED,
    Plan,
    arm_flags,
    eval_key,
    rollout_seed,
    teacher_key,
    teacher_name,
    uses_teacher,
)
from store import repository as repo
from store.engine import open_store


class MissingCheckpoint(Exception):
    """A finished phase's checkpoint folder was deleted: the phases that start or distil from it cannot run."""


@dataclass
class Bench:
    store: object
    runtime: Runtime
    plan: Plan
    work: Path
    state: State
    heldout_tasks: dict[str, dict] = field(default_factory=dict)  # component -> task id -> Task (first_reads)
    records_dir: Path | None = None  # where each finished arm-seed and gated teacher writes its record (none: nowhere)

    def write_record(self, record: dict) -> None:
        if self.records_dir is not None:
            records.write(self.records_dir, record)

    # -- configs -------------------------------------------------------------------------------------------

    def ladder(self, level: int, names: str) -> dict:
        return {"level": level, "names": names, "forms": self.plan.forms}

    def heldout_sets(self, real: bool) -> list[tuple[str, EvalConfig]]:
        p = self.plan
        sets = [(f"level{lv}", EvalConfig(env="synthetic", env_knobs=self.ladder(lv, "heldout"), episodes=p.heldout_per_level,
                                          seed=HELD_OUT_SEED + lv, chunk_tokens=p.chunk_tokens,
                                          agent=p.agent(0.0, HELD_OUT_SEED)))
                for lv in p.heldout_levels]
        if real and p.hotpot:
            for name, env, knobs in (("hotpotqa", "hotpotqa", {"docs": 2}), ("ruler10", "ruler_hotpotqa", {"docs": 10})):
                sets.append((name, EvalConfig(env=env, data=p.hotpot, env_knobs=knobs, episodes=p.heldout_real,
                                              chunk_tokens=p.chunk_tokens, agent=p.agent(0.0, HELD_OUT_SEED))))
        return sets

    def training_rollout(self, domain: str, level: int, seed: int) -> RolloutConfig:
        p = self.plan
        if domain == "squad":
            return RolloutConfig(env="squad", data=p.squad, env_knobs={"docs": p.squad_docs}, episodes=p.rollout_tasks,
                                 group_size=p.group, seed=seed, chunk_tokens=p.chunk_tokens,
                                 agent=p.agent(p.temperature, seed, "squad"))
        return RolloutConfig(env="synthetic", env_knobs=self.ladder(level, "train"), episodes=p.rollout_tasks,
                             group_size=p.group, seed=seed, chunk_tokens=p.chunk_tokens,
                             agent=p.agent(p.temperature, seed))

    # -- phases --------------------------------------------------------------------------------------------

    def eval_dtype(self) -> str:
        def measure() -> str:
            if self.plan.eval_dtype != "auto":
                return self.plan.eval_dtype
            choice = model_refs.auto_dtype(self.store, self.plan.model)
            say(f"evaluations in {choice.dtype} ({choice.reason})")
            return choice.dtype
        return self.state.once("eval_dtype", measure)

    def fast_dtype(self) -> str:
        """The faster dtype of the model on this machine (``model_refs.auto_dtype``), measured once: the evaluations'
        measurement when theirs is ``auto``."""
        if self.plan.eval_dtype == "auto":
            return self.eval_dtype()

        def measure() -> str:
            choice = model_refs.auto_dtype(self.store, self.plan.model)
            say(f"faster dtype here: {choice.dtype} ({choice.reason})")
            return choice.dtype
        return self.state.once("fast_dtype", measure)

    def mixed(self) -> bool:
        """Whether training jobs run in mixed precision: the plan's ``on``/``off``, or for ``auto`` where bfloat16
        is the faster dtype here (native bf16: AMX, AVX512-BF16; emulated bf16 would make the steps slower)."""
        if self.plan.mixed_precision == "auto":
            return self.fast_dtype() == "bfloat16"
        return self.plan.mixed_precision == "on"

    def ckpt(self, ckpt_id: str) -> Checkpoint:
        with self.store.session() as s:
            return repo.get_checkpoint(s, ckpt_id)

    def kept(self, ckpt_id: str, phases: str) -> Checkpoint:
        """The checkpoint a finished phase made (a warm start, a teacher) that a method starts or distils from;
        raises MissingCheckpoint, naming the phases to re-make, when its folder was deleted since (the state file
        still holds the phase as done, so nothing would make it again)."""
        ckpt = self.ckpt(ckpt_id)
        if not Path(ckpt.path).is_dir():
            raise MissingCheckpoint(
                f"checkpoint {ckpt.path}, made by the phases {phases} of {self.work / 'state.json'}, no longer "
                f"exists: the methods that start or distil from it cannot run. Restore the folder, or delete those "
                f"phases from the state file so that the next run makes it again from the same config (on the same "
                f"machine and thread count the same weights: a re-made teacher's stored check equals the old one), "
                f"or use a new --work folder")
        return ckpt

    def base(self) -> Checkpoint:
        return model_refs.register(self.store, model_refs.resolve(self.store, self.plan.model))

    def oracle_runs(self, domain: str) -> list[str]:
        """The oracle rollouts SFT trains on: one per training level (ladder) or one on SQuAD."""
        p = self.plan
        tasks = max(16, (max(p.teacher_steps) * p.warm_calls_per_step) // 3)
        out = []
        for level in (p.train_levels if domain == "ladder" else [0]):
            def make(level=level) -> str:
                if domain == "squad":
                    config = RolloutConfig(env="squad", data=p.squad, env_knobs={"docs": p.squad_docs},
                                           policy=PolicySource.oracle, episodes=tasks, seed=ORACLE_SEED,
                                           chunk_tokens=p.chunk_tokens, model=p.model,
                                           agent=p.agent(1.0, ORACLE_SEED, "squad"))
                else:
                    config = RolloutConfig(env="synthetic", env_knobs=self.ladder(level, "train"), model=p.model,
                                           policy=PolicySource.oracle, episodes=tasks, seed=ORACLE_SEED + level,
                                           chunk_tokens=p.chunk_tokens, agent=p.agent(1.0, ORACLE_SEED))
                result = run_rollout(self.store, config, self.runtime)
                say(f"oracle rollout {domain} level {level}: {result.run_id}, {len(result.episodes)} episodes")
                return result.run_id
            out.append(self.state.once(f"oracle/{domain}/{level}", make))
        return out

    def sft(self, name: str, runs: list[str], student: str, steps: int, lr: float, seed: int, calls: int,
            save_every: int | None = None, carry: bool = False, first_moment: bool = True,
            context: SamplingContext = SamplingContext.aligned) -> list[dict]:
        config = SftConfig(run_ids=runs, student=student, steps=steps, invocations_per_step=calls, carry_optimizer=carry,
                           carry_first_moment=first_moment, context=context, mixed_precision=self.mixed(),
                           keep_optimizer=True,  # the methods carry the warm start's AdamW state
                           lr=lr, warmup_steps=self.plan.warmup, schedule=LrSchedule.cosine, seed=seed,
                           out=str(self.work / "ckpt" / name), save_every=save_every)
        result = run_sft(self.store, config, self.runtime)
        with self.store.session() as s:
            return [ckpt_json(c) for c in repo.list_checkpoints(s, result.run_id)]

    def validation(self, domain: str) -> EvalConfig:
        return teachers.validation(self, domain)

    def teacher_first_reads(self, key: str, pick: dict) -> dict[str, float] | None:
        return teachers.teacher_first_reads(self, key, pick)

    def teacher(self, key: str) -> str:
        """The validated teacher's checkpoint id (``teachers.teacher``)."""
        return teachers.teacher(self, key)

    def warm(self, domain: str, seed: int) -> dict:
        p = self.plan
        return self.state.once(f"warm/{domain}/{seed}", lambda: self.sft(
            f"warm-{domain}-{seed}", self.oracle_runs(domain), p.model, p.warm_steps, p.warm_lr, seed,
            p.warm_calls_per_step)[-1])

    def rollout(self, policy: Checkpoint, config: RolloutConfig, key: str) -> str:
        def make() -> dict:
            backend = model_refs.backend("transformers", policy.path, "float32", self.runtime)
            rolled = run_rollout(self.store, config.model_copy(update={"model": policy.path}), self.runtime,
                                 backend=backend, policy=policy)
            mean = float(np.mean([e.f1 or 0.0 for e in rolled.episodes]))
            say(f"rollout {rolled.run_id} of {policy.id[:8]} ({key}): F1 {mean:.3f}")
            return {"run": rolled.run_id, "f1": mean}
        return self.state.once(key, make)["run"]

    def psd_data(self, teacher: Checkpoint, config: RolloutConfig) -> str:
        key = f"data/psd_off/{config.env_knobs.get('level', config.env)}/{config.seed}"
        return self.rollout(teacher, config.model_copy(update={"context": SamplingContext.privileged}), key)

    def reopd_data(self, student: Checkpoint, oracle_run: str, seed: int) -> str:
        def make() -> dict:
            backend = model_refs.backend("transformers", student.path, "float32", self.runtime)
            config = ReplayConfig(teacher_run=oracle_run, model=student.path, group_size=4, kappa=0.6, seed=seed,
                                  max_batch=32)
            replayed = run_replay(self.store, config, self.runtime, backend=backend, policy=student)
            return {"run": replayed.run_id, "f1": float("nan")}
        return self.state.once(f"data/reopd/{student.id}/{oracle_run}/{seed}", make)["run"]

    def momentum(self, seed: int) -> dict:
        """The null method: the warm start's AdamW state, carried as every method carries it, stepped for the
        methods' ``steps`` at their schedule with zero gradients (``coast``). Every method's update starts as
        this move; what a method adds is its difference from it. When nothing moves with zero gradients (no
        first moment carried: ``Plan.coasts``) it is the warm start's checkpoint itself, evaluated once."""
        p = self.plan
        warm_json = self.warm("ladder", seed)
        if not p.coasts:
            return warm_json
        warm = self.kept(warm_json["id"], f"warm/ladder/{seed}")
        model, tok = model_refs.load(warm.path, "float32", self.runtime, trainable=True)
        params = [q for q in model.parameters() if q.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=p.lr)
        if not carry_trainer_state(Path(warm.path), optimizer):
            raise RuntimeError(f"{warm.path} kept no optimizer state to coast on")
        coast(optimizer, [lr_at(step, p.lr, p.steps, p.warmup, LrSchedule.cosine) for step in range(p.steps)])
        folder = save_checkpoint(self.work / "ckpt" / f"momentum-{seed}" / f"step-{p.steps:06d}", model, tok,
                                 optimizer, p.steps)
        with self.store.session() as s:
            ckpt = repo.register_checkpoint(s, str(folder), warm.base_model)
            s.commit()
        return ckpt_json(ckpt)

    def sft_more(self, seed: int) -> list[dict]:
        """SFT continued on the oracle calls; with a pilot, its checkpoints at every pilot step."""
        p = self.plan
        warm = self.kept(self.warm("ladder", seed)["id"], f"warm/ladder/{seed}")
        every = int(np.gcd.reduce(p.pilot_steps)) if p.pilot_steps else None
        ckpts = self.sft(f"sft_more-{seed}", self.oracle_runs("ladder"), warm.id, p.steps, p.lr, seed,
                         p.calls_per_step, carry=p.carry_warm_optimizer, first_moment=p.carry_warm_first_moment,
                         save_every=every)
        return [c for c in ckpts if c["step"] in p.pilot_steps] if p.pilot_steps else ckpts[-1:]

    def on_policy(self, arm: str, seed: int, *, steps: int | None = None, name: str | None = None,
                  seed_base: int = 100, kd_weight: float | None = None, keep: tuple[int, ...] = ()) -> list[dict]:
        """Rounds of (rollout of the current student on fresh training tasks, ``steps_per_round`` distill
        steps), one schedule over every round, AdamW carried from round 2 on. ``steps``: the budget (default the
        plan's); ``name``: the checkpoint folder (default ``ARM-SEED``); ``seed_base``: the rollout seeds'
        (``rollout_seed``); ``kd_weight``: the teacher's weight (default 1, or the plan's ``rl_kd_weight`` beside
        the RL term); ``keep``: the steps whose checkpoints stay (the others are deleted once the next round
        has its own). Returns one entry per round (its checkpoint and distill run)."""
        p = self.plan
        steps = steps or p.steps
        domain = "squad" if arm.startswith("squad") else "ladder"
        spec = dict(ON_POLICY[arm])
        kd, rl, seqkd = spec.pop("kd", False), spec.pop("rl", False), spec.pop("seqkd", False)
        spec.pop("teacher", None)
        key = teacher_key(p, arm, seed)
        teacher = None
        if kd or seqkd:
            if key.startswith(("rl-", "ladder-hint")):  # a teacher with headroom distils only past its gate
                teachers.gated(self, key, seed)
            teacher = self.kept(self.teacher(key), f"teacher/{key}/*")
        policy = self.kept(self.warm(domain, seed)["id"], f"warm/{domain}/{seed}")
        oracles = self.oracle_runs(domain)
        out = []
        for r in range(steps // p.steps_per_round):
            level = p.train_levels[r % len(p.train_levels)]
            seed_r = rollout_seed(seed, r, seed_base)
            config = self.training_rollout(domain, level, seed_r)
            if arm == "psd_off":
                runs = [self.psd_data(teacher, config)]
            elif arm == "reopd":
                runs = [self.reopd_data(policy, oracles[r % len(oracles)], seed_r)]
            elif seqkd and teacher is not None:  # the teacher's samples of the round's tasks, under its own prompt
                hint = key == "ladder-hint"
                sampled = config.model_copy(update={"context": SamplingContext.hint}) if hint else config
                runs = [self.rollout(teacher, sampled, f"data/seqkd/{teacher.id}/{seed_r}/{level}")]
            else:
                runs = [self.rollout(policy, config, f"rollout/{policy.id}/{seed_r}/{level}")]
            weight = kd_weight if kd_weight is not None else (p.rl_kd_weight if rl else 1.0)
            distill = DistillConfig(
                run_ids=runs, student=policy.id, teacher=teacher.id if teacher and kd else None,
                kd_weight=weight if kd else 0.0, ce_weight=1.0 if seqkd else 0.0,
                rl=RLKind.grpo if rl else RLKind.none, rl_weight=1.0 if rl else 0.0, steps=p.steps_per_round,
                invocations_per_step=p.calls_per_step, lr=p.lr, warmup_steps=p.warmup, schedule=LrSchedule.cosine,
                schedule_offset=r * p.steps_per_round, schedule_steps=steps,
                carry_optimizer=r > 0 or p.carry_warm_optimizer,
                carry_first_moment=r > 0 or p.carry_warm_first_moment,
                reward=RewardKind.max_f1_sub_em, monitor_start_kl=True, seed=seed,
                out=str(self.work / "ckpt" / (name or f"{arm}-{seed}")), oversize=Oversize.skip,
                teacher_truncation=TeacherTruncation.left, loss=Divergence(p.loss),
                teacher_temperature=p.teacher_temperature,
                teacher_min_confidence=p.teacher_min_confidence if kd else 0.0, mixed_precision=self.mixed(),
                **spec)
            done = run_distill(self.store, distill, self.runtime)
            if r > 0 and r * p.steps_per_round not in keep:  # the previous round's checkpoint is no longer needed
                prune(policy.path, weights=True)  # (a killed arm restarts from its warm start)
            policy = done.last_checkpoint
            with self.store.session() as s:
                train_steps = repo.list_train_steps(s, done.run_id)
            for w in round_warnings(train_steps, rl):
                say(f"warning: {arm} seed {seed} round {r + 1}: {w}")
            say(f"{name or arm} seed {seed} round {r + 1}/{steps // p.steps_per_round}: {distill.optim.steps} steps -> "
                f"{policy.id[:8]}")
            out.append({**ckpt_json(policy), "round": r + 1, "distill_run": done.run_id})
        return out

    def coefficient(self, arm: str, seed: int) -> list[dict]:
        """An arm with the teacher in the RL term's advantage (``KdForm.advantage``): one run per coefficient c of
        ``plan.teacher_coefs``, each validated greedily on the teacher's validation episodes, the best F1 kept
        (ties: the smaller c). One coefficient: that run alone, unvalidated."""
        p = self.plan
        if len(p.teacher_coefs) == 1:
            return self.on_policy(arm, seed, kd_weight=p.teacher_coefs[0])
        runs, scores = {}, {}
        for c in p.teacher_coefs:
            runs[c] = self.state.once(f"coef/{arm}/{seed}/{c}", lambda c=c: self.on_policy(
                arm, seed, kd_weight=c, name=f"{arm}-c{c}-{seed}"))

            def validate(c=c) -> float:
                ckpt, dtype = self.ckpt(runs[c][-1]["id"]), self.eval_dtype()
                config = self.validation("ladder").model_copy(update={"model": ckpt.path, "dtype": DType(dtype)})
                backend = model_refs.backend("transformers", ckpt.path, dtype, self.runtime)
                return float(run_eval(self.store, config, self.runtime, backend=backend, policy=ckpt).f1)
            scores[c] = self.state.once(f"coef/{arm}/{seed}/{c}/f1", validate)
        best = max(p.teacher_coefs, key=lambda c: (scores[c], -c))
        say(f"{arm} seed {seed}: c = {best} (validation F1 {', '.join(f'{c}: {v:.3f}' for c, v in scores.items())})")
        self.state.put(f"coef/{arm}/{seed}/pick", {"c": best, "f1": scores})
        for c in p.teacher_coefs:
            if c != best:
                prune(runs[c][-1]["path"], weights=True)
        return runs[best]

    def train(self, arm: str, seed: int) -> dict:
        """The arm's final checkpoint (the warm start for ``warm``/``squad_warm``), its distill runs, the pilot's
        checkpoints along the way (``along``: step -> checkpoint) and its wall seconds."""
        p = self.plan
        pilot = tuple(p.pilot_steps)

        def make() -> list[dict]:
            say(f"train {arm} seed {seed}")
            if arm == "warm":
                return [self.warm("ladder", seed)]
            if arm == "squad_warm":
                return [self.warm("squad", seed)]
            if arm == "teacher_ladder":  # the validated teacher itself: how far a student could follow it
                return [ckpt_json(self.kept(self.teacher("ladder"), "teacher/ladder/*"))]
            if arm == "teacher_hint":
                return [ckpt_json(self.kept(self.teacher("ladder-hint"), "teacher/ladder-hint/*"))]
            if arm == "teacher_rl":
                return [ckpt_json(self.kept(self.teacher(f"rl-{seed}"), f"teacher/rl-{seed}/*"))]
            if arm == "momentum":
                return [self.momentum(seed)]
            if arm == "sft_more":
                return self.sft_more(seed)
            if ON_POLICY[arm].get("kd_form") is KdForm.advantage:
                return self.coefficient(arm, seed)
            if arm == "grpo_long":  # the student's budget plus the RL steps T_rl cost
                return self.on_policy(arm, seed, steps=p.steps + p.rl_teacher_steps)
            return self.on_policy(arm, seed, keep=pilot)

        started = time.perf_counter()
        ckpts = self.state.once(f"arm/{arm}/{seed}", make)
        if self.state.get(f"time/{arm}/{seed}") is None:
            self.state.put(f"time/{arm}/{seed}", time.perf_counter() - started)
        # the methods go on from the warm start's optimizer state (and a momentum arm that did not move is the warm start)
        warm_start = arm in ("warm", "squad_warm") or (arm == "momentum" and not p.coasts)
        if not (warm_start and p.carry_warm_optimizer):
            prune(ckpts[-1]["path"], weights=False)  # the optimizer state of a finished arm is never read again
        along = {}
        for c in ckpts:
            step = c.get("round", 0) * p.steps_per_round if "round" in c else c.get("step")
            if pilot and step in pilot:
                along[step] = c
        return {"final": ckpts[-1], "distill_runs": [c["distill_run"] for c in ckpts if "distill_run" in c],
                "along": along, "seconds": self.state.get(f"time/{arm}/{seed}")}

    def evaluate(self, arm: str, seed: int, ckpt: Checkpoint, ladder: bool, real: bool) -> dict:
        """Per component: F1 per question (sorted by task id, so arms pair up) and the greedy empty-output
        rate per call kind."""
        key = eval_key(arm, seed, ladder, real)
        if arm == "momentum" and not self.plan.coasts:  # the warm start's own checkpoint: its evaluation, read once
            def same() -> dict:
                warm = self.evaluate("warm", seed, ckpt, *arm_flags("warm"))
                names = {n for n, _ in self.heldout_sets(real) if ladder or not n.startswith("level")}
                return {part: {n: v for n, v in values.items() if n in names} for part, values in warm.items()}
            return self.state.once(key, same)

        def make() -> dict:
            say(f"evaluate {arm} seed {seed}")
            dtype = self.eval_dtype()
            backend = model_refs.backend("transformers", ckpt.path, dtype, self.runtime)
            out: dict = {"scores": {}, "empty": {}, "length": {}, "forgot": {}, "runs": {}}
            for name, config in self.heldout_sets(real):
                if not ladder and name.startswith("level"):
                    continue
                # T_hint is evaluated as it teaches: each update under its hint line
                context = SamplingContext.hint if arm == "teacher_hint" else SamplingContext.aligned
                row = run_eval(self.store, config.model_copy(update={"model": ckpt.path, "dtype": DType(dtype),
                                                                     "context": context}),
                               self.runtime, backend=backend, policy=ckpt)
                with self.store.session() as s:
                    episodes = sorted(repo.list_episodes(s, row.run_id), key=lambda e: (e.task_id, e.sample_index))
                out["scores"][name] = [float(e.f1 or 0.0) for e in episodes]
                out["empty"][name] = row.metrics.get("empty_by_kind", {})
                out["length"][name] = row.metrics.get("out_len_by_kind", {})
                out["forgot"][name] = row.metrics.get("empty_after_evidence")
                out["runs"][name] = row.run_id
            return out
        return self.state.once(key, make)

    def finish(self, arm: str, seed: int) -> tuple[dict, dict]:
        """Train and evaluate one arm-seed (in a pilot, its checkpoints along the way too) and write its record:
        (``train``'s result, ``evaluate``'s). Raises NoTeacher when its teacher fails the gate."""
        ladder, real = arm_flags(arm)
        trained = self.train(arm, seed)
        evaluation = self.evaluate(arm, seed, self.ckpt(trained["final"]["id"]), ladder, real)
        along = {step: evaluation if c["id"] == trained["final"]["id"] else
                 self.evaluate(f"{arm}@{step}", seed, self.ckpt(c["id"]), True, False)
                 for step, c in sorted(trained["along"].items())}
        self.write_record(self.record(arm, seed, trained, evaluation, along))
        return trained, evaluation

    def real_text(self, arm: str, seed: int) -> dict:
        """A teacher's best arm (``records.best_arms``, picked on the held-out ladder) on real text: its final
        checkpoint's evaluation there, recorded as ``ARM@real``. An arm evaluated on real text already reuses it."""
        trained = self.train(arm, seed)
        real_already = arm_flags(arm)[1]
        evaluation = self.evaluate(arm, seed, self.ckpt(trained["final"]["id"]), real_already, True)
        teacher = teacher_name(teacher_key(self.plan, arm, seed)) if uses_teacher(arm) else None
        scores = {c: v for c, v in evaluation["scores"].items() if not c.startswith("level")}
        self.write_record(records.arm_record(asdict(self.plan), arm + records.REAL, seed, teacher=teacher,
                                             scores=scores, dynamics={}, ledger={}))
        return evaluation

    def record(self, arm: str, seed: int, trained: dict, evaluation: dict, along: dict) -> dict:
        """The arm-seed's record (``records.arm_record``): held-out scores, the dynamics summary of its training
        steps and the ledger (steps; rollout, teacher-forward and student tokens; wall seconds)."""
        p = self.plan
        with self.store.session() as s:
            runs = list(trained["distill_runs"])
            if not runs and arm == "sft_more":
                runs = [repo.get_checkpoint(s, trained["final"]["id"]).run_id]
            train_steps = [st for rid in runs for st in repo.list_train_steps(s, rid)]
            sampled = sorted({r for rid in trained["distill_runs"] for r in repo.get_run(s, rid).config.get("run_ids", [])})
            rollout_tokens = sum(i.prompt_tokens + i.output_tokens
                                 for i in repo.stream_invocations(s, run_ids=sampled)) if sampled else 0
        student_tokens = sum(st.tokens for st in train_steps)
        ledger = {"steps": len(train_steps), "rollout_tokens": rollout_tokens,
                  # what the online teacher read: each trained call under its context (hint line, history, splice)
                  "teacher_forward_tokens": int(sum(st.metrics.get("teacher_tokens", 0) for st in train_steps)),
                  "student_tokens": student_tokens,
                  "wall_seconds": trained.get("seconds")}
        teacher = teacher_name(teacher_key(p, arm, seed)) if uses_teacher(arm) else None
        extra = {"empty": evaluation.get("empty", {}), "empty_after_evidence": evaluation.get("forgot", {}),
                 "along": {str(step): ev["scores"] for step, ev in along.items()},
                 "coef": self.state.get(f"coef/{arm}/{seed}/pick")}
        return records.arm_record(asdict(p), arm, seed, teacher=teacher, scores=evaluation["scores"],
                                  dynamics=records.dynamics([st.metrics for st in train_steps]), ledger=ledger,
                                  once=arm in ONCE, extra=extra)

    def first_reads(self, evals: list[dict]) -> list[dict[str, float] | None]:
        """Per seed's evaluation: ``first_read_skips`` over its held-out ladder calls (every level together),
        read back from the store, so folders evaluated before the metric existed report it too."""
        if not self.heldout_tasks:
            tok = model_refs.load_tokenizer(self.base().path)
            self.heldout_tasks.update({name: {t.task_id: t for t in build_env(c, tok).tasks(c.episodes)}
                                       for name, c in self.heldout_sets(False)})
        out = []
        for e in evals:
            calls, task_of = [], {}
            with self.store.session() as s:
                for name, run in e.get("runs", {}).items():
                    if name in self.heldout_tasks:
                        calls += repo.stream_invocations(s, run_ids=[run])
                        task_of |= {ep.id: self.heldout_tasks[name][ep.task_id] for ep in repo.list_episodes(s, run)
                                    if ep.task_id in self.heldout_tasks[name]}
            out.append(first_read_skips(calls, task_of))
        return out


def coast(optimizer: torch.optim.Optimizer, lrs: list[float]) -> None:
    """One ``optimizer`` step per learning rate in ``lrs`` with every gradient zero: what a carried Adam state
    alone moves the weights by (the first moment decays by beta1 a step and keeps pushing along the warm start's
    direction; the second moment sets the scale)."""
    params = [q for g in optimizer.param_groups for q in g["params"]]
    for lr in lrs:
        for g in optimizer.param_groups:
            g["lr"] = lr
        for q in params:
            q.grad = torch.zeros_like(q)
        optimizer.step()
    for q in params:
        q.grad = None


def prune(folder: str, weights: bool) -> None:
    """Free disk: a checkpoint's optimizer state (1 GB for the 135M model), and its weights too when asked."""
    path = Path(folder)
    (path / "trainer_state.pt").unlink(missing_ok=True)
    if weights:
        for f in path.glob("*.safetensors"):
            f.unlink()


def ckpt_json(c: Checkpoint) -> dict:
    return {"id": c.id, "step": c.step, "path": c.path}


# -- main ------------------------------------------------------------------------------------------------


def quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def open_bench(work: Path, plan: Plan, threads: int, records_dir: Path | None = None) -> Bench:
    # a later run may add arms, or training seeds, to the same folder: every phase of seed s is named by s and
    # made from seed s's own data (rollouts 100 + 10 s + round), so more seeds leave the earlier ones' phases valid
    state = State(work / "state.json", plan, free=("arms", "seeds"))
    runtime = Runtime.create("cpu", threads)
    store = open_store(f"sqlite:///{work / 'learning.db'}", create=True)
    return Bench(store, runtime, plan, work, state, records_dir=records_dir)

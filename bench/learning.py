"""The learning benchmark: does training from the store make the memory agent better, and which method helps most?

Every arm starts from the default model (SmolLM2-135M-Instruct), gets the same budget (``steps`` optimiser
steps of ``calls_per_step`` stored calls each) and the same seeds, and is scored greedily on the same
held-out tasks: unseen seeds (``HELD_OUT_SEED``) of the synthetic ladder levels ``--heldout-levels``, plus
the shared HotpotQA file (its gold paragraphs only, when ``../shared`` is there). The arms:

  base              no training;
  sft               cross-entropy on oracle calls (``agentmem rollout --policy oracle`` + ``agentmem sft``);
  opd_aligned       on-policy distillation, teacher in the ``aligned`` context (the student's own state);
  opd_persistent    the same with the teacher on the flattened episode history (``persistent``);
  opd_privileged    the same with the teacher also shown the gold answer and evidence (``privileged``);
  grpo              the RL term only (group-relative advantages on the final F1, groups of ``--group``);
  opd_grpo          on-policy distillation (aligned) + the RL term;
  opd_persistent_chat  the teacher on the episode history as one well-formed chat (``persistent_chat``);
  demopsd           aligned, towards DemoPSD's barycenter target (``--target barycenter``, defaults);
  opsd_clip         aligned, each token's divergence clipped at 1 nat, plus a 0.1 KL anchor to the
                    starting model (OPSD's clip and OPTD's frozen anchor; both values the project's choice);
  psd_off           PSD off-policy: the tokens were sampled by the teacher under the privileged prompt
                    (``rollout --context privileged``), scored by it under that prompt, the student trained
                    on them from the plain prompt (PSD on-policy is ``opd_privileged``);
  psd_mixed         PSD mixed: half of each step from the student's rollout, half from the privileged one;
  reopd             ReOPD: the student samples one call per oracle episode (step t drawn with prob. ∝ 0.6^t)
                    from the oracle's stored prompt (its memory), the teacher scores it there (aligned).

Every arm's student starts from the base model and takes the same steps x calls (PSD's paper starts the
student from the SFT checkpoint; here that would give its arms more student updates than the others).

The on-policy arms run ``agentmem train``'s loop: ``rounds`` x (a sampled rollout of the current student on
training tasks of level ``--train-level``, ``steps / rounds`` distill steps on it). Their teacher is the
stronger model that fits on this CPU: the default model fine-tuned on oracle calls (``--teacher-steps``
SFT steps; with the default it is the ``sft`` arm's final checkpoint). That is what the paper's setting,
a larger teacher, becomes at this scale; ``--teacher PATH`` takes any local model folder with the same
tokenizer instead.

Everything goes to one SQLite store (``WORK/learning.db``); a finished phase is recorded in
``WORK/state.json`` and skipped when the benchmark is run again on the same folder, so a killed run resumes.
Intervals are percentile-bootstrap 95% intervals over held-out episodes (differences: paired bootstrap over
the same tasks). Outputs: ``WORK/learning.md`` (the table), ``WORK/learning.png`` (F1 against step, every
arm), and the last line ``trained_minus_base=<d> aligned_minus_persistent=<d> opd_rl_minus_rl=<d>
best_method=<arm> best_minus_sft=<d>`` (best_method: the best arm other than sft, the methods' yardstick).

  .venv/bin/python bench/learning.py --quick --work /tmp/learning-quick   # about 30 minutes, 2 threads
  .venv/bin/python bench/learning.py --work /tmp/learning                 # the full run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentmem import models  # noqa: E402
from agentmem.config import (  # noqa: E402
    HELD_OUT_SEED,
    AgentConfig,
    DistillConfig,
    DistillTarget,
    EvalConfig,
    Oversize,
    PolicySource,
    PsdMode,
    ReplayConfig,
    RLKind,
    RolloutConfig,
    SftConfig,
    TeacherTruncation,
    TrainConfig,
)
from agentmem.jobs.distill import run_distill  # noqa: E402
from agentmem.jobs.eval import run_eval  # noqa: E402
from agentmem.jobs.replay import run_replay  # noqa: E402
from agentmem.jobs.rollout import run_rollout  # noqa: E402
from agentmem.jobs.sft import run_sft  # noqa: E402
from agentmem.records import Checkpoint, TeacherContext  # noqa: E402
from agentmem.runtime import Runtime  # noqa: E402
from envs.metrics import bootstrap_ci  # noqa: E402
from store import repository as repo  # noqa: E402
from store.engine import open_store  # noqa: E402

ARMS = ("base", "sft", "opd_aligned", "opd_persistent", "opd_privileged", "grpo", "opd_grpo",
        "opd_persistent_chat", "demopsd", "opsd_clip", "psd_off", "psd_mixed", "reopd")
# what each on-policy arm changes in DistillConfig (kd: a teacher term; rl: the GRPO term)
ON_POLICY: dict[str, dict] = {
    "opd_aligned": {"kd": True},
    "opd_persistent": {"kd": True, "context": TeacherContext.persistent},
    "opd_privileged": {"kd": True, "context": TeacherContext.privileged},
    "grpo": {"rl": True},
    "opd_grpo": {"kd": True, "rl": True},
    "opd_persistent_chat": {"kd": True, "context": TeacherContext.persistent_chat},
    "demopsd": {"kd": True, "target": DistillTarget.barycenter},
    "opsd_clip": {"kd": True, "jsd_clip": 1.0, "anchor_weight": 0.1},
    "psd_off": {"kd": True, "context": TeacherContext.privileged, "psd": PsdMode.off_policy},
    "psd_mixed": {"kd": True, "context": TeacherContext.privileged, "psd": PsdMode.mixed},
    "reopd": {"kd": True},
}
HOTPOT = ROOT.parent / "shared" / "data" / "hotpotqa" / "hotpot_dev_distractor_v1_first103.json"


@dataclass(frozen=True)
class Plan:
    """Every knob of one benchmark run (stored in ``state.json``; a resumed run must match it)."""

    steps: int
    rounds: int
    calls_per_step: int
    rollout_tasks: int  # training tasks per on-policy round (each sampled ``group`` times)
    group: int
    heldout_per_level: int
    heldout_hotpot: int
    curve_episodes: int  # held-out episodes per component at the intermediate points of the curve
    curve_rounds: list[int]  # rounds after which an on-policy arm is evaluated (the last is the final point)
    train_level: int = 1
    heldout_levels: list[int] = field(default_factory=lambda: [0, 1])
    teacher_steps: int | None = None  # None: the sft arm's steps (its final checkpoint is the teacher)
    teacher: str | None = None  # a model folder used as the teacher instead
    lr: float = 5e-5
    chunk_tokens: int = 128
    memory_tokens: int = 32
    answer_tokens: int = 8
    temperature: float = 1.0
    seed: int = 0
    hotpot: str | None = None

    @property
    def steps_per_round(self) -> int:
        return self.steps // self.rounds

    def agent(self, temperature: float, seed: int) -> AgentConfig:
        return AgentConfig(memory_tokens=self.memory_tokens, answer_max_new_tokens=self.answer_tokens,
                           temperature=temperature, seed=seed, max_batch=32)


def make_plan(args: argparse.Namespace) -> Plan:
    hotpot = args.hotpot or (str(HOTPOT) if HOTPOT.exists() else None)
    if args.smoke:  # a check that every phase runs, in a few minutes; its numbers mean nothing
        plan = Plan(steps=2, rounds=1, calls_per_step=4, rollout_tasks=2, group=2, heldout_per_level=2,
                    heldout_hotpot=2, curve_episodes=2, curve_rounds=[1], hotpot=hotpot)
    elif args.quick:
        plan = Plan(steps=8, rounds=1, calls_per_step=8, rollout_tasks=4, group=4, heldout_per_level=16,
                    heldout_hotpot=8, curve_episodes=8, curve_rounds=[1], heldout_levels=[0, 1], hotpot=hotpot)
    else:
        plan = Plan(steps=16, rounds=2, calls_per_step=8, rollout_tasks=4, group=4, heldout_per_level=70,
                    heldout_hotpot=60, curve_episodes=12, curve_rounds=[1, 2], heldout_levels=[0, 1],
                    hotpot=hotpot)
    updates = {k: v for k, v in (("lr", args.lr), ("train_level", args.train_level), ("teacher", args.teacher),
                                 ("teacher_steps", args.teacher_steps)) if v is not None}
    if args.heldout_levels:
        updates["heldout_levels"] = [int(x) for x in args.heldout_levels.split(",")]
    if args.heldout_per_level:
        updates["heldout_per_level"] = args.heldout_per_level
    plan = Plan(**{**asdict(plan), **updates})
    if plan.steps % plan.rounds:
        raise SystemExit(f"steps ({plan.steps}) must be a multiple of rounds ({plan.rounds})")
    return plan


class State:
    """Finished phases, by name, in ``state.json`` (written after every phase)."""

    def __init__(self, path: Path, plan: Plan):
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {"plan": asdict(plan), "phases": {}}
        if self.data["plan"] != asdict(plan):
            raise SystemExit(f"{path} was made by another plan; use a new --work folder")

    def get(self, name: str):
        return self.data["phases"].get(name)

    def put(self, name: str, value) -> None:
        self.data["phases"][name] = value
        self.path.write_text(json.dumps(self.data, indent=1))


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- held-out evaluation -------------------------------------------------------------------------------

def heldout_sets(plan: Plan, per_component: int | None = None) -> list[tuple[str, EvalConfig]]:
    """(name, config) of each held-out component; ``per_component`` caps the episodes (the first n tasks)."""
    def n(full: int) -> int:
        return min(full, per_component) if per_component else full

    sets = [(f"level{lv}", EvalConfig(env="synthetic", env_knobs={"level": lv}, episodes=n(plan.heldout_per_level),
                                      chunk_tokens=plan.chunk_tokens, agent=plan.agent(0.0, HELD_OUT_SEED)))
            for lv in plan.heldout_levels]
    if plan.hotpot and plan.heldout_hotpot:
        sets.append(("hotpotqa", EvalConfig(env="hotpotqa", data=plan.hotpot, env_knobs={"docs": 2},
                                            episodes=n(plan.heldout_hotpot), chunk_tokens=plan.chunk_tokens,
                                            agent=plan.agent(0.0, HELD_OUT_SEED))))
    return sets


def evaluate(store, runtime: Runtime, plan: Plan, policy: Checkpoint, step: int, final: bool) -> dict:
    """Held-out F1 of ``policy`` per component (one float per episode, sorted by task id, so the lists of
    two arms pair up task by task)."""
    backend = models.backend("transformers", policy.path, "float32", runtime)
    out: dict[str, list[float]] = {}
    for name, config in heldout_sets(plan, None if final else plan.curve_episodes):
        row = run_eval(store, config.model_copy(update={"model": policy.path}), runtime, backend=backend,
                       policy=policy, step=step)
        with store.session() as s:  # sorted by task id: every arm lists the same tasks in the same order
            episodes = sorted(repo.list_episodes(s, row.run_id), key=lambda e: (e.task_id, e.sample_index))
        out[name] = [float(e.f1 or 0.0) for e in episodes]
    return out


def flat(scores: dict[str, list[float]]) -> list[float]:
    return [v for name in sorted(scores) for v in scores[name]]


# -- arms ----------------------------------------------------------------------------------------------

def oracle_run(store, runtime: Runtime, plan: Plan, state: State) -> str:
    if state.get("oracle"):
        return state.get("oracle")
    # enough calls for the largest SFT: every call of a task is (chunks + 1) calls; draw epochs otherwise
    tasks = max(16, (max(plan.steps, plan.teacher_steps or 0) * plan.calls_per_step) // 3)
    config = RolloutConfig(env="synthetic", env_knobs={"level": plan.train_level}, policy=PolicySource.oracle,
                           episodes=tasks, seed=plan.seed, chunk_tokens=plan.chunk_tokens,
                           agent=plan.agent(1.0, plan.seed))
    result = run_rollout(store, config, runtime)
    mean = float(np.mean([e.f1 or 0.0 for e in result.episodes]))
    say(f"oracle rollout {result.run_id}: {len(result.episodes)} episodes, F1 {mean:.3f}")
    state.put("oracle", result.run_id)
    return result.run_id


def sft_arm(store, runtime: Runtime, plan: Plan, work: Path, oracle: str, steps: int, name: str) -> list[dict]:
    """SFT on the oracle run; a checkpoint at every round boundary (the on-policy arms' x positions)."""
    config = SftConfig(run_ids=[oracle], steps=steps, invocations_per_step=plan.calls_per_step, lr=plan.lr,
                       seed=plan.seed, out=str(work / "ckpt" / name),
                       save_every=plan.steps_per_round if steps == plan.steps else None)
    result = run_sft(store, config, runtime)
    with store.session() as s:
        ckpts = repo.list_checkpoints(s, result.run_id)
    return [ckpt_json(c) for c in ckpts]


def ckpt_json(c: Checkpoint) -> dict:
    return {"id": c.id, "step": c.step, "path": c.path}


def on_policy_arm(store, runtime: Runtime, plan: Plan, work: Path, arm: str, teacher: str | None,
                  state: State, base: Checkpoint) -> list[dict]:
    """``rounds`` x (sampled rollout of the current student, ``steps / rounds`` distill steps on it): the
    rounds of ``agentmem train`` (``TrainConfig.round_configs``). A rollout is a function of (policy, seed),
    so the first round's rollout of the base model is made once and shared by every on-policy arm."""
    spec = dict(ON_POLICY[arm])
    kd, rl = spec.pop("kd", False), spec.pop("rl", False)
    distill = DistillConfig(
        teacher=teacher if kd else None, kd_weight=1.0 if kd else 0.0,
        rl=RLKind.grpo if rl else RLKind.none, rl_weight=1.0 if rl else 0.0, steps=plan.steps_per_round,
        invocations_per_step=plan.calls_per_step, lr=plan.lr, out=str(work / "ckpt" / arm),
        oversize=Oversize.skip, teacher_truncation=TeacherTruncation.left, **spec)
    rollout = RolloutConfig(env="synthetic", env_knobs={"level": plan.train_level}, episodes=plan.rollout_tasks,
                            group_size=plan.group, seed=plan.seed, chunk_tokens=plan.chunk_tokens,
                            agent=plan.agent(plan.temperature, plan.seed))
    loop = TrainConfig(rounds=plan.rounds, seed=plan.seed, rollout=rollout, distill=distill)
    policy, out = base, []
    for r in range(plan.rounds):
        rollout_cfg, distill_cfg = loop.round_configs(r, policy.id)
        key = f"rollout/{policy.id}/{rollout_cfg.seed}"
        if arm not in OFF_POLICY and not state.get(key):
            backend = models.backend("transformers", policy.path, "float32", runtime)
            rolled = run_rollout(store, rollout_cfg.model_copy(update={"model": policy.path}), runtime,
                                 backend=backend, policy=policy)
            mean = float(np.mean([e.f1 or 0.0 for e in rolled.episodes]))
            state.put(key, {"run": rolled.run_id, "f1": mean})
            say(f"{arm} round {r + 1}: rollout {rolled.run_id} of {policy.id[:8]}, F1 {mean:.3f}")
        if arm in OFF_POLICY:  # psd_off: the teacher's samples, made once; reopd: the current student's replay
            key = off_policy_data(store, runtime, arm, rollout_cfg, teacher, policy, state)
        runs = [state.get(key)["run"]]
        if arm == "psd_mixed":
            runs.append(state.get(off_policy_data(store, runtime, "psd_off", rollout_cfg, teacher, policy,
                                                  state))["run"])
        done = run_distill(store, distill_cfg.model_copy(update={"run_ids": runs}), runtime)
        policy = done.last_checkpoint
        say(f"{arm} round {r + 1}: {distill_cfg.steps} steps -> {policy.id[:8]}")
        out.append({**ckpt_json(policy), "step": (r + 1) * plan.steps_per_round, "round": r + 1,
                    "rollout_f1": state.get(key)["f1"]})
    return out


OFF_POLICY = ("psd_off", "reopd")


def off_policy_data(store, runtime: Runtime, arm: str, rollout_cfg: RolloutConfig, teacher: str,
                    student: Checkpoint, state: State) -> str:
    """The state key of the stored calls an off-policy arm trains on: for ``psd_off`` the teacher's rollout
    under the privileged prompt (same tasks and seed as the on-policy rollouts; one for every round), for
    ``reopd`` the current student's replay of one call per oracle episode (``group`` samples each)."""
    key = "data/psd_off" if arm == "psd_off" else f"data/reopd/{student.id}"  # the replay is the student's
    if state.get(key):
        return key
    if arm == "psd_off":
        ckpt = _load_ckpt(store, teacher)
        backend = models.backend("transformers", ckpt.path, "float32", runtime)
        rolled = run_rollout(store, rollout_cfg.model_copy(update={"model": ckpt.path,
                                                                   "context": TeacherContext.privileged}),
                             runtime, backend=backend, policy=ckpt)
        mean = float(np.mean([e.f1 or 0.0 for e in rolled.episodes]))
        state.put(key, {"run": rolled.run_id, "f1": mean})
        say(f"psd_off: privileged rollout {rolled.run_id} of the teacher {teacher[:8]}, F1 {mean:.3f}")
    else:
        backend = models.backend("transformers", student.path, "float32", runtime)
        config = ReplayConfig(teacher_run=state.get("oracle"), model=student.path, group_size=4, kappa=0.6,
                              seed=rollout_cfg.seed, max_batch=32)
        replayed = run_replay(store, config, runtime, backend=backend, policy=student)
        state.put(key, {"run": replayed.run_id, "f1": float("nan")})
        say(f"reopd: replay run {replayed.run_id}, {len(replayed.episodes)} branched calls")
    return key


# -- report --------------------------------------------------------------------------------------------

def ci(values: list[float]) -> tuple[float, float]:
    return bootstrap_ci(values, n=2000, seed=0)


def paired_diff(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Mean of a - b over the same tasks, with a paired bootstrap 95% interval."""
    d = [x - y for x, y in zip(a, b, strict=True)]
    lo, hi = ci(d)
    return float(np.mean(d)), lo, hi


def report(plan: Plan, evals: dict[str, dict[int, dict]], work: Path) -> str:
    final = {arm: evals[arm][max(evals[arm])] for arm in evals}
    base = flat(final["base"])
    lines = ["| arm | steps | held-out F1 | 95% interval | " + " | ".join(sorted(final["base"])) + " | vs base |",
             "|---|---:|---:|---|" + "---:|" * len(final["base"]) + "---|"]
    for arm in ARMS:
        if arm not in final:
            continue
        values = flat(final[arm])
        lo, hi = ci(values)
        parts = " | ".join(f"{np.mean(final[arm][c]):.3f}" for c in sorted(final[arm]))
        d, dlo, dhi = paired_diff(values, base)
        lines.append(f"| {arm} | {max(evals[arm])} | {np.mean(values):.3f} | [{lo:.3f}, {hi:.3f}] | {parts} | "
                     f"{d:+.3f} [{dlo:+.3f}, {dhi:+.3f}] |")
    n = len(base)
    table = "\n".join(lines) + f"\n\n{n} held-out episodes per arm; components: " + ", ".join(
        f"{c} ({len(final['base'][c])})" for c in sorted(final["base"]))
    (work / "learning.md").write_text(table + "\n")
    plot(evals, work / "learning.png")
    return table


def plot(evals: dict[str, dict[int, dict]], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    base0 = flat(evals["base"][0])
    trained = [a for a in ARMS if a in evals and a != "base"]
    last = max(max(evals[a]) for a in trained) if trained else 1
    for k, arm in enumerate(trained):
        shift = (k - (len(trained) - 1) / 2) * last / 150  # side by side, so the intervals do not hide each other
        xs, ys, err = [], [], [[], []]
        for step in [0, *sorted(evals[arm])]:
            v = base0 if step == 0 else flat(evals[arm][step])
            lo, hi = ci(v)
            mean = float(np.mean(v))
            xs.append(step + shift)
            ys.append(mean)
            err[0].append(mean - lo)
            err[1].append(hi - mean)
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=arm)
    ax.axhline(float(np.mean(base0)), color="grey", linestyle="--", label="base")
    ax.set_xlabel("optimiser step (same calls per step for every arm)")
    ax.set_ylabel("held-out F1 (95% bootstrap interval)")
    ax.set_title("Learning benchmark: held-out F1 against training step")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer steps and held-out episodes (about 30 minutes)")
    ap.add_argument("--smoke", action="store_true", help="the smallest plan: checks that every phase runs")
    ap.add_argument("--work", type=Path, default=Path("learning-bench"), help="folder for the store and outputs")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of: " + ", ".join(ARMS))
    ap.add_argument("--lr", type=float)
    ap.add_argument("--train-level", type=int)
    ap.add_argument("--heldout-levels", help="comma-separated ladder levels, e.g. 0,1,2")
    ap.add_argument("--heldout-per-level", type=int)
    ap.add_argument("--teacher", help="a local model folder to use as the teacher (same tokenizer)")
    ap.add_argument("--teacher-steps", type=int, help="SFT steps of the teacher (default: the arms' steps)")
    ap.add_argument("--hotpot", help="HotpotQA file for the held-out set (default: the shared one if present)")
    args = ap.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown or "base" not in arms:
        raise SystemExit(f"--arms: unknown {unknown}" if unknown else "--arms must include base")
    plan = make_plan(args)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    state = State(work / "state.json", plan)
    runtime = Runtime.create("cpu", args.threads)
    store = open_store(f"sqlite:///{work / 'learning.db'}", create=True)
    t0 = time.perf_counter()
    say(f"plan: {json.dumps(asdict(plan))}")

    base_ckpt = models.register(store, models.resolve(store, "default"))
    evals: dict[str, dict[int, dict]] = {}

    def evaluated(arm: str, ckpt: dict | Checkpoint, step: int, final: bool) -> None:
        key = f"eval/{arm}/{step}"
        if not state.get(key):
            c = ckpt if isinstance(ckpt, Checkpoint) else _load_ckpt(store, ckpt["id"])
            say(f"evaluate {arm} at step {step} ({'final' if final else 'curve'})")
            state.put(key, evaluate(store, runtime, plan, c, step, final))
        evals.setdefault(arm, {})[step] = state.get(key)

    evaluated("base", base_ckpt, 0, True)
    oracle = oracle_run(store, runtime, plan, state) if set(arms) & {"sft", *ARMS[2:]} else None

    teacher = plan.teacher
    for arm in arms:
        if arm == "base":
            continue
        if not state.get(f"arm/{arm}"):
            say(f"train {arm}")
            if arm == "sft":
                ckpts = sft_arm(store, runtime, plan, work, oracle, plan.steps, "sft")
            else:
                if teacher is None:
                    teacher = teacher_checkpoint(store, runtime, plan, work, oracle, state)
                ckpts = on_policy_arm(store, runtime, plan, work, arm, teacher, state, base_ckpt)
            state.put(f"arm/{arm}", ckpts)
        ckpts = state.get(f"arm/{arm}")
        points = {c["step"]: c for c in ckpts}
        for r in plan.curve_rounds:
            step = r * plan.steps_per_round
            if step in points:
                evaluated(arm, points[step], step, final=step == plan.steps)
        prune(ckpts, keep_weights={ckpts[-1]["id"]})

    table = report(plan, evals, work)
    print(table)
    finals = {arm: flat(evals[arm][plan.steps]) for arm in evals if arm != "base" and plan.steps in evals[arm]}
    base = flat(evals["base"][0])
    best = max(finals, key=lambda a: np.mean(finals[a])) if finals else None
    trained = paired_diff(finals[best], base)[0] if best else float("nan")

    def diff(a: str, b: str) -> float:
        return paired_diff(finals[a], finals[b])[0] if a in finals and b in finals else float("nan")

    say(f"done in {(time.perf_counter() - t0) / 60:.1f} min; best arm: {best}; outputs in {work}")
    methods = {a: v for a, v in finals.items() if a != "sft"}
    best_method = max(methods, key=lambda a: np.mean(methods[a])) if methods else None
    print(f"trained_minus_base={trained:.3f} aligned_minus_persistent={diff('opd_aligned', 'opd_persistent'):.3f} "
          f"opd_rl_minus_rl={diff('opd_grpo', 'grpo'):.3f} best_method={best_method} "
          f"best_minus_sft={diff(best_method, 'sft') if best_method else float('nan'):.3f}")


def prune(ckpts: list[dict], keep_weights: set[str]) -> None:
    """Free disk once an arm is trained and evaluated: every optimizer state, and the weights of the
    checkpoints not in ``keep_weights`` (a 135M checkpoint is 0.5 GB of weights + 1 GB of AdamW state)."""
    for c in ckpts:
        folder = Path(c["path"])
        (folder / "trainer_state.pt").unlink(missing_ok=True)
        if c["id"] not in keep_weights:
            for f in folder.glob("*.safetensors"):
                f.unlink()


def _load_ckpt(store, ckpt_id: str) -> Checkpoint:
    with store.session() as s:
        return repo.get_checkpoint(s, ckpt_id)


def teacher_checkpoint(store, runtime: Runtime, plan: Plan, work: Path, oracle: str, state: State) -> str:
    """The teacher's checkpoint id: the sft arm's final one, or a separate SFT of ``teacher_steps``."""
    steps = plan.teacher_steps or plan.steps
    if steps == plan.steps and state.get("arm/sft"):
        return state.get("arm/sft")[-1]["id"]
    if not state.get("teacher"):
        say(f"train the teacher: SFT on oracle calls, {steps} steps")
        state.put("teacher", sft_arm(store, runtime, plan, work, oracle, steps, "teacher")[-1])
    return state.get("teacher")["id"]


if __name__ == "__main__":
    main()

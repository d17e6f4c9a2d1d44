"""``python -m bench.learning``: the command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from dataclasses import asdict
from pathlib import Path

from agentmem.config import (
    Divergence,
)
from agentmem.training.dynamics import EMPTY_WARN
from bench.common.phases import say
from bench.common.tiny import tiny_model
from bench.learning import records, teachers
from bench.learning.arms import open_bench, quiet_transformers
from bench.learning.jobs import done, refused_arms, run_jobs
from bench.learning.plan import ARMS, RL_ARMS, arm_flags, arm_seeds, make_plan, task_order, teacher_keys
from bench.learning.report import (
    live_fraction,
    pilot_section,
    plot_dynamics,
    plot_recovery,
    records_section,
    report,
    step_mean,
    step_metrics,
)
from bench.learning.teachers import NoTeacher


def main() -> None:
    import bench.learning

    ap = argparse.ArgumentParser(description=bench.learning.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="one seed, a short budget, fewer held-out questions, the paper's comparisons (QUICK_ARMS)")
    ap.add_argument("--smoke", action="store_true", help="every phase on a tiny random model, in a minute or two")
    ap.add_argument("--pilot", action="store_true",
                    help="the gap-recovery pilot: one seed, T_rl and T_hint, opd_rl, opd_hint, sft_more and grpo "
                         "each one 64-step run evaluated at 8, 24 and 64 steps; prints S and the stopping rule")
    ap.add_argument("--records", type=Path,
                    help="folder of the JSON records each finished arm-seed writes, and the report reads (default "
                         "bench/results/learning/records, or WORK/records with --smoke)")
    ap.add_argument("--work", type=Path, default=Path("learning-bench"), help="folder for the store and outputs")
    ap.add_argument("--threads", type=int, default=2, help="torch threads in all (split between --jobs)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="processes that train and evaluate arm-seeds side by side (each gets threads/jobs "
                         "threads); 2 on 2 cores: small-batch steps use a second core poorly, a second arm well")
    ap.add_argument("--seeds", type=int, help="training seeds (default: 3, or 1 with --quick)")
    ap.add_argument("--steps", type=int, help="method steps after the warm start")
    ap.add_argument("--arms", help="comma-separated subset (base, warm and momentum, the yardsticks, always run): "
                    + ", ".join(ARMS))
    ap.add_argument("--lr", type=float, help="peak learning rate of every arm after the warm start (default 2e-5)")
    ap.add_argument("--warm-steps", type=int, help="SFT steps of the warm start (default 16)")
    ap.add_argument("--warm-lr", type=float, help="peak learning rate of the warm start and the teacher (default 5e-5)")
    ap.add_argument("--loss", choices=[d.value for d in Divergence],
                    help="divergence of the teacher term (default forward_kl; reverse_kl is MemOPD's)")
    ap.add_argument("--carry-warm-optimizer", action=argparse.BooleanOptionalAction, default=None,
                    help="every method goes on with the warm start's AdamW state (default on); --no-carry-warm-optimizer "
                         "starts each with a fresh AdamW, whose first step moves every weight by about the lr")
    ap.add_argument("--carry-warm-first-moment", action=argparse.BooleanOptionalAction, default=None,
                    help="with the warm start's AdamW state carried, carry its first moment too (default on); "
                         "--no-carry-warm-first-moment starts it at zero and keeps the second moment and step count, "
                         "so a method's update is its own gradients' and the momentum arm does not move")
    ap.add_argument("--mixed-precision", choices=["off", "on", "auto"],
                    help="every training job (warm start, teachers, methods) runs its decoders under bfloat16 autocast, "
                         "with float32 weights, optimiser state and output head: a 1.6x (this bench's step) to 2x faster "
                         "step on CPUs with AMX or AVX512-BF16, slower where bf16 is emulated (AVX2); results differ "
                         "from float32's "
                         "by its rounding. auto: on where bfloat16 measures faster here (default off, or auto with "
                         "--quick)")
    ap.add_argument("--teacher-temperature", type=float,
                    help="divide the teacher's log-probs by this before the divergence (default 1; below 1 the "
                         "target leans to the teacher's greedy choice)")
    ap.add_argument("--teacher-min-confidence", type=float,
                    help="distil only at positions where the teacher's top probability is at least this (default "
                         "0: everywhere); the RL term still applies at the others")
    ap.add_argument("--rl-kd-weight", type=float,
                    help="the teacher term's weight in arms that also have the RL term, opd_grpo and opd_privileged_grpo "
                         "(default 1; the RL term keeps 1): below 1 the reward leads and the teacher follows")
    ap.add_argument("--privileged-teacher-sft", action=argparse.BooleanOptionalAction, default=None,
                    help="the privileged arms' teacher (opd_privileged, opd_privileged_grpo, psd_off): fine-tuned on the oracle calls under "
                         "the privileged prompt it reads and picked on validation under it (default: no, the ladder "
                         "teacher, fine-tuned on the plain prompt, reads the splice)")
    ap.add_argument("--teacher-steps", help="comma-separated SFT steps of the teacher candidates (default 32,64,96, "
                    "or 16,24,32 with --quick)")
    ap.add_argument("--group", type=int,
                    help="samples per training task in each on-policy rollout (default 8): the GRPO group, so more "
                         "samples give more groups with a non-zero advantage when most tasks score 0")
    ap.add_argument("--teacher-val", type=int,
                    help="validation episodes per teacher candidate (default 32, or 8 with --quick): the pick is by "
                         "their F1, so few episodes tie candidates of different strength")
    ap.add_argument("--calls-per-step", type=int,
                    help="stored calls per optimiser step of every method after the warm start (default 24, 8 with "
                         "--quick; the "
                         "warm start and the teacher keep 8): more calls give a less noisy step at the same rate, "
                         "and an on-policy round uses more of its rollout")
    ap.add_argument("--heldout-per-level", type=int, help="held-out questions per ladder level")
    ap.add_argument("--heldout-real", type=int, help="questions per real-text held-out set")
    ap.add_argument("--eval-dtype", choices=["auto", "float32", "bfloat16"],
                    help="dtype of the greedy evaluations and teacher checks (default auto: the faster one here)")
    ap.add_argument("--report-partial", action="store_true",
                    help="report the arms whose every seed has finished in WORK and train nothing more (the "
                         "base model's evaluation and the teachers must be done); say which arms are missing")
    ap.add_argument("--model", default=None, help="the base model (default: the default model)")
    ap.add_argument("--hotpot", help="HotpotQA file for the real-text sets (default: the shared one if present)")
    ap.add_argument("--squad", help="SQuAD v1.1 file for the real-text arm (default: the shared one if present)")
    args = ap.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = args.model or (tiny_model(work, "tiny-model") if args.smoke else "default")
    plan = make_plan(args, model)
    if args.jobs < 1:
        raise SystemExit(f"--jobs must be >= 1, got {args.jobs}")
    quiet_transformers()
    threads = 1 if args.smoke else args.threads
    records_dir = (args.records or (work / "records" if args.smoke else records.RECORDS)).resolve()
    bench = open_bench(work, plan, threads, records_dir)
    store = bench.store
    t0 = time.perf_counter()
    say(f"plan: {json.dumps(asdict(plan))}")
    if args.jobs > 1 and not args.report_partial:
        # the phases every arm shares come first, in this process (oracle rollouts, the evaluation dtype),
        # then every task side by side, each as soon as what it needs is there (arms in the order above:
        # the warm starts before the arms that start from them)
        per_job = max(1, threads // args.jobs)
        for d in {"squad" if a.startswith("squad") else "ladder" for a in plan.arms if a != "base"}:
            bench.oracle_runs(d)
        bench.eval_dtype()
        say(f"training in {'mixed precision (bf16 autocast, float32 weights)' if bench.mixed() else 'float32'}")
        run_jobs(bench, [t for t in task_order(plan) if not done(bench, *t)], args.jobs, per_job)
    results: dict = {}
    base = bench.base()
    results["base"] = {"evals": [bench.evaluate("base", 0, base, True, True)], "ladder": True, "real": True}
    bench.write_record(bench.record("base", 0, {"distill_runs": [], "seconds": None}, results["base"]["evals"][0], {}))
    refused = refused_arms(bench)
    for key in teacher_keys(plan):  # the controls' gates (T_sft, T0): measured and recorded, never enforced
        if key == "ladder" or key.startswith("t0-"):
            for seed in range(plan.seeds) if key == "ladder" else [int(key[3:])]:
                with contextlib.suppress(NoTeacher):
                    teachers.gated(bench, key, seed, enforce=False)
    missing = []
    for arm in [a for a in plan.arms if a != "base" and a not in refused]:
        evals, runs = [], []
        ladder, real = arm_flags(arm)
        if args.report_partial and not all(done(bench, arm, seed) for seed in arm_seeds(plan, arm)):
            missing.append(arm)
            continue
        try:
            for seed in arm_seeds(plan, arm):
                trained, evaluation = bench.finish(arm, seed)
                evals.append(evaluation)
                runs.append(trained["distill_runs"])
        except NoTeacher as e:  # its teacher failed the gate for a seed
            refused[arm] = str(e)
            continue
        steps = step_metrics(store, [r for rs in runs for r in rs])
        results[arm] = {"evals": evals, "ladder": ladder, "real": real, "distill_runs_seed0": runs[0],
                        "live": live_fraction(steps) if arm in RL_ARMS else None, "gated": step_mean(steps, "kd_gated_fraction"),
                        "shared": step_mean(steps, "kd_shared_fraction")}
        empty = max((v for e in evals for c in e["empty"].values() for v in c.values()), default=0.0)
        if empty > EMPTY_WARN:
            say(f"warning: {arm} writes end-of-sequence-only outputs on {empty:.0%} of some call kind (collapsed)")
    this_config = records.config_hash(records.config_of(asdict(plan)))
    if not (args.report_partial or plan.pilot_steps):  # each teacher's best arm on the ladder, then on real text
        for arm in records.best_arms(records.load(records_dir, this_config)).values():
            if arm in plan.arms and arm not in refused:
                for seed in arm_seeds(plan, arm):
                    bench.real_text(arm, seed)
    text, _ = report(bench, results)
    kept = records.load(records_dir, this_config)
    summary = records.summarize(kept)
    last = records.last_line(summary)
    text += records_section(summary, kept)
    if plan.pilot_steps:
        curve = records.pilot(kept, plan.pilot_steps)
        text += pilot_section(curve)
        plot_recovery(curve, work / "gap_recovery.png")
        say("pilot: stop, no teacher's OPD recovered 30% of its gap" if curve["stop"] else f"pilot: S = {curve['S']}")
    (work / "learning.md").write_text(text)
    if refused:
        text += "\n**Refused arms** (no teacher passed its check or gate; nothing was distilled from it):\n\n" + "".join(
            f"- `{a}`: {why}\n" for a, why in refused.items())
        (work / "learning.md").write_text(text)
    if missing:
        text += (f"\n**Partial report** (`--report-partial`): the arms {', '.join(missing)} have not finished every "
                 f"seed in {work} and are left out; run the same command without the flag to finish them.\n")
        (work / "learning.md").write_text(text)
    plot_dynamics(bench, results, work / "dynamics.png")
    print(text)
    say(f"done in {(time.perf_counter() - t0) / 60:.1f} min; outputs in {work}")
    print(last)


if __name__ == "__main__":
    main()

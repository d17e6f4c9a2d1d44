"""``python -m bench.learning``: run the pilot or one seed of a suite, then rebuild the report from the records.

  python -m bench.learning --pilot                 # one seed: sft_more, seqkd_hint, opd_hint along 24 steps
  python -m bench.learning --seed 0 --steps S      # one unit: the core suite's seed 0 at S steps
  python -m bench.learning --report                # REPORT.md from the committed records only
  python -m bench.learning --smoke                 # every phase on a tiny random model, in a few minutes

Each unit prints one line per phase and, last, the report's last line. A killed unit goes on where it stopped
when run again with the same --work folder.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict
from pathlib import Path

from bench.common.phases import say
from bench.learning import records, report, suite
from bench.learning.campaign import Campaign, Plan, host_kind


def smoke_plan(work: Path) -> Plan:
    """A tiny random model as student and teacher, 2 steps, 2 questions a level: every phase, numbers moot."""
    from bench.common.tiny import tiny_model

    model = tiny_model(work)
    args = ["--chunk-tokens", "48", "--memory-tokens", "8", "--answer-tokens", "4", "--episodes", "2",
            "--group-size", "2", "--invocations-per-step", "4"]
    return Plan(steps=4, eval_steps=[2, 4], heldout_levels=[1, 2], heldout_per_level=2, validation=2, warm_steps=1,
                warm_calls=4, oracle_tasks=4, model=model, teacher=model, host=host_kind(), train_args=args)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.learning", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pilot", action="store_true", help="one seed of sft_more, seqkd_hint and opd_hint (with base, "
                    "warm and the teacher), each one 24-step run evaluated at 8, 16 and 24 steps; prints S")
    ap.add_argument("--seed", type=int, help="run one unit: this training seed of --suite at --steps")
    ap.add_argument("--steps", type=int, default=24, help="S: student steps of every trained arm (even)")
    ap.add_argument("--suite", choices=sorted(suite.SUITES), default="core")
    ap.add_argument("--arms", help="comma-separated arms instead of the suite's")
    ap.add_argument("--heldout", type=int, default=32, help="held-out questions per ladder level (3 levels)")
    ap.add_argument("--report", action="store_true", help="only rebuild REPORT.md from the records")
    ap.add_argument("--smoke", action="store_true", help="every phase on a tiny random model (records under WORK)")
    ap.add_argument("--work", type=Path, default=Path("learning-work"), help="the store, checkpoints and state.json")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count() or 1)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda on a GPU (its records are kept apart: host cuda)")
    ap.add_argument("--records", type=Path, help="where the records go (default bench/results/learning/records)")
    ap.add_argument("--keep-checkpoints", action="store_true", help="keep each trained arm's checkpoints once it "
                    "is evaluated and recorded (about 2 GB an arm at S = 8; by default they are deleted)")
    ap.add_argument("--dry-run", action="store_true", help="print the unit's train commands, each config built and "
                    "checked; run nothing")
    args = ap.parse_args(argv)
    args.work = args.work.resolve()  # the tiny model's folder is a model reference: absolute, wherever it runs
    if args.report:
        for path in report.write():
            print(path)
        return
    if args.steps < 2 or args.steps % 2:
        ap.error(f"--steps: an even number of student steps (2 a round), got {args.steps}")
    if args.smoke:
        plan, records_dir = smoke_plan(args.work), args.work / "records"
        arms, seed = list(suite.SUITES["core"]), 0
    elif args.pilot:
        plan = Plan(steps=24, eval_steps=[8, 16, 24], heldout_per_level=args.heldout, host=host_kind(args.device),
                    eval_dtype="bfloat16" if args.device.startswith("cuda") else "float32")
        records_dir, arms, seed = args.records or records.RECORDS, list(suite.PILOT), 0
    elif args.seed is not None:
        plan = Plan(steps=args.steps, eval_steps=[args.steps], heldout_per_level=args.heldout,
                    host=host_kind(args.device), eval_dtype="bfloat16" if args.device.startswith("cuda") else "float32")
        records_dir, seed = args.records or records.RECORDS, args.seed
        arms = list(suite.SUITES[args.suite])
    else:
        ap.error("give --pilot, --seed N, --report or --smoke")
    if args.arms:
        try:
            arms = [suite.arm(a).name for a in args.arms.split(",") if a]
        except KeyError as e:
            ap.error(f"--arms: {e.args[0]}")
    campaign = Campaign(args.work, plan, args.threads, records_dir, args.device, args.keep_checkpoints)
    if args.dry_run:
        for line in campaign.commands(seed, arms):
            print(line)
        return
    say(f"seed {seed}: {', '.join(arms)} at {plan.steps} steps on a {plan.host} host, {args.threads} thread(s)")
    minutes = campaign.unit(seed, arms)
    recs = [r for r in records.load(records_dir)
            if r.get("config_hash") == records.config_hash(records.config_of(asdict(plan)))]
    if not args.smoke and records_dir == records.RECORDS:
        report.write()
    if args.pilot or args.smoke:
        curve = records.pilot(recs, plan.eval_steps)
        print(f"pilot: gap {curve['gap']} S={curve['S']} stop={curve['stop']} curve={curve['curve']}")
    print(f"minutes={minutes:.1f}")
    print(records.last_line(records.summarize(recs)))


if __name__ == "__main__":
    main()

"""Fault injection: ``kill -9`` of the score, distill and sft jobs at random points, then resume; and a
SQLite store whose file hits its size limit mid-rollout.

    python -m bench.faults [--kills 21] [--seed 0] [--work DIR]
    python -m bench.faults --smoke     # one kill of score, and the full disk: every phase runs, in seconds

Every job runs as a real ``agentmem`` process (``python -m cli.app``) with tiny random models (a policy and a
teacher of one tokenizer) on a SQLite store that holds one sampled rollout run. Per job, one uninterrupted
reference run is made first. Then each kill: a fresh copy of the store, the job started, ``SIGKILL`` at a
random moment (half the kills: between 20% and 80% of the reference's wall
time, in model loading, mid-batch or mid-save; the other half: right after a random number of rows were
stored), until ``--kills`` processes were killed (a job that finished first does not count), and the job
resumed (``score``: the same command again; ``distill``/``sft``: ``--resume RUN_ID`` of the killed run, or the command again when it died before
its run row). Then the store is compared with the reference:
- lost: reference rows (teacher scores by (call, teacher, context); train steps by step) missing;
- duplicates: rows stored twice for one key;
- mixed: a call scored with other values than the reference's, or a train step with another loss;
- resumed_equal: the final checkpoint's tensors equal the reference's exactly (score: every row equal).
The rollout-worker kills (3 workers on Postgres) are ``tests/faults/test_worker_kills.py``'s and
``bench/workers.py``'s. The last line is ``kills=<n> lost_calls=<n> duplicates=<n> mixed=<n> resumed_equal=<k>/<k>``.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

from agentmem.testing.faults import JOBS, Tally, disk_full, kill_and_resume, make_world, reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=21, help="kills in all, spread over score, distill and sft")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--smoke", action="store_true", help="one kill of score (the shortest job), then the full "
                        "disk: checks that every phase runs")
    args = parser.parse_args()
    jobs = JOBS
    if args.smoke:
        args.kills, jobs = 1, ("score",)
    work = args.work or Path(tempfile.mkdtemp(prefix="agentmem-faults-"))
    rng = random.Random(args.seed)
    world = make_world(work)
    tally = Tally()
    refs = {}
    for job in jobs:
        refs[job] = reference(world, job)
        print(f"reference {job}: {len(refs[job][0].rows)} rows in {refs[job][1]:.1f} s", flush=True)
    n = 0
    while tally.kills < args.kills and n < 3 * args.kills:  # a job that finished before its kill is not counted
        job = jobs[n % len(jobs)]
        kill_and_resume(world, job, *refs[job], rng, n, tally)
        print(tally.notes[-1], flush=True)
        n += 1
    print(f"disk full: {disk_full(world)}")
    print(f"kills={tally.kills} lost_calls={tally.lost} duplicates={tally.duplicates} mixed={tally.mixed} "
          f"resumed_equal={tally.equal}/{tally.resumed}")


if __name__ == "__main__":
    main()

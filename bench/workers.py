"""Concurrency load: 1, 2 and 4 rollout workers on one Postgres, 2 on one SQLite file, and (``--kills``)
workers killed at random.

    python -m bench.workers [--pg-url postgresql://postgres@127.0.0.1:55432/postgres] [--episodes 60]
                            [--group-size 2] [--batch 4] [--workers 1,2,4] [--sleep 0] [--kills 0]
    python -m bench.workers --smoke     # 4 episodes, 1 and 2 workers, one kill: every phase runs, in seconds

Every worker is a real process (``agentmem.testing.scripted_worker``: ``agentmem.jobs.worker.run_worker``
with the scripted backend, so generation costs almost nothing and the store and the agent loop's own
Python are what is measured). Without ``--pg-url`` a throwaway server is started (``scripts/pg_throwaway.sh``,
fsync off) and stopped at the end. Per worker count: a fresh database, one run of ``--episodes`` tasks x
``--group-size`` samples, ``--workers`` processes started together; then
- calls/s: stored calls over the time from the first stored call to the last (process start-up, about 5 s
  of imports per process, is left out);
- p99 insert: the 99th percentile over every round of every worker of the time to store that round's calls
  (one transaction: lease check and renewal, insert, commit);
- lost: calls of the one-worker run missing from this run (the scripted backend answers a prompt alike in
  every process, so every worker count must store the same calls).
Then 2 worker processes on one SQLite file (WAL): their stderr must hold no "database is locked". With
``--kills K``: 3 workers on Postgres, one killed (SIGKILL) at random K times while calls are being stored and
a fresh one started; lost, duplicated and mixed calls are counted as ``tests/faults/test_worker_kills.py``
does. ``--sleep S``: every batch of the scaling runs takes S seconds more, as if a model generated it
elsewhere (a GPU): then the workers' own CPU no longer bounds the runs on a small machine. The last line is ``workers4_vs_1=<r> p99_ms=<x> lost=<n>`` (p99 of the 4-worker run; lost over all).

``--ray`` (the ``ray`` extra; a local Ray cluster of 4 logical CPUs): 1 and 2 plain worker processes against 1
and 2 Ray actors on the same episodes, each batch taking ``--sleep`` (default 0.1 s) as if a server generated it,
then 2 actors of which one is SIGKILLed mid-episode ``--kills`` times (default 3; Ray restarts it): the last line
is ``ray_vs_plain_2=<r> scale_2_vs_1=<r> lost=<n> duplicates=<n> restart_s=<s>`` (``ray_phase``).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import sqlalchemy as sa

from agentmem.backends.scripted import ScriptedBackend
from agentmem.config import AgentConfig, RolloutConfig
from agentmem.jobs.rollout import create_rollout
from agentmem.testing.tiny_models import tiny_tokenizer
from store.engine import make_engine, open_store, resolve_url
from store.migrations import upgrade

ROOT = Path(__file__).resolve().parents[1]
WORKER = "agentmem.testing.scripted_worker"  # run as python -m
SYNTH = {"context_tokens": 160, "distractors": 2, "hops": 2}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


def config(episodes: int, group_size: int, batch: int) -> RolloutConfig:
    return RolloutConfig(model="tiny", episodes=episodes, group_size=group_size, chunk_tokens=48, env_knobs=SYNTH,
                         agent=AgentConfig(memory_tokens=16, answer_max_new_tokens=8, max_batch=batch, seed=1))


def fresh_pg(server: str) -> str:
    name = f"agentmem_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(resolve_url(server), isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.exec_driver_sql(f'CREATE DATABASE "{name}"')
    admin.dispose()
    url = sa.engine.make_url(resolve_url(server)).set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    return url


def new_run(url: str, cfg: RolloutConfig) -> str:
    tok = tiny_tokenizer()
    store = open_store(url, create=True)
    run_id = create_rollout(store, cfg, backend=ScriptedBackend(tok, lambda p: ""))
    store.dispose()
    return run_id


def start(url: str, run_id: str, tag: int, times: Path | None = None, lease_s: float = 30.0,
          sleep_s: float = 0.0) -> subprocess.Popen:
    env = dict(ENV, AGENTMEM_INSERT_TIMES=str(times)) if times else ENV
    return subprocess.Popen([sys.executable, "-m", WORKER, url, run_id, str(tag), str(lease_s), str(sleep_s)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def calls(url: str, run_id: str) -> dict:
    """(task, sample) -> [(step, kind, prompt, output, memory after, process tag)] in step order."""
    engine = sa.create_engine(resolve_url(url))
    with engine.connect() as c:
        rows = c.execute(sa.text(
            "select e.task_id, e.sample_index, i.step, i.kind, i.prompt_text, i.output_text, i.memory_after, "
            "i.latency_s from invocations i join episodes e on e.id = i.episode_id where e.run_id = :r "
            "order by e.task_id, e.sample_index, i.step"), {"r": run_id}).all()
    engine.dispose()
    out: dict = {}
    for r in rows:
        out.setdefault((r[0], r[1]), []).append(tuple(r[2:]))
    return out


def span_rate(url: str, run_id: str) -> tuple[int, float]:
    engine = sa.create_engine(resolve_url(url))
    with engine.connect() as c:
        n, first, last = c.execute(sa.text(
            "select count(*), min(i.created_at), max(i.created_at) from invocations i join episodes e "
            "on e.id = i.episode_id where e.run_id = :r"), {"r": run_id}).one()
        status = c.execute(sa.text("select status from runs where id = :r"), {"r": run_id}).scalar()
    engine.dispose()
    if isinstance(first, str):  # SQLite returns text
        from datetime import datetime
        first, last = datetime.fromisoformat(first), datetime.fromisoformat(last)
    assert status == "finished", f"run {run_id} is {status}"
    return n, n / max((last - first).total_seconds(), 1e-9)


def compare(want: dict, got: dict) -> tuple[int, int, int]:
    """(lost, duplicates, mixed) calls of ``got`` against ``want`` (the tag, last, is left out)."""
    lost = dup = mixed = 0
    for key, rows in want.items():
        have = got.get(key, [])
        lost += max(0, len(rows) - len(have))
        dup += max(0, len(have) - len(rows))
        if [r[:-1] for r in have] != [r[:-1] for r in rows][: len(have)]:
            mixed += 1
        tags = [r[-1] for r in have]
        blocks = [t for i, t in enumerate(tags) if i == 0 or tags[i - 1] != t]
        mixed += len(blocks) != len(set(blocks))
    return lost, dup, mixed


def run_workers(url: str, run_id: str, n: int, work: Path, sleep_s: float = 0.0) -> list[float]:
    times = [work / f"times_{run_id[:8]}_{k}.txt" for k in range(n)]
    procs = [start(url, run_id, k, times[k], sleep_s=sleep_s) for k in range(n)]
    for p in procs:
        _, err = p.communicate(timeout=3600)
        if p.returncode != 0:
            raise SystemExit(f"worker failed:\n{err}")
        if "database is locked" in err:
            raise SystemExit(f"'database is locked' reached a worker:\n{err}")
    return [float(x) for t in times for x in t.read_text().split()]


def kills(url: str, cfg: RolloutConfig, want: dict, k: int, seed: int) -> tuple[int, int, int, int]:
    """3 workers on one run; kill one at random ``k`` times while calls are being stored. Each batch takes
    0.2 s here (as if a model generated it), so that the run lasts long enough for ``k`` kills."""
    run_id = new_run(url, cfg)
    rng = random.Random(seed)
    procs = {tag: start(url, run_id, tag, lease_s=2.0, sleep_s=0.2) for tag in range(3)}
    engine = sa.create_engine(resolve_url(url))
    done, last, tag = 0, 0, 3
    while done < k:
        time.sleep(rng.uniform(0.2, 1.5))
        with engine.connect() as c:
            now = c.execute(sa.text("select count(*) from invocations i join episodes e on e.id = i.episode_id "
                                    "where e.run_id = :r"), {"r": run_id}).scalar()
        live = [t for t, p in procs.items() if p.poll() is None]
        if not live:
            break
        if now > last:
            victim = rng.choice(live)
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            done, last = done + 1, now
            procs[tag] = start(url, run_id, tag, lease_s=2.0, sleep_s=0.2)
            tag += 1
    engine.dispose()
    for p in procs.values():
        p.communicate(timeout=3600)
    lost, dup, mixed = compare(want, calls(url, run_id))
    return done, lost, dup, mixed


def ray_phase(server: str, cfg: RolloutConfig, sleep_s: float, kills_wanted: int) -> str:
    """``--ray``: 1 and 2 plain worker processes against 1 and 2 Ray actors (``jobs.ray_rollout``, the same
    scripted backend) on fresh databases, then 2 actors of which one is SIGKILLed mid-episode ``kills_wanted``
    times (Ray restarts it). The last line's keys: ``ray_vs_plain_2`` (calls/s of 2 actors over 2 processes),
    ``scale_2_vs_1`` (2 actors over 1), ``lost`` and ``duplicates`` (calls, against the 1-process run, over
    every run), ``restart_s`` (mean time from a kill to the first call stored by the restarted actor)."""
    import functools
    import threading

    import ray

    from agentmem.jobs import ray_rollout
    from agentmem.jobs.rollout import LeaseTerms
    from agentmem.testing.scripted_worker import tagged_sampler

    ray.init(num_cpus=4, object_store_memory=100 * 2**20, include_dashboard=False, log_to_driver=False,
             logging_level="WARNING")
    lease = LeaseTerms(seconds=30, max_attempts=1000)
    sampler = functools.partial(tagged_sampler, sleep_s=sleep_s)
    rates: dict = {}
    want, lost, dup = None, 0, 0
    try:
        for kind in ("plain", "ray"):
            for n in (1, 2):
                url = fresh_pg(server)
                run_id = new_run(url, cfg)
                if kind == "plain":
                    procs = [start(url, run_id, k, lease_s=lease.seconds, sleep_s=sleep_s) for k in range(n)]
                    for p in procs:
                        _, err = p.communicate(timeout=3600)
                        if p.returncode != 0:
                            raise SystemExit(f"worker failed:\n{err}")
                else:
                    ray_rollout.work_with_ray(url, run_id, ray_rollout.Placement(workers=n), lease, device="cpu",
                                              sampler=sampler)
                count, rates[kind, n] = span_rate(url, run_id)
                got = calls(url, run_id)
                want = want or got
                lo, du, mixed = compare(want, got)
                lost, dup = lost + lo, dup + du
                print(f"{kind} workers={n} calls={count} calls_per_s={rates[kind, n]:.1f} lost={lo} duplicates={du} "
                      f"mixed={mixed}", flush=True)
        url = fresh_pg(server)
        run_id = new_run(url, cfg)
        box: dict = {}
        thread = threading.Thread(target=lambda: box.update(r=ray_rollout.work_with_ray(
            url, run_id, ray_rollout.Placement(workers=2), lease, device="cpu", sampler=sampler)), daemon=True)
        thread.start()
        engine = sa.create_engine(resolve_url(url))
        restarts: list[float] = []

        def running_owners() -> tuple[set[int], set[float]]:
            with engine.connect() as c:
                owners = c.execute(sa.text(
                    "select distinct e.lease_owner from episodes e where e.run_id = :r and e.status = 'running' and "
                    "e.lease_owner is not null and exists (select 1 from invocations i where i.episode_id = e.id)"),
                    {"r": run_id}).scalars().all()
                tags = c.execute(sa.text("select distinct i.latency_s from invocations i join episodes e on "
                                         "e.id = i.episode_id where e.run_id = :r"), {"r": run_id}).scalars().all()
            return {int(o.split(":")[1]) for o in owners}, set(tags)

        killed: set[int] = set()
        while len(restarts) < kills_wanted and thread.is_alive():
            time.sleep(0.3)
            pids, tags = running_owners()
            pids -= killed
            if not pids:
                continue
            victim = min(pids)
            os.kill(victim, signal.SIGKILL)
            killed.add(victim)
            t0 = time.perf_counter()
            while thread.is_alive():  # the restarted actor's first stored call carries a new process tag
                time.sleep(0.05)
                _, now = running_owners()
                if now - tags - {float(k) for k in killed}:
                    restarts.append(time.perf_counter() - t0)
                    break
        thread.join(3600)
        engine.dispose()
        lo, du, mixed = compare(want, calls(url, run_id))
        lost, dup = lost + lo, dup + du
        restart = sum(restarts) / len(restarts) if restarts else float("nan")
        print(f"ray kills={len(restarts)} lost_calls={lo} duplicates={du} mixed={mixed} restart_s={restart:.1f}",
              flush=True)
    finally:
        ray.shutdown()
    return (f"ray_vs_plain_2={rates['ray', 2] / rates['plain', 2]:.2f} scale_2_vs_1={rates['ray', 2] / rates['ray', 1]:.2f} "
            f"lost={lost} duplicates={dup} restart_s={restart:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg-url", default=os.environ.get("AGENTMEM_TEST_PG_URL"))
    ap.add_argument("--episodes", type=int, default=60)
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4, help="episodes a worker holds (one backend batch per round)")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds added to every batch of the scaling runs")
    ap.add_argument("--kills", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ray", action="store_true", help="1 and 2 Ray actors against 1 and 2 plain workers, and "
                    "--kills actor kills (default 3; --sleep default 0.1); needs the ray extra")
    ap.add_argument("--smoke", action="store_true", help="4 episodes, 1 and 2 workers, 1 kill: every phase runs")
    args = ap.parse_args()
    if args.ray:
        args.kills = args.kills or 3
        args.sleep = args.sleep or 0.1
    if args.smoke:
        args.episodes, args.group_size, args.workers, args.kills = 4, 1, "1,2", 1
    cfg = config(args.episodes, args.group_size, args.batch)
    work = Path(tempfile.mkdtemp(prefix="agentmem-workers-"))
    work.chmod(0o755)  # mkdtemp makes it 0700: the throwaway server runs as `postgres` and must reach work/pg
    server, stop = args.pg_url, None
    if not server:
        data = work / "pg"
        port = str(50000 + random.randrange(10000))
        server = subprocess.run(["bash", str(ROOT / "scripts" / "pg_throwaway.sh"), "start", str(data), port],
                                check=True, capture_output=True, text=True).stdout.strip()
        stop = ["bash", str(ROOT / "scripts" / "pg_throwaway.sh"), "stop", str(data)]
    try:
        print(f"cpus={os.cpu_count()} episodes={args.episodes * args.group_size} batch={args.batch} "
              f"sleep_s={args.sleep}", flush=True)
        if args.ray:
            print(ray_phase(server, cfg, args.sleep, args.kills))
            return
        rates, p99, total_lost, want = {}, {}, 0, None
        for n in [int(x) for x in args.workers.split(",")]:
            url = fresh_pg(server)
            run_id = new_run(url, cfg)
            lat = run_workers(url, run_id, n, work, args.sleep)
            count, rate = span_rate(url, run_id)
            got = calls(url, run_id)
            want = want or got
            lost, dup, mixed = compare(want, got)
            total_lost += lost
            rates[n], p99[n] = rate, 1000 * float(np.percentile(lat, 99))
            print(f"postgres workers={n} calls={count} calls_per_s={rate:.1f} p50_insert_ms="
                  f"{1000 * float(np.median(lat)):.2f} p99_insert_ms={p99[n]:.2f} lost={lost} duplicates={dup} "
                  f"mixed={mixed}", flush=True)
        sqlite_url = f"sqlite:///{work / 'shared.db'}"
        run_id = new_run(sqlite_url, cfg)
        lat = run_workers(sqlite_url, run_id, 2, work)
        count, rate = span_rate(sqlite_url, run_id)
        lost, dup, mixed = compare(want, calls(sqlite_url, run_id))
        total_lost += lost
        print(f"sqlite workers=2 calls={count} calls_per_s={rate:.1f} p99_insert_ms="
              f"{1000 * float(np.percentile(lat, 99)):.2f} database_locked=0 lost={lost} duplicates={dup} "
              f"mixed={mixed}", flush=True)
        if args.kills:
            n_kills, lost, dup, mixed = kills(fresh_pg(server), cfg, want, args.kills, args.seed)
            total_lost += lost
            print(f"kills={n_kills} lost_calls={lost} duplicates={dup} mixed={mixed}", flush=True)
        ratio = rates.get(4, float("nan")) / rates[1] if 1 in rates else float("nan")
        print(f"workers4_vs_1={ratio:.2f} p99_ms={p99.get(4, float('nan')):.2f} lost={total_lost}")
    finally:
        if stop:
            subprocess.run(stop, capture_output=True)


if __name__ == "__main__":
    main()

"""The fault machinery of ``bench/faults.py`` and ``tests/faults/``: tiny model folders and a SQLite store with one
rollout run (``make_world``), each job (score, distill, sft) run once uninterrupted (``reference``), ``kill -9``
of a job process at a random moment or after some stored rows and its resume (``kill_and_resume``, tallied in a
``Tally``), and a rollout whose SQLite file hits its size limit (``disk_full``). Every job runs as a real
``agentmem`` process (``python -m cli.app``)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

JOBS = ("score", "distill", "sft")
ROLLOUT = ["--episodes", "3", "--group-size", "2", "--knob", "context_tokens=160", "--chunk-tokens", "48",
           "--memory-tokens", "12", "--answer-tokens", "6", "--seed", "3"]


def agentmem(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "cli.app", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"agentmem {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc


def start(*args: str) -> subprocess.Popen:
    env = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "cli.app", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, cwd=ROOT, env=env)


@dataclass(frozen=True)
class World:
    """Tiny model folders and a store (``base``) with one rollout run, copied fresh for every job."""

    root: Path
    policy: str
    teacher: str
    base: Path
    run_id: str

    def copy(self, name: str) -> Path:
        db = self.root / f"{name}.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        shutil.copy(self.base, db)
        return db


def make_world(root: Path) -> World:
    from agentmem.testing.tiny_models import save_tiny, tiny_llama

    root.mkdir(parents=True, exist_ok=True)
    policy = save_tiny(root / "policy", tiny_llama(seed=3))
    teacher = save_tiny(root / "teacher", tiny_llama(seed=1))
    base = root / "base.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{base}{suffix}").unlink(missing_ok=True)
    out = agentmem("rollout", "--model", policy, *ROLLOUT, "--db", str(base)).stdout
    run_id = out.split("run_id=")[1].split()[0]
    con = sqlite3.connect(base)  # fold the WAL in: the file alone is the store
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return World(root, policy, teacher, base, run_id)


def job_args(world: World, job: str, db: Path, out: Path) -> list[str]:
    common = ["--run", world.run_id, "--db", str(db)]
    if job == "score":
        return ["score", *common, "--teacher", world.teacher, "--row-tokens", "384"]
    train = ["--steps", "6", "--save-every", "1", "--invocations-per-step", "4", "--row-tokens", "2048",
             "--lr", "1e-3", "--seed", "5", "--out", str(out)]
    if job == "distill":
        return ["distill", *common, "--teacher", world.teacher, "--student", world.policy, *train]
    return ["sft", *common, "--student", world.policy, *train]


def _rows(db: Path, sql: str, params: tuple = ()) -> list[tuple]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return con.execute(sql, params).fetchall()
    except sqlite3.OperationalError:  # the table is not there yet (the job died before creating its rows)
        return []
    finally:
        con.close()


def job_runs(db: Path, job: str) -> list[tuple[str, str]]:
    return _rows(db, "SELECT id, status FROM runs WHERE kind = ? ORDER BY created_at", (job,))


def progress(db: Path, job: str) -> int:
    """Rows the job has stored so far."""
    got = _rows(db, "SELECT COUNT(*) FROM " + ("teacher_scores" if job == "score" else "train_steps"))
    return got[0][0] if got else 0


@dataclass
class Outcome:
    rows: dict[tuple, tuple]
    duplicates: int
    final: dict | None  # tensors of the last checkpoint (distill, sft)


def outcome(db: Path, job: str) -> Outcome:
    if job == "score":
        rows = _rows(db, "SELECT invocation_id, teacher, context, token_logprobs, reverse_kl FROM teacher_scores")
        keyed = {(r[0], r[1], r[2]): (bytes(r[3]), bytes(r[4])) for r in rows}
        return Outcome(keyed, len(rows) - len(keyed), None)
    (run_id, _status), *_ = job_runs(db, job)
    steps = _rows(db, "SELECT step, loss, kd_loss, rl_loss, tokens FROM train_steps WHERE run_id = ?", (run_id,))
    keyed = {(s[0],): tuple(s[1:]) for s in steps}
    last = _rows(db, "SELECT path FROM checkpoints WHERE run_id = ? ORDER BY step DESC LIMIT 1", (run_id,))
    return Outcome(keyed, len(steps) - len(keyed), _tensors(last[0][0]) if last else None)


def _tensors(path: str) -> dict:
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    out: dict = {}
    for f in files:
        out.update(load_file(f))
    return out


def _equal_tensors(a: dict | None, b: dict | None) -> bool:
    import torch

    return a is not None and b is not None and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _same_steps(ref: dict[tuple, tuple], got: dict[tuple, tuple]) -> list[tuple]:
    """Keys whose values differ from the reference (losses to 1e-6: equal training gives equal losses)."""
    bad = []
    for key, value in got.items():
        want = ref.get(key)
        if want is None:
            continue
        if any(isinstance(x, float) and abs(x - y) > 1e-6 or (not isinstance(x, float) and x != y)
               for x, y in zip(value, want, strict=True)):
            bad.append(key)
    return bad


@dataclass
class Tally:
    kills: int = 0
    lost: int = 0
    duplicates: int = 0
    mixed: int = 0
    equal: int = 0
    resumed: int = 0
    notes: list[str] = field(default_factory=list)


def reference(world: World, job: str) -> tuple[Outcome, float]:
    db = world.copy(f"ref-{job}")
    t0 = time.perf_counter()
    agentmem(*job_args(world, job, db, world.root / f"ref-{job}-ckpt"))
    return outcome(db, job), time.perf_counter() - t0


def kill_and_resume(world: World, job: str, ref: Outcome, ref_seconds: float, rng: random.Random, n: int,
                    tally: Tally, after_rows: int | None = None) -> None:
    """One kill -9 of ``job`` at a random moment of its run (or, with ``after_rows``, as soon as it has
    stored that many rows), the resume, and the comparison."""
    db = world.copy(f"kill-{job}-{n}")
    out = world.root / f"kill-{job}-{n}-ckpt"
    shutil.rmtree(out, ignore_errors=True)
    if after_rows is None and rng.random() < 0.5:  # half the kills at a random stored row, half at a random time
        after_rows = rng.randint(1, max(1, len(ref.rows) - 1))
    proc = start(*job_args(world, job, db, out))
    if after_rows is not None:
        deadline = time.monotonic() + 600
        while progress(db, job) < after_rows and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
    else:
        try:
            proc.wait(timeout=rng.uniform(0.2, 0.8) * ref_seconds)
        except subprocess.TimeoutExpired:
            pass
    killed = proc.poll() is None
    if killed:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    tally.kills += killed
    if not killed:
        tally.notes.append(f"{job} #{n}: finished before the kill")
    runs = job_runs(db, job)
    if job != "score" and runs and runs[-1][1] != "finished":
        agentmem(job, "--resume", runs[-1][0], "--db", str(db))
    elif job == "score" or not runs:
        agentmem(*job_args(world, job, db, out))
    got = outcome(db, job)
    lost = len(set(ref.rows) - set(got.rows))
    mixed = len(_same_steps(ref.rows, got.rows)) if job != "score" else sum(
        1 for k, v in got.rows.items() if k in ref.rows and ref.rows[k] != v)
    tally.lost += lost
    tally.duplicates += got.duplicates
    tally.mixed += mixed
    tally.resumed += 1
    same = (got.rows == ref.rows) if job == "score" else _equal_tensors(got.final, ref.final)
    tally.equal += same
    tally.notes.append(f"{job} #{n}: killed={killed} rows={progress(db, job)} lost={lost} "
                       f"duplicates={got.duplicates} mixed={mixed} resumed_equal={same}")


def disk_full(world: World) -> str:
    """A rollout whose SQLite file may grow by 32 KiB only: one clear error line, and the store stays readable
    and resumable once the limit is lifted. Returns the error line."""
    import resource

    db = world.copy("full")
    limit = db.stat().st_size + 32 * 1024

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "cli.app", "rollout", "--policy", "oracle", "--model", world.policy,
                           "--episodes", "40", "--knob", "context_tokens=400", "--db", str(db)],
                          capture_output=True, text=True, cwd=ROOT, env=env, preexec_fn=limited, timeout=600)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    if proc.returncode != 1 or len(errors) != 1 or "Traceback" in proc.stderr:
        raise AssertionError(f"disk full: expected one error line, got rc={proc.returncode}:\n{proc.stderr[-2000:]}")
    rows = _rows(db, "SELECT id, status FROM runs WHERE kind = 'rollout' ORDER BY created_at")
    if len(rows) != 2:
        raise AssertionError(f"disk full: the store is not readable as before: runs {rows}")
    agentmem("rollout", "--resume", rows[-1][0], "--db", str(db))
    return errors[0]

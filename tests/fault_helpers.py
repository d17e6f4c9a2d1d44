"""Helpers shared by the fault suites (``faults/``): the scripted rollout the killed workers share and its
stored calls per episode, and a throwaway Postgres server of the test's own (``scripts/pg_throwaway.sh``)
that a test can stop and start."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
import sqlalchemy as sa

from agentmem.config import AgentConfig, RolloutConfig

ROOT = Path(__file__).resolve().parents[1]
BINDIR = sorted(glob.glob("/usr/lib/postgresql/*/bin"))

# Longer than the job tests' synthetic tasks: the workers must be killed mid-episode.
SYNTH = {"context_tokens": 160, "distractors": 2, "hops": 2}


def fault_config() -> RolloutConfig:
    """Thirty scripted episodes in groups of two, two calls per batch: a run long enough to kill workers in."""
    return RolloutConfig(model="tiny", episodes=30, group_size=2, chunk_tokens=48, env_knobs=SYNTH,
                         agent=AgentConfig(memory_tokens=16, answer_max_new_tokens=8, max_batch=2, seed=1))


def calls_by_episode(engine, run_id: str) -> dict:
    """A run's stored calls per (task, sample), in step order, free of ids."""
    with engine.connect() as c:
        rows = c.execute(sa.text(
            "select e.task_id, e.sample_index, i.step, i.kind, i.prompt_text, i.output_text, i.memory_before, "
            "i.memory_after, i.latency_s from invocations i join episodes e on e.id = i.episode_id "
            "where e.run_id = :r order by e.task_id, e.sample_index, i.step"), {"r": run_id}).all()
    out: dict = {}
    for r in rows:
        out.setdefault((r[0], r[1]), []).append(tuple(r[2:]))
    return out


def mixed(tags: list[float]) -> bool:
    """Whether some tag's calls form more than one contiguous block."""
    blocks = [t for i, t in enumerate(tags) if i == 0 or tags[i - 1] != t]
    return len(blocks) != len(set(blocks))


def tally(engine, reference: str, run_id: str) -> tuple[int, int, int, int, int]:
    """(lost, duplicates, differ, mixed, taken over) of ``run_id`` against ``reference``; the run must be finished
    with every episode answered."""
    with engine.connect() as c:
        assert c.execute(sa.text("select status from runs where id = :r"), {"r": run_id}).scalar() == "finished"
        statuses = c.execute(sa.text("select status from episodes where run_id = :r"), {"r": run_id}).scalars().all()
    assert set(statuses) == {"answered"}
    want, got = calls_by_episode(engine, reference), calls_by_episode(engine, run_id)
    assert set(got) == set(want)
    lost = sum(max(0, len(want[k]) - len(got[k])) for k in want)
    duplicates = sum(max(0, len(got[k]) - len(want[k])) for k in want)
    differ = sum(1 for k in want if [r[:-1] for r in got[k]] != [r[:-1] for r in want[k]])
    mixed_episodes = sum(1 for k in got if mixed([r[-1] for r in got[k]]))
    taken_over = sum(1 for k in got if len({r[-1] for r in got[k]}) > 1)
    return lost, duplicates, differ, mixed_episodes, taken_over


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def own_server():
    """(URL, data folder) of a throwaway Postgres server of this test's own, stopped and removed after it."""
    root = Path(tempfile.mkdtemp(prefix="agentmem-pg-restart-"))
    root.chmod(0o755)  # the server runs as the postgres user
    data = root / "data"
    port = free_port()
    url = subprocess.run(["bash", str(ROOT / "scripts" / "pg_throwaway.sh"), "start", str(data), str(port)],
                         capture_output=True, text=True, check=True).stdout.strip()
    yield url, data
    subprocess.run(["bash", str(ROOT / "scripts" / "pg_throwaway.sh"), "stop", str(data)], capture_output=True)
    shutil.rmtree(root, ignore_errors=True)


def pg_port(url: str) -> str:
    return url.rsplit(":", 1)[1].split("/")[0]


def pg_ctl(data, *args: str) -> None:
    """``pg_ctl -D data ARGS``, as the postgres user where this runs as root."""
    cmd = f"'{BINDIR[-1]}/pg_ctl' -D '{data}' {' '.join(args)}"
    subprocess.run(["su", "postgres", "-s", "/bin/sh", "-c", cmd] if os.geteuid() == 0 else ["sh", "-c", cmd],
                   check=True, capture_output=True, timeout=60)

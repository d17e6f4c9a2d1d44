"""Ctrl-C and SIGTERM: a real signal sent to a real ``agentmem`` process. The job prints its
run id as its first line, before any model loads; on SIGINT or SIGTERM it prints one line naming what is
stored and the command that resumes, exits 130 or 143, and its run is marked ``interrupted``."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agentmem.testing.tiny_models import save_tiny, tiny_llama

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--knob", "context_tokens=600", "--chunk-tokens", "48", "--memory-tokens", "12", "--answer-tokens", "6",
         "--batch", "2"]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return save_tiny(tmp_path_factory.mktemp("interrupt") / "model", tiny_llama(seed=2))


def _count(db: Path, sql: str, *params) -> int:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    except sqlite3.OperationalError:  # no file yet
        return 0
    try:
        return con.execute(sql, params).fetchone()[0]
    except sqlite3.OperationalError:  # no tables yet
        return 0
    finally:
        con.close()


def _status(db: Path, run_id: str) -> str:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return con.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()[0]
    finally:
        con.close()


def _start(args: list[str], stderr_path: Path) -> subprocess.Popen:
    env = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    # A shell that starts jobs in the background ignores SIGINT for them; an interactive `agentmem` does not.
    return subprocess.Popen([sys.executable, "-m", "cli.app", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=stderr_path.open("w"),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _interrupt_when(proc: subprocess.Popen, stored, sig: int, timeout: float = 240) -> tuple[str, list[str]]:
    """Send ``sig`` once ``stored()`` is > 0 and the first stdout line has been printed; returns (first line,
    the remaining stdout lines)."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while (stored() < 1 or not lines) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the job ended before it could be interrupted"
    proc.send_signal(sig)
    proc.wait(timeout=120)
    reader.join(timeout=30)
    lines = [line.strip() for line in lines]
    return (lines[0] if lines else ""), lines[1:]


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_rollout_signal_prints_run_and_resume_line(model, tmp_path, sig, code):
    db = tmp_path / "store.db"
    proc = _start(["rollout", "--model", model, "--episodes", "400", *SMALL, "--db", str(db)], tmp_path / "err.txt")
    first, rest = _interrupt_when(proc, lambda: _count(db, "SELECT COUNT(*) FROM invocations"), sig)
    assert first.startswith("run_id="), (first, (tmp_path / "err.txt").read_text()[-2000:])
    run_id = first.removeprefix("run_id=")
    assert proc.returncode == code, (tmp_path / "err.txt").read_text()[-2000:]
    stored = _count(db, "SELECT COUNT(*) FROM invocations i JOIN episodes e ON e.id = i.episode_id "
                        "WHERE e.run_id = ?", run_id)
    assert stored > 0
    assert rest[0].startswith("plan: 400 episodes, about ")
    assert rest[1:] == [f"interrupted: {stored} calls stored; resume with: agentmem rollout --resume {run_id} --db {db}"]
    assert _status(db, run_id) == "interrupted"


def test_score_sigint_prints_run_and_resume_line(model, tmp_path):
    db = tmp_path / "store.db"
    oracle = subprocess.run([sys.executable, "-m", "cli.app", "rollout", "--policy", "oracle", "--model", model,
                             "--episodes", "60", *SMALL, "--db", str(db)], cwd=REPO, capture_output=True, text=True,
                            timeout=300, env={**os.environ, "AGENTMEM_DB": ""})
    assert oracle.returncode == 0, oracle.stderr[-2000:]
    source = oracle.stdout.splitlines()[0].removeprefix("run_id=")
    args = ["score", "--run", source, "--teacher", model, "--row-tokens", "512", "--packing", "segments",
            "--db", str(db)]
    proc = _start(args, tmp_path / "err.txt")
    first, rest = _interrupt_when(proc, lambda: _count(db, "SELECT COUNT(*) FROM teacher_scores"), signal.SIGINT)
    assert first.startswith("run_id="), (first, (tmp_path / "err.txt").read_text()[-2000:])
    run_id = first.removeprefix("run_id=")
    assert proc.returncode == 130
    scored = _count(db, "SELECT COUNT(*) FROM teacher_scores WHERE run_id = ?", run_id)
    assert scored > 0
    assert rest[0].startswith("plan: ") and rest[0].endswith(" calls, time shown once calls run")
    assert rest[1:] == [f"interrupted: {scored} calls scored; resume with: agentmem {' '.join(args)}"]
    assert _status(db, run_id) == "interrupted"


def test_run_id_is_printed_before_the_model_loads(model, tmp_path, monkeypatch, capsys):
    """The sampler's load fails here: the run id was already printed, and the run is marked failed."""
    from agentmem import model_refs
    from agentmem.errors import ConfigError
    from cli.app import main

    def no_load(*_args, **_kwargs):
        raise ConfigError("weights refused by the test")

    monkeypatch.setattr(model_refs, "sampler", no_load)
    db = tmp_path / "store.db"
    monkeypatch.setattr(sys, "argv", ["agentmem", "rollout", "--model", model, "--episodes", "1", *SMALL,
                                      "--db", str(db)])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 1
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("run_id=") and lines[1].startswith("plan: "), out
    assert err.strip().splitlines()[-1] == "error: weights refused by the test"
    assert _status(db, lines[0].removeprefix("run_id=")) == "failed"


def test_interrupted_line_names_the_resume_command_per_kind(monkeypatch):
    from agentmem.records import Run, RunKind
    from cli.job_session import interrupted_line

    monkeypatch.setattr(sys, "argv", ["agentmem", "eval", "--model", "m", "--episodes", "4"])
    run = Run(id="a" * 32, kind=RunKind.rollout, config={})
    assert interrupted_line(run, 7, None) == f"interrupted: 7 calls stored; resume with: agentmem rollout --resume {run.id}"
    sft = run.model_copy(update={"kind": RunKind.sft})
    assert interrupted_line(sft, 3, "pg.db") == f"interrupted: 3 steps stored; resume with: agentmem sft --resume {run.id} --db pg.db"
    ev = run.model_copy(update={"kind": RunKind.eval})
    assert interrupted_line(ev, 2, None) == "interrupted: 2 calls stored; start again with: agentmem eval --model m --episodes 4"
    assert interrupted_line(None, None, None) == "interrupted: before any run was stored; nothing to resume"

"""`agentmem rollout` end to end through the CLI on a tiny model: SIGKILL mid-run, then --resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import sqlalchemy as sa

from agentmem.testing.tiny_models import save_tiny

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1"}


def cli(*args: str, **kw):
    return [sys.executable, "-m", "cli.app", *args]


def count(url: str, sql: str) -> int:
    if not Path(url.removeprefix("sqlite:///")).exists():  # never create the file the CLI is about to create
        return 0
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return c.execute(sa.text(sql)).scalar() or 0
    except sa.exc.OperationalError:
        return 0
    finally:
        engine.dispose()


def test_rollout_sigkill_then_resume(tmp_path):
    model = save_tiny(tmp_path / "tiny")
    url = f"sqlite:///{tmp_path / 'run.db'}"
    args = ["rollout", "--model", model, "--dtype", "float32", "--episodes", "12", "--group-size", "2",
            "--chunk-tokens", "48", "--memory-tokens", "24", "--answer-tokens", "6", "--batch", "4",
            "--knob", "context_tokens=160", "--knob", "distractors=1", "--threads", "1", "--db", url]
    proc = subprocess.Popen(cli(*args), cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and count(url, "select count(*) from invocations") < 4:
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    before = count(url, "select count(*) from invocations")
    assert before >= 4
    assert count(url, "select count(*) from episodes where status = 'running'") > 0
    run_id = sa.create_engine(url).connect().execute(sa.text("select id from runs")).scalar()

    done = subprocess.run(cli("rollout", "--resume", run_id[:8], "--db", url), cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"run_id={run_id}" in done.stdout
    assert count(url, "select count(*) from episodes") == 24
    assert count(url, "select count(*) from episodes where status = 'running'") == 0
    # every episode has exactly one call per chunk plus the answer: nothing duplicated, nothing missing
    assert count(url, "select count(*) from episodes e where (select count(*) from invocations i "
                      "where i.episode_id = e.id) != e.n_chunks + 1") == 0
    out = subprocess.run(cli("sql", "select run_id, status from episode_summary", "--format", "json", "--db", url),
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    rows = json.loads(out.stdout)
    assert len(rows) == 24 and {r["run_id"] for r in rows} == {run_id}
    runs = subprocess.run(cli("runs", "--db", url), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    assert "finished" in runs.stdout


def test_rollout_bad_inputs_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    unknown = subprocess.run(cli("rollout", "--env", "nope", "--db", url), cwd=ROOT, env=ENV, capture_output=True,
                             text=True, timeout=120)
    assert unknown.returncode == 2 and "'nope' is not one of" in unknown.stderr and "'synthetic'" in unknown.stderr
    for args, needle in [
        (["--env", "hotpotqa"], "needs a data file"),
        (["--env", "hotpotqa", "--data", str(tmp_path / "missing.json")], "missing.json"),
        (["--model", str(tmp_path)], str(tmp_path)),
        (["--resume", "nosuchrun"], "no run with id"),
    ]:
        proc = subprocess.run(cli("rollout", *args, "--db", url), cwd=ROOT, env=ENV, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and needle in last, (args, proc.stderr)
        assert "Traceback" not in proc.stderr

"""The CLI's store commands through a real subprocess: exit codes, one-line errors, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from store_records import make_episode, make_invocation, make_run

from store import repository as repo
from store.engine import open_store

ROOT = Path(__file__).resolve().parents[1]


def agentmem(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "AGENTMEM_DB": ""}
    return subprocess.run([sys.executable, "-m", "cli.app", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=env, timeout=120)


def one_line_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    assert "Traceback" not in proc.stderr


def test_upgrade_current_runs_sql_show(db_url):
    proc = agentmem("db", "current", "--db", db_url)
    assert proc.returncode == 0 and "current=none" in proc.stdout
    one_line_error(agentmem("runs", "--db", db_url), "run `agentmem db upgrade")
    assert agentmem("db", "upgrade", "--db", db_url).returncode == 0
    assert "up to date" in agentmem("db", "current", "--db", db_url).stdout

    st = open_store(db_url)
    run = make_run()
    ep = make_episode(run)
    inv = make_invocation(ep, 0, np.random.default_rng(0), 4, 2)
    with st.session() as s:
        repo.insert_run(s, run)
        repo.insert_episodes(s, [ep])
        repo.insert_invocations(s, [inv])
        s.commit()
    st.dispose()

    runs = agentmem("runs", "--db", db_url)
    assert runs.returncode == 0 and run.id in runs.stdout
    rows = json.loads(agentmem("sql", "select episode_id, step, kind, prompt_tokens from invocation_history",
                               "--format", "json", "--db", db_url).stdout)
    assert rows == [{"episode_id": ep.id, "step": 0, "kind": "memory_update", "prompt_tokens": 4}]
    csv_out = agentmem("sql", "select task_id, n_calls from episode_summary", "--format", "csv", "--db", db_url)
    assert csv_out.stdout.splitlines() == ["task_id,n_calls", "task-0,1"]
    shown = agentmem("show", "episode", ep.id, "--db", db_url)
    assert shown.returncode == 0 and "memory_update" in shown.stdout and ep.question in shown.stdout

    one_line_error(agentmem("sql", "delete from runs", "--db", db_url), "--write")
    one_line_error(agentmem("sql", "select * from no_such_table", "--db", db_url), "SQL failed")
    one_line_error(agentmem("sql", "selec 1", "--db", db_url), "SQL failed")
    one_line_error(agentmem("show", "episode", "nope", "--db", db_url), "no episode with id 'nope'")
    assert agentmem("sql", "delete from invocations", "--write", "--db", db_url).returncode == 0
    assert agentmem("sql", "select count(*) as n from invocations", "--format", "csv",
                    "--db", db_url).stdout.splitlines() == ["n", "0"]


def test_bad_urls(tmp_path):
    one_line_error(agentmem("runs", "--db", "nosuchdialect://x"), "nosuchdialect")
    one_line_error(agentmem("runs", "--db", "postgresql://postgres@127.0.0.1:1/x"), "cannot reach database")
    one_line_error(agentmem("runs", "--db", f"sqlite:///{tmp_path}/missing/dir/x.db"), "folder does not exist")


def test_help_is_fast_and_light():
    code = ("import sys, cli.app; heavy = [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules];"
            "print(heavy)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr
    assert agentmem("--help").returncode == 0

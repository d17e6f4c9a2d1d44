"""The CLI's store commands through a real subprocess: exit codes, one-line errors, no tracebacks; and the
``sql`` table format (an empty result says "0 rows", numbers are right-aligned)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import agentmem

from agentmem.testing.store_records import make_episode, make_invocation, make_run
from cli.app import main
from store import repository as repo
from store.engine import open_store

ROOT = Path(__file__).resolve().parents[2]


def agentmem_bytes(*args: str) -> subprocess.CompletedProcess:
    """Like ``agentmem`` but stdout as bytes (text mode would turn "\r\n" into "\n")."""
    return subprocess.run([sys.executable, "-m", "cli.app", *args], capture_output=True, cwd=ROOT,
                          env={**os.environ, "AGENTMEM_DB": ""}, timeout=120)


def one_line_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    assert "Traceback" not in proc.stderr


def test_upgrade_current_runs_sql_show(db_url):
    proc = agentmem("db", "current", "--db", db_url)
    assert proc.returncode == 0 and "current=none" in proc.stdout
    one_line_error(agentmem("runs", "--db", db_url), "agentmem db upgrade")
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
    csv_out = agentmem_bytes("sql", "select task_id, n_calls from episode_summary", "--format", "csv", "--db", db_url)
    assert csv_out.stdout == b"task_id,n_calls\ntask-0,1\n"  # "\n" line ends, not csv's default "\r\n"
    shown = agentmem("show", "episode", ep.id, "--db", db_url)
    assert shown.returncode == 0 and "memory_update" in shown.stdout and ep.question in shown.stdout

    one_line_error(agentmem("sql", "delete from runs", "--db", db_url), "--write")
    one_line_error(agentmem("sql", "select * from no_such_table", "--db", db_url), "SQL failed")
    one_line_error(agentmem("sql", "selec 1", "--db", db_url), "SQL failed")
    one_line_error(agentmem("show", "episode", "nopenope", "--db", db_url), "no episode with id 'nopenope'")
    short = agentmem("show", "episode", ep.id[:5], "--db", db_url)
    one_line_error(short, "ids may be abbreviated to 6 or more characters")
    assert "no episode" not in short.stderr
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


def test_missing_sqlite_file_is_not_created(tmp_path):
    db = tmp_path / "typo.db"
    for args in (["runs"], ["sql", "select 1"], ["show", "episode", "abcdef"]):
        one_line_error(agentmem(*args, "--db", str(db)), f"no database at {db}: create it with `agentmem db upgrade")
    assert "current=none" in agentmem("db", "current", "--db", str(db)).stdout
    assert list(tmp_path.iterdir()) == []


def test_downgrade_to_unknown_revision_is_one_line(tmp_path):
    db = str(tmp_path / "a.db")
    assert agentmem("db", "upgrade", "--db", db).returncode == 0
    one_line_error(agentmem("db", "downgrade", "nope", "--db", db), "unknown schema revision 'nope': known revisions "
                   "are base, 0001, 0002")
    assert agentmem("db", "downgrade", "0001", "--db", db).returncode == 0
    assert "current=0001" in agentmem("db", "current", "--db", db).stdout


def test_read_only_database_is_one_line(tmp_path):
    """SQLite opened read-only (as a file without write permission is): the first write names the file."""
    db = tmp_path / "ro.db"
    assert agentmem("db", "upgrade", "--db", str(db)).returncode == 0
    url = f"sqlite:///file:{db}?mode=ro&uri=true"
    assert agentmem("runs", "--db", url).returncode == 0  # reading works
    one_line_error(agentmem("sql", "delete from runs", "--write", "--db", url), f"database file:{db} is read-only")
    one_line_error(agentmem("sql", "delete from runs", "--db", url), "pass --write")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a file whatever its mode")
def test_read_only_file_is_one_line(tmp_path):
    db = tmp_path / "ro.db"
    assert agentmem("db", "upgrade", "--db", str(db)).returncode == 0
    db.chmod(0o444)
    one_line_error(agentmem("sql", "delete from runs", "--write", "--db", str(db)), f"database {db} is read-only")


def sql(capsys, monkeypatch, db: str, query: str) -> list[str]:
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["agentmem", "sql", "--db", db, query])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 0
    return capsys.readouterr().out.rstrip("\n").splitlines()


def test_sql_table_says_0_rows_and_right_aligns_numbers(tmp_path, capsys, monkeypatch):
    db = str(tmp_path / "s.db")
    open_store(db, create=True).dispose()
    assert sql(capsys, monkeypatch, db, "select 1 as n where 0")[-1] == "0 rows"
    lines = sql(capsys, monkeypatch, db, "select 5 as n, 'x' as s, 2.5 as f union all select 100, 'yy', null")
    assert lines[-1] == "2 rows"
    body = [line for line in lines if line.startswith("│")]
    assert body == ["│   5 │ x  │ 2.5 │", "│ 100 │ yy │     │"]

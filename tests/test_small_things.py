"""CLI output details: sft's progress shows the loss terms that are on (cross-entropy, no kd or
rl), an empty SQL result says "0 rows", numbers are right-aligned in the table format, and ``export`` prints
no tqdm bar."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentmem.records import TrainStep
from agentmem.testing.tiny_models import save_tiny
from cli.app import main
from cli.training_progress import loss_parts
from store.engine import open_store

REPO = Path(__file__).resolve().parents[1]


def step(metrics: dict) -> TrainStep:
    return TrainStep(run_id="r", step=1, loss=0.75, kd_loss=0.0, rl_loss=0.0, tokens=10, lr=1e-5, seconds=1.0,
                     metrics=metrics)


def test_sft_progress_shows_the_terms_that_are_on():
    assert loss_parts(step({"ce_loss": 0.75, "actions": 12.0}), terms=()) == "ce 0.7500"
    assert loss_parts(step({"ce_loss": 0.7, "anchor_loss": 0.05}), terms=()) == "ce 0.7000, anchor 0.0500"
    assert loss_parts(step({}), terms=("kd", "rl")) == "kd 0.0000, rl +0.0000"  # distill's, as before


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


def test_export_prints_no_progress_bar(tmp_path):
    model = save_tiny(tmp_path / "model")
    db = str(tmp_path / "e.db")
    env = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1"}

    def agentmem(*args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "cli.app", *args], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc

    out = agentmem("rollout", "--policy", "oracle", "--model", model, "--episodes", "1", "--knob",
                   "context_tokens=120", "--chunk-tokens", "64", "--memory-tokens", "24", "--db", db).stdout
    run_id = out.splitlines()[0].removeprefix("run_id=")
    done = agentmem("export", "--run", run_id, "--out", str(tmp_path / "calls.parquet"), "--db", db)
    assert done.stderr == ""
    assert done.stdout.startswith("wrote ") and done.stdout.strip().endswith("calls.parquet")

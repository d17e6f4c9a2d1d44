"""`agentmem score` and `agentmem distill` through the CLI on a tiny model folder: they run, store their
rows, and bad input gives one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from agentmem.testing.tiny_models import save_tiny

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1"}


def am(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.app", *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=300)


def test_rollout_score_distill_cli(tmp_path):
    model = save_tiny(tmp_path / "tiny")
    db = f"sqlite:///{tmp_path / 'a.db'}"
    rolled = am("rollout", "--model", model, "--episodes", "2", "--group-size", "2", "--chunk-tokens", "48",
                "--memory-tokens", "6", "--answer-tokens", "3", "--knob", "context_tokens=100", "--db", db)
    assert rolled.returncode == 0, rolled.stderr
    run_id = rolled.stdout.split("run_id=")[1].split()[0]
    scored = am("score", "--run", run_id[:8], "--teacher", model, "--student", model, "--teacher-context", "persistent",
                "--db", db)
    assert scored.returncode == 0, scored.stderr
    rows = json.loads(am("sql", "select context, n_tokens, mean_reverse_kl from teacher_scores", "--format", "json",
                         "--db", db).stdout)
    n_calls = json.loads(am("sql", "select count(*) as n from invocations", "--format", "json", "--db", db).stdout)
    assert len(rows) == n_calls[0]["n"] and {r["context"] for r in rows} == {"persistent"}
    distilled = am("distill", "--run", run_id, "--student", model, "--teacher", model, "--teacher-context", "privileged",
                   "--steps", "1", "--invocations-per-step", "4", "--out", str(tmp_path / "ck"), "--db", db)
    assert distilled.returncode == 0, distilled.stderr
    ckpt = distilled.stdout.split("checkpoint=")[1].split()[0]
    steps = json.loads(am("sql", "select step, loss from train_steps", "--format", "json", "--db", db).stdout)
    assert [s["step"] for s in steps] == [1]
    # the new checkpoint is usable by id anywhere a model is
    again = am("score", "--run", run_id, "--teacher", ckpt, "--db", db)
    assert again.returncode == 0, again.stderr

    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    for args, needle in [
        (["distill", "--run", "nope12345", "--student", model, "--teacher", model], "no run with id"),
        (["distill", "--run", run_id, "--student", str(not_a_model), "--teacher", model], str(not_a_model)),
        (["distill"], "--run"),
        (["score", "--run", run_id, "--teacher", str(not_a_model)], str(not_a_model)),
        (["distill", "--resume", run_id], "not a distill run"),
    ]:
        proc = am(*args, "--db", db)
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
        usage = args == ["distill"]  # no --run: the command line is wrong
        assert proc.returncode == (2 if usage else 1) and last.startswith("error: ") and needle in last, (args,
                                                                                                          proc.stderr)
        assert "Traceback" not in proc.stderr

"""bench/quickstart.py measures the README's learning path: its commands are the README's, word for word, and in
--smoke they keep their form with a tiny model and small sizes (the smoke run itself: tests/bench_smoke/test_bench_smoke.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.quickstart import DATA_FILES, README_COMMANDS, REAL_COMMANDS, command

ROOT = Path(__file__).resolve().parents[2]


def test_the_commands_are_the_readmes():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = [line.split("#")[0].strip().removeprefix(".venv/bin/") for line in readme.splitlines()]
    for cmd in (*README_COMMANDS, *REAL_COMMANDS):
        assert cmd in lines, cmd


def test_smoke_keeps_the_commands_with_a_tiny_model_and_small_sizes():
    rollout, sft, evaluate = README_COMMANDS
    assert command(rollout, False, None) == ["rollout", "--policy", "oracle", "--episodes", "64", "--level", "2"]
    assert command(rollout, True, "/m") == ["rollout", "--policy", "oracle", "--episodes", "3", "--level", "2",
                                            "--model", "/m"]
    assert command(sft, True, "/m", ORACLE_RUN="r1") == ["sft", "--run", "r1", "--student", "/m", "--steps", "1"]
    assert command(evaluate, False, None, CHECKPOINT="c1") == [
        "eval", "--model", "c1", "--env", "synthetic", "--level", "2", "--episodes", "64"]


def test_the_real_path_reads_the_files_it_is_given():
    rollout, sft, evaluate = REAL_COMMANDS
    files = {"squad": "/d/squad.json", "hotpot": "/d/hotpot.json"}
    assert command(rollout, False, None, files) == ["rollout", "--env", "squad", "--data", "/d/squad.json", "--knob",
                                                    "docs=1", "--policy", "oracle", "--episodes", "64"]
    assert command(evaluate, True, "/m", files, CHECKPOINT="c1") == [
        "eval", "--model", "c1", "--env", "hotpotqa", "--data", "/d/hotpot.json", "--knob", "docs=2", "--episodes", "3"]
    assert set(DATA_FILES) == {a for line in REAL_COMMANDS for a in line.split() if a.startswith("path/to/")}


@pytest.mark.bench_smoke
def test_the_real_path_runs_in_smoke(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "AGENTMEM_DB": "", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "bench.quickstart", "--real", "--smoke", "--work",
                           str(tmp_path / "qs")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    keys = [kv.split("=")[0] for kv in proc.stdout.strip().splitlines()[-1].split()]
    assert keys == ["base_f1", "sft_f1", "gain", "gain_lo", "gain_hi", "minutes"]

"""bench/quickstart.py measures the README's learning path: its commands are the README's, word for word, and in
--smoke they keep their form with a tiny model and small sizes (the smoke run itself: tests/test_bench_smoke.py)."""

from __future__ import annotations

from pathlib import Path

from bench.quickstart import README_COMMANDS, command

ROOT = Path(__file__).resolve().parents[1]


def test_the_commands_are_the_readmes():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = [line.split("#")[0].strip().removeprefix(".venv/bin/") for line in readme.splitlines()]
    for cmd in README_COMMANDS:
        assert cmd in lines, cmd


def test_smoke_keeps_the_commands_with_a_tiny_model_and_small_sizes():
    rollout, sft, evaluate = README_COMMANDS
    assert command(rollout, False, None) == ["rollout", "--policy", "oracle", "--episodes", "64", "--level", "2"]
    assert command(rollout, True, "/m") == ["rollout", "--policy", "oracle", "--episodes", "3", "--level", "2",
                                            "--model", "/m"]
    assert command(sft, True, "/m", ORACLE_RUN="r1") == ["sft", "--run", "r1", "--student", "/m", "--steps", "1"]
    assert command(evaluate, False, None, CHECKPOINT="c1") == [
        "eval", "--model", "c1", "--env", "synthetic", "--level", "2", "--episodes", "64"]

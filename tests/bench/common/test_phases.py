"""Resumable benchmark phases (``bench/common/phases.py``): concurrent writers of one state file lose no phase, a
folder made by another plan is refused, and a knob newer than the folder matches only at its default."""

from __future__ import annotations

import json
import multiprocessing as mp
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.common.phases import State


@dataclass(frozen=True)
class _Plan:
    name: str


def _put_many(path: str, prefix: str, n: int) -> None:
    state = State(Path(path), _Plan("p"))
    for i in range(n):
        state.put(f"{prefix}/{i}", {"i": i})


def test_state_merges_the_phases_of_concurrent_writers(tmp_path):
    path = tmp_path / "state.json"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_put_many, args=(str(path), f"w{k}", 40)) for k in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    phases = json.loads(path.read_text())["phases"]
    assert sorted(phases) == sorted(f"w{k}/{i}" for k in range(3) for i in range(40))
    with pytest.raises(SystemExit, match=r"another plan \(name: folder 'p', now 'q'\)"):
        State(path, _Plan("q"))


@dataclass(frozen=True)
class _NewerPlan:
    name: str
    knob: float = 0.0  # added after the folder was made


def test_a_knob_newer_than_the_folder_matches_only_at_its_default(tmp_path):
    path = tmp_path / "state.json"
    State(path, _Plan("p")).put("a", 1)
    assert "knob" not in json.loads(path.read_text())["plan"]
    with pytest.raises(SystemExit, match=r"knob: folder '\(made before the knob\)', now 0.5"):
        State(path, _NewerPlan("p", knob=0.5))  # the folder's phases were made as knob=0.0 does
    state = State(path, _NewerPlan("p"))
    assert state.get("a") == 1
    state.put("b", 2)
    with pytest.raises(SystemExit, match="another plan"):
        State(path, _NewerPlan("p", knob=0.5))

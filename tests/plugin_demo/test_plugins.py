"""The three seams take one file each, with no edit to agentmem: a package installed beside it (here a
``.dist-info`` folder with ``entry_points.txt`` in a temporary folder on ``PYTHONPATH``) adds a memory policy
(``agentmem.memory_policies``), an environment (``agentmem.envs``) and a loss term (``agentmem.loss_terms``),
and the jobs run them: rollout, oracle rollout, score, distill and sft with the policy, an oracle rollout on
the environment (through the jobs and through ``agentmem rollout --env riddles --memory jotter``), a
distillation with only the loss term. Each runs in a fresh process (``plugin_demo/drive.py``)
on the tiny models."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent  # tests/plugin_demo
TESTS = HERE.parent
ROOT = TESTS.parent
ENTRY_POINTS = """\
[agentmem.memory_policies]
jotter = demo_policy:JotterPolicy

[agentmem.envs]
riddles = demo_env:RiddleEnv

[agentmem.loss_terms]
entropy_bonus = demo_term:EntropyBonus.from_distill_config
"""


def install_demo(site: Path) -> Path:
    """The demo package, installed into ``site`` as a distribution with entry points (what pip would write)."""
    site.mkdir()
    for module in ("demo_policy.py", "demo_env.py", "demo_term.py"):
        shutil.copy(HERE / module, site / module)
    info = site / "agentmem_demo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: agentmem-demo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return site


def drive(seam: str, tmp_path: Path) -> dict:
    site = install_demo(tmp_path / "site")
    path = os.pathsep.join([str(site), str(TESTS), str(ROOT)])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "AGENTMEM_DB": ""}
    proc = subprocess.run([sys.executable, str(HERE / "drive.py"), seam, str(tmp_path)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_an_unknown_loss_term_or_kind_fails_before_the_train_loop_starts(sqlite_store):
    from agentmem.config import DistillConfig, TrainConfig
    from agentmem.errors import ConfigError
    from agentmem.jobs.train import run_train
    from store import repository as repo

    with pytest.raises(ConfigError, match=r"unknown loss term\(s\) \['entropy_bonus'\] in loss_terms; installed: none "
                                          r"\(entry-point group agentmem.loss_terms\)"):
        run_train(sqlite_store, TrainConfig(distill=DistillConfig(loss=dict(terms={"entropy_bonus": 1.0}))))
    with pytest.raises(ConfigError, match=r"unknown call kind\(s\) \['jot'\]"):
        run_train(sqlite_store, TrainConfig(distill=DistillConfig(kinds="jot")))
    with sqlite_store.session() as s:
        assert repo.list_runs(s) == []  # no run was opened


def test_the_registries_know_nothing_of_the_demo_without_it():
    from agentmem.agent.registry import call_kinds, memory_policy_names
    from agentmem.training.term_registry import loss_term_names
    from envs import env_names

    assert "jotter" not in memory_policy_names() and "jot" not in call_kinds()
    assert "riddles" not in env_names() and "entropy_bonus" not in loss_term_names()


def test_an_installed_memory_policy_runs_through_every_job(tmp_path):
    out = drive("policy", tmp_path)
    assert out["kinds"] == [["answer", "jotter"], ["jot", "jotter"]]
    assert out["oracle_kinds"] == [["answer", "oracle"], ["jot", "oracle"]]
    assert out["oracle_f1"] == [1.0, 1.0]  # the oracle answers the gold answer
    assert set(out["oracle_jots"]) <= set(out["gold_facts"])  # its oracle_text: the facts of the chunk, or nothing
    assert "nothing" in out["oracle_jots"] and len(out["oracle_jots"]) > 1
    assert out["scored"] == out["score_rows"] == out["jot_calls"] > 0  # score --kinds jot: only the jots
    assert out["distill_steps"] == 1 and out["sft_steps"] == 1
    assert out["bad_kind"].startswith("unknown call kind(s) ['jotting']: give comma-separated memory_update, ")
    assert "jot" in out["bad_kind"].split(": give comma-separated ")[1].split(", ")
    assert out["bad_option"] == "memory policy 'jotter': bad --memory-option (line: unknown option); known: lines"


def test_an_installed_environment_runs_a_rollout(tmp_path):
    out = drive("env", tmp_path)
    assert out["names"] == ["riddles"] and out["knobs"] == {"n_riddles": 3}
    assert out["cli"] == [0, [["riddle-0", "Oslo"]], [["answer", "jotter"], ["jot", "jotter"]]]
    assert out["episodes"] == [["riddle-0", "Oslo", "Oslo", 1.0], ["riddle-1", "Paris", "Paris", 1.0]]
    assert out["updates"] == ["(empty)", "Bob lives in Oslo.", "Bob lives in Paris."]  # overwrite's oracle
    assert out["bad_knob"] == "riddles: unknown knob(s) riddles; known: n_riddles"


def test_an_installed_loss_term_trains_alone(tmp_path):
    out = drive("loss", tmp_path)
    assert len(out["steps"]) == 2
    for step in out["steps"]:
        # the term alone: its loss is the step loss, minus the mean entropy (log V >= entropy > 0)
        assert step["entropy_bonus_loss"] == pytest.approx(step["loss"], rel=1e-5)
        assert step["entropy_bonus_mean"] == pytest.approx(-step["loss"], rel=1e-5)
        assert 0 < step["entropy_bonus_mean"] <= math.log(320) + 1e-4
    assert out["steps"][1]["entropy_bonus_mean"] > out["steps"][0]["entropy_bonus_mean"]  # lr 1e-3 raises it
    # the term reports where the built-in ones do: the progress line and the viewer read it from the step's metrics
    values = [step["entropy_bonus_loss"] for step in out["steps"]]
    assert [line.split(" (")[1].split(")")[0] for line in out["progress"]] == [f"entropy_bonus {v:.4f}" for v in values]
    assert out["viewer_terms"] == {"entropy_bonus": [[1, values[0]], [2, values[1]]]}
    assert "entropy_bonus_loss: step 2" in out["viewer_charts"]
    assert out["bad_term"] == ("unknown loss term(s) ['entropy_bonsu'] in loss_terms; installed: entropy_bonus")

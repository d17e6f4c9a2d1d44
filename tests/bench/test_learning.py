"""The learning plan's driver (``bench/learning/``): every arm file is a config of ``agentmem train`` that loads
alone, the driver builds exactly the config the command line a user runs builds, the docs' arm table is the
suite's, and ``--smoke`` runs every core arm through the product's jobs: each arm's rounds are written by the
writer its file names (the student, the teacher, the oracle), the null method moves by momentum alone, and a
killed unit goes on where it stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from agentmem.config import RoundData, TrainConfig
from bench.learning import suite
from bench.learning.campaign import Campaign, Plan
from cli.app import app
from cli.config_show import effective_config

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
       "AGENTMEM_DB": "", "PYTHONPATH": str(REPO)}
FILES = sorted(suite.OVERLAYS.glob("*.yaml"))


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_arm_file_loads_alone_as_a_train_config(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith(f"# agentmem train --config examples/learning/{path.name}"), first
    result = CliRunner().invoke(app, ["config", "show", "train", "--config", str(path)])
    assert result.exit_code == 0, result.output
    config = TrainConfig.model_validate(yaml.safe_load(result.output))
    own = yaml.safe_load(path.read_text())
    own.pop("extends", None)
    for section, values in own.items():
        if isinstance(values, dict) and section == "distill":
            for sub, fields in values.items():
                for key, value in (fields.items() if isinstance(fields, dict) else [(None, fields)]):
                    got = getattr(getattr(config.distill, sub), key) if key else getattr(config.distill, sub)
                    assert (got.value if hasattr(got, "value") else got) == value, (path.name, sub, key)


def test_every_trained_arm_has_its_file_and_every_file_an_arm():
    trained = {a.overlay for a in suite.ARMS if a.trained}
    assert trained | {"base.yaml"} == {p.name for p in FILES}


def test_the_arms_differ_from_the_recipe_only_where_their_files_say():
    base = effective_config("train", ["--config", str(suite.OVERLAYS / "base.yaml")])
    sft_more = effective_config("train", ["--config", str(suite.arm("sft_more").path)])
    assert sft_more.round_data is RoundData.oracle and base.round_data is RoundData.student
    assert sft_more.rollout == base.rollout and sft_more.distill.optim == base.distill.optim
    assert sft_more.distill.batch == base.distill.batch and sft_more.rounds == base.rounds
    momentum = effective_config("train", ["--config", str(suite.arm("momentum").path)])
    assert momentum.distill.optim.coast and momentum.distill.optim.lr == base.distill.optim.lr


def test_the_docs_arm_table_is_the_suites():
    assert suite.markdown_table() in (REPO / "docs" / "learning.md").read_text()


def test_the_driver_runs_the_command_line_a_user_runs(tmp_path):
    """``Campaign.train_args`` is a command line: ``agentmem config show train`` with it prints the config the
    driver trains with."""
    campaign = Campaign(tmp_path, Plan(steps=8), threads=1, records_dir=None)
    warm = {"id": "warmckpt"}
    for name in ("opd_hint", "opd_t0", "grpo"):
        args = campaign.train_args(suite.arm(name), 3, warm)
        shown = CliRunner().invoke(app, ["config", "show", "train", *args])
        assert shown.exit_code == 0, shown.output
        config = effective_config("train", args)
        assert TrainConfig.model_validate(yaml.safe_load(shown.output)) == config
        assert (config.seed, config.rounds, config.distill.student) == (3, 4, "warmckpt")
    assert effective_config("train", campaign.train_args(suite.arm("opd_t0"), 3, warm)).distill.teacher.model == \
        "warmckpt"
    assert effective_config("train", campaign.train_args(suite.arm("opd_hint"), 3, warm)).distill.teacher.model == \
        str(REPO / "bench/results/learning/teacher/hint")


def test_an_unknown_arm_names_the_closest():
    with pytest.raises(KeyError, match="did you mean opd_hint"):
        suite.arm("opd_hnt")


@pytest.mark.bench_smoke
def test_smoke_runs_the_core_suite_through_the_product_and_resumes(tmp_path):
    work = tmp_path / "w"
    run = [sys.executable, "-m", "bench.learning", "--smoke", "--work", str(work), "--threads", "1"]
    proc = subprocess.run(run, env=ENV, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.splitlines()[-1].startswith("gap_hint=")
    recs = {p.stem: json.loads(p.read_text()) for p in (work / "records").rglob("*.json")}
    assert set(recs) == {f"{a}-0" for a in suite.SUITES["core"]} | {"unit-0"}
    assert recs["momentum-0"]["ledger"]["student_tokens"] == 0 and recs["momentum-0"]["ledger"]["steps"] == 4
    assert recs["sft_more-0"]["ledger"]["rollout_tokens"] == 0  # the oracle's calls: nothing sampled
    assert recs["opd_hint-0"]["ledger"]["teacher_forward_tokens"] > 0
    assert recs["seqkd_hint-0"]["ledger"]["teacher_forward_tokens"] == 0
    assert set(recs["opd_hint-0"]["along"]) == {"2", "4"} and recs["opd_grpo_hint-0"]["sweep"]["flag"] == "--kd-weight"
    assert recs["opd_hint-0"]["command"][:4] == ["agentmem", "train", "--config", str(suite.arm("opd_hint").path)]
    assert recs["unit-0"]["whole"] is True
    assert (work / "ckpt" / "warm-0").is_dir() and not list((work / "ckpt").glob("opd_hint-0-*"))  # arms' dropped
    # a second run of the same folder finds every phase done: nothing trains again
    again = subprocess.run(run, env=ENV, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and "train " not in again.stdout and "evaluate " not in again.stdout


@pytest.mark.bench_smoke
def test_the_teacher_fit_smoke_exports_a_peft_adapter_with_its_record(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "bench.learning.teacher_fit", "--smoke", "--work", str(tmp_path / "w"),
                           "--out", str(out), "--threads", "1"], env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.splitlines()[-1].startswith("teacher=hint picked_step=1 stages=1")  # no gate: the first passes
    record = json.loads((out / "hint" / "record.json").read_text())
    assert record["picked"] == 1 and set(record["adapter"]) == {"adapter_model.safetensors", "adapter_config.json"}
    assert json.loads((out / "hint" / "adapter_config.json").read_text())["r"] == 2
    assert [s["step"] for s in record["stages"]] == [1] and record["losses"][0]["step"] == 1


@pytest.mark.bench_smoke
def test_the_gpu_script_builds_every_units_commands_in_its_dry_run(tmp_path):
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_learning.sh"), "--dry-run"],
                          env={**ENV, "OUT": str(tmp_path)}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[-1] == "dry run: every unit's commands built"
    trained = [a for a in suite.SUITES["core"] if suite.arm(a).trained]
    for seed in range(5):
        assert sum(f"--seed {seed} " in line for line in lines) == len(trained) + (3 if seed == 0 else 0)


@pytest.mark.bench_smoke
def test_a_unit_killed_in_an_arms_second_round_resumes_that_train_run(tmp_path):
    run = [sys.executable, "-m", "bench.learning", "--smoke", "--work", str(tmp_path), "--threads", "1",
           "--arms", "warm,opd_hint"]
    proc = subprocess.Popen(run, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "round 2/2: rollout with" in line:
            proc.kill()
            break
    proc.wait(timeout=60)
    again = subprocess.run(run, env=ENV, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "opd_hint seed 0: resuming train run" in again.stdout and "round 1/2: rollout" not in again.stdout
    record = json.loads(next((tmp_path / "records").rglob("opd_hint-0.json")).read_text())
    assert record["ledger"]["steps"] == 4  # both rounds' steps, the ones before the kill included
    unit = json.loads(next((tmp_path / "records").rglob("unit-0.json")).read_text())
    assert unit["whole"] is False  # its minutes are the second process's only


def test_an_evaluated_arms_checkpoints_are_dropped_and_only_under_ckpt(tmp_path):
    campaign = Campaign(tmp_path, Plan(steps=8), threads=1, records_dir=None)
    args = campaign.train_args(suite.arm("opd_hint"), 3, {"id": "warmckpt"})
    out = Path(args[args.index("--out") + 1])
    (out / "round-0").mkdir(parents=True)
    (out / "round-0" / "model.safetensors").write_bytes(b"x")
    warm = tmp_path / "ckpt" / "warm-3"
    warm.mkdir()
    campaign.drop_checkpoints({"command": ["agentmem", "train", *args]})
    assert not out.exists() and warm.exists()  # the seed's warm start stays
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    with pytest.raises(ValueError, match="not an arm's checkpoint folder"):
        campaign.drop_checkpoints({"command": ["agentmem", "train", "--out", str(elsewhere)]})
    assert elsewhere.exists()

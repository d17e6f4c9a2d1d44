"""`agentmem train --ray` through the CLI, on the session's local Ray cluster and a Postgres store: each round's
rollout is worked by Ray actors and each round's distill runs on a Ray Train group, and the rounds chain as in one
process (round 2 samples with round 1's checkpoint). Refusals are one line before anything is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import run_main
from job_fixtures import tiny_train

from agentmem.testing.tiny_models import save_tiny
from store import repository as repo

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.ray
@pytest.mark.slow
def test_train_rolls_out_with_ray_actors_and_distills_on_a_ray_train_group(store, ray_cluster, tmp_path):
    pytest.importorskip("ray.train.torch")
    if store.engine.dialect.name != "postgresql":
        pytest.skip("--ray's rollout actors share a Postgres store")
    url = store.engine.url.render_as_string(hide_password=False)
    folder = save_tiny(tmp_path / "tiny")
    config = tiny_train(folder, tmp_path).model_copy(update={"teacher_check_episodes": 0})
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True)))
    env = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "AGENTMEM_DEBUG": ""}
    proc = subprocess.run([sys.executable, "-m", "agentmem", "train", "--config", str(tmp_path / "train.yaml"),
                           "--ray", "--ray-address", ray_cluster, "--workers", "2", "--train-workers", "2",
                           "--device", "cpu", "--threads", "1", "--db", url], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    train_id = proc.stdout.split("train_run_id=")[1].split()[0]
    with store.session() as s:
        loop = repo.get_run(s, train_id)
        assert loop.status == "finished"
        distills = sorted((r.run for r in repo.list_runs(s) if r.run.kind.value == "distill"),
                          key=lambda run: run.config["out"])
        assert [Path(d.config["out"]).name for d in distills] == ["round-1", "round-2"]
        start = repo.get_checkpoint(s, distills[0].config["student"])
        assert start.path == folder
        round_1 = repo.list_checkpoints(s, distills[0].id)[-1]
        assert distills[1].config["student"] == round_1.id  # round 2 trained round 1's checkpoint
        for distill, sampler in zip(distills, (start, round_1), strict=True):
            assert distill.status == "finished" and len(repo.list_train_steps(s, distill.id)) == 1
            assert distill.pid != loop.pid  # written by the group's rank 0, not by the loop's process
            rollout = distill.config["run_ids"][0]
            episodes = repo.list_episodes(s, rollout)
            assert episodes and all(e.status.value != "running" for e in episodes)
            calls = list(repo.stream_invocations(s, run_ids=[rollout]))
            assert calls and {c.policy_version for c in calls} == {sampler.id}  # sampled by the round's policy


def test_train_ray_refusals_are_one_line_before_anything_is_written(tmp_path, capsys, monkeypatch):
    db = tmp_path / "a.db"
    code, _, err = run_main(capsys, monkeypatch, "train", "--ray", "--db", str(db))
    assert code == 1 and err.strip().count("\n") == 0 and "a SQLite file is one machine's" in err, err
    code, _, err = run_main(capsys, monkeypatch, "train", "--workers", "2", "--db", str(db))
    assert code == 2 and "--workers places Ray rollout actors in train: add --ray" in err, err
    code, _, err = run_main(capsys, monkeypatch, "train", "--train-workers", "2", "--db", str(db))
    assert code == 2 and "--train-workers place(s) Ray workers: add --ray" in err, err
    assert not db.exists()

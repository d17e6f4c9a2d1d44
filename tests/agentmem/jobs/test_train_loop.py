"""The on-policy loop on a tiny model folder: rounds chain checkpoints, every stored call is tagged with
the checkpoint that sampled it, and a call over the row budget is left out and counted, never cut."""

from __future__ import annotations

import pytest
from job_fixtures import tiny_train

from agentmem.config import (
    DistillConfig,
    LossSection,
    Oversize,
    PolicySource,
    RLKind,
    RLSection,
    RolloutConfig,
    RoundData,
    TeacherSection,
    TrainConfig,
)
from agentmem.jobs.train import run_train
from agentmem.records import SamplingContext, TeacherContext
from agentmem.testing.tiny_models import save_tiny
from store import repository as repo


def test_two_rounds_chain_checkpoints_and_tag_policy_versions(sqlite_store, tmp_path):
    """Two rounds chain their checkpoints; the finished loop keeps no optimizer state (round 1's checkpoint kept
    it while round 2 could carry it, the last round's drops it without --keep-optimizer)."""
    from pathlib import Path

    from agentmem.training.checkpoints import has_optimizer_state

    folder = save_tiny(tmp_path / "tiny")
    run_id, rounds = run_train(sqlite_store, tiny_train(folder, tmp_path))
    assert len(rounds) == 2
    assert [has_optimizer_state(Path(r.checkpoint.path)) for r in rounds] == [False, False]
    assert rounds[1].policy == rounds[0].checkpoint
    assert rounds[1].checkpoint.parent_id == rounds[0].checkpoint.id
    assert rounds[0].checkpoint.parent_id == rounds[0].policy.id and rounds[0].policy.path == folder
    with sqlite_store.session() as s:
        assert repo.get_run(s, run_id).status == "finished"
        for r in rounds:
            versions = {i.policy_version for i in repo.stream_invocations(s, run_ids=[r.rollout_run_id])}
            assert versions == {r.policy.id}
            assert len(repo.list_train_steps(s, r.distill_run_id)) == 1


def test_train_leaves_out_a_call_over_the_budget_and_counts_it(sqlite_store, tmp_path):
    """Every call of these rollouts is longer than the row budget: each step trains on nothing, counts
    every drawn call as skipped, and no call is ever cut to fit (the student never trains on a state it
    did not see)."""
    folder = save_tiny(tmp_path / "tiny")
    config = tiny_train(folder, tmp_path, batch=dict(row_tokens=64), loss=dict(rl_weight=1.0))
    run_id, rounds = run_train(sqlite_store, config.model_copy(update={"rounds": 1}))
    with sqlite_store.session() as s:
        invs = list(repo.stream_invocations(s, run_ids=[rounds[0].rollout_run_id]))
        (step,) = repo.list_train_steps(s, rounds[0].distill_run_id)
    assert all(i.prompt_tokens + i.output_tokens > 64 for i in invs)
    assert step.metrics["skipped_calls"] == 4 and step.metrics["skipped_tokens"] > 4 * 64
    assert step.tokens == 0 and step.metrics["actions"] == 0


def test_train_config_composes_rollout_and_distill():
    config = TrainConfig()
    assert isinstance(config.rollout, RolloutConfig) and isinstance(config.distill, DistillConfig)
    assert config.distill.batch.oversize is Oversize.skip  # the loop never cuts a call
    rollout, distill = config.round_configs(1, "ckpt-1")
    assert (rollout.model, rollout.seed, distill.student, distill.seed) == ("ckpt-1", 100_001, "ckpt-1", 100_001)
    rollout, distill = config.model_copy(update={"seed": 3}).round_configs(1, "ckpt-1")
    assert (rollout.seed, distill.seed) == (103_001, 103_001)  # seeds 1000 apart: no two share a round's tasks
    with pytest.raises(ValueError, match="set by each round"):
        TrainConfig(distill=DistillConfig(run_ids=["r"]))


def test_each_round_has_its_seed_knobs_and_writer():
    config = TrainConfig(seed=2, round_knobs=[{"level": 1}, {"level": 3}],
                         rollout=RolloutConfig(env_knobs={"forms": "mixed", "level": 2}))
    rollouts = [config.round_rollout(r, "ckpt") for r in range(3)]
    assert [(r.seed, r.agent.seed, r.env_knobs["level"]) for r in rollouts] == [
        (102_000, 102_000, 1), (102_001, 102_001, 3), (102_002, 102_002, 1)]
    assert all(r.env_knobs["forms"] == "mixed" and r.policy is PolicySource.model for r in rollouts)
    oracle = config.model_copy(update={"round_data": RoundData.oracle}).round_rollout(0, "ckpt")
    assert (oracle.policy, oracle.model) == (PolicySource.oracle, "ckpt")  # the model gives the tokenizer alone
    hint = TrainConfig(round_data=RoundData.teacher, distill=DistillConfig(
        teacher=TeacherSection(model="/t", context=TeacherContext.hint), loss=LossSection(kd_weight=0, ce_weight=1),
        rl=RLSection(kind=RLKind.none)))
    assert (hint.round_rollout(0, "ckpt").model, hint.round_rollout(0, "ckpt").context) == ("/t", SamplingContext.hint)
    with pytest.raises(ValueError, match="round_data=teacher samples each round with the teacher"):
        TrainConfig(round_data=RoundData.teacher, distill=DistillConfig(
            teacher=TeacherSection(model=None), loss=LossSection(ce_weight=1), rl=RLSection(kind=RLKind.none)))
    with pytest.raises(ValueError, match="the RL term needs the student's own samples"):
        TrainConfig(round_data=RoundData.oracle, distill=DistillConfig(loss=LossSection(ce_weight=1, rl_weight=1),
                                                                       rl=RLSection(kind=RLKind.grpo)))


def test_oracle_and_teacher_rounds_train_on_their_writers_calls(sqlite_store, tmp_path):
    folder = save_tiny(tmp_path / "tiny")
    teacher = save_tiny(tmp_path / "teacher")
    base = tiny_train(folder, tmp_path)
    ce = base.distill.model_copy(update={"teacher": TeacherSection(model=teacher), "loss": LossSection(
        kd_weight=0, ce_weight=1), "rl": RLSection(kind=RLKind.none)})
    for data, writer in ((RoundData.oracle, None), (RoundData.teacher, teacher)):
        config = base.model_copy(update={"round_data": data, "distill": ce, "teacher_check_episodes": 0,
                                         "round_knobs": [{"hops": 1}, {"hops": 2}]})
        _, rounds = run_train(sqlite_store, config)
        with sqlite_store.session() as s:
            for r in rounds:
                calls = list(repo.stream_invocations(s, run_ids=[r.rollout_run_id]))
                roles = {str(c.role) for c in calls}
                if writer is None:
                    assert roles == {"oracle"} and all(c.policy_version is None for c in calls)
                else:
                    assert {repo.get_checkpoint(s, c.policy_version).path for c in calls} == {writer}
                hops = repo.get_run(s, r.rollout_run_id).config["env_knobs"]["hops"]
                assert hops == r.round + 1
                assert repo.list_train_steps(s, r.distill_run_id)[0].tokens > 0  # cross-entropy on those calls

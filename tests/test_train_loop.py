"""The on-policy loop on a tiny model folder: rounds chain checkpoints, and every stored call is tagged
with the checkpoint that sampled it."""

from __future__ import annotations

from test_agent import SYNTH
from tiny_models import save_tiny

from agentmem.agent.loop import AgentConfig
from agentmem.agent.rollout import RolloutConfig
from agentmem.records import TeacherContext
from agentmem.training.loop import TrainConfig, run_train
from store import repository as repo


def test_two_rounds_chain_checkpoints_and_tag_policy_versions(sqlite_store, tmp_path):
    folder = save_tiny(tmp_path / "tiny")
    config = TrainConfig(
        student=folder, teacher=folder, context=TeacherContext.privileged, rounds=2, steps_per_round=1,
        invocations_per_step=4, lr=1e-3, out=str(tmp_path / "ckpt"),
        rollout=RolloutConfig(env_knobs=SYNTH, episodes=2, group_size=2, chunk_tokens=48,
                              agent=AgentConfig(memory_tokens=8, answer_max_new_tokens=4, max_batch=4)),
    )
    run_id, rounds = run_train(sqlite_store, config)
    assert len(rounds) == 2
    assert rounds[1].policy == rounds[0].checkpoint
    assert rounds[1].checkpoint.parent_id == rounds[0].checkpoint.id
    assert rounds[0].checkpoint.parent_id == rounds[0].policy.id and rounds[0].policy.path == folder
    with sqlite_store.session() as s:
        assert repo.get_run(s, run_id).status == "finished"
        for r in rounds:
            versions = {i.policy_version for i in repo.stream_invocations(s, run_ids=[r.rollout_run_id])}
            assert versions == {r.policy.id}
            assert len(repo.list_train_steps(s, r.distill_run_id)) == 1

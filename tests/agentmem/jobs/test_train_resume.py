"""``agentmem train --resume``: a loop killed in round 2 (before its distill started, or in the middle of
it) and resumed ends with the same checkpoint as an uninterrupted loop, with one rollout and one distill
run linked per round; a finished run or a run of another kind is refused with a clear error."""

from __future__ import annotations

import pytest
import torch
from job_fixtures import tiny_train
from transformers import AutoModelForCausalLM

from agentmem.errors import RunError
from agentmem.jobs.train import load_train_state, round_out, run_train
from agentmem.testing.tiny_models import save_tiny
from store import repository as repo


class Killed(Exception):
    pass


def weights(path: str) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(path).state_dict()


def kill_before_round_2_distills(msg: str) -> None:
    if msg.startswith("round 2/3: rollout F1"):
        raise Killed


def kill_in_round_2_distill():
    seen = {"n": 0}

    def on_step(step) -> None:
        seen["n"] += 1
        if seen["n"] == 4:  # round 1 took steps 1-2; round 2 dies after its step 2, before saving it
            raise Killed

    return on_step


def test_a_killed_loop_resumes_to_the_same_checkpoint(sqlite_store, tmp_path):
    store = sqlite_store
    folder = save_tiny(tmp_path / "tiny")
    config = tiny_train(folder, tmp_path).model_copy(update={"rounds": 3})
    optim = config.distill.optim.model_copy(update={"steps": 2})
    config = config.model_copy(update={"distill": config.distill.model_copy(update={"optim": optim, "save_every": 1})})
    straight_id, straight = run_train(store, config)
    expected = weights(straight[-1].checkpoint.path)

    for kill in ({"on_phase": kill_before_round_2_distills}, {"on_step": kill_in_round_2_distill()}):
        with pytest.raises(Killed):
            run_train(store, config, **kill)
        with store.session() as s:
            (killed,) = [r.run for r in repo.list_runs(s) if r.run.kind.value == "train" and r.run.status == "failed"]
        state = load_train_state(store, killed.id[:8])
        assert [r.round for r in state.finished] == [0]
        assert (state.pending_distill is None) == ("on_phase" in kill)
        run_id, rounds = run_train(store, None, resume=killed.id[:8])
        assert run_id == killed.id and [r.round for r in rounds] == [0, 1, 2]
        for a, b in zip(rounds, rounds[1:], strict=False):
            assert b.policy == a.checkpoint
        got = weights(rounds[-1].checkpoint.path)
        for name in expected:
            assert torch.equal(got[name], expected[name]), name
        assert rounds[-1].checkpoint.path.startswith(round_out(config.distill.out, run_id, 2))
        with store.session() as s:
            assert repo.get_run(s, run_id).status == "finished"
            linked = [r.run for r in repo.list_runs(s) if r.run.kind.value == "distill"
                      and r.run.config["out"].startswith(str(tmp_path / "ckpt" / run_id))]
        assert len(linked) == 3 and {r.status for r in linked} == {"finished"}
        assert len({r.rollout_run_id for r in rounds}) == len({r.distill_run_id for r in rounds}) == 3
        assert load_train_state(store, run_id).finished == rounds

    with pytest.raises(RunError, match=f"train run {straight_id} .*finished all 3 rounds: nothing to resume"):
        run_train(store, None, resume=straight_id)
    with pytest.raises(RunError, match="is a rollout run, not a train run"):
        run_train(store, None, resume=straight[0].rollout_run_id)

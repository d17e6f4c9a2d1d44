"""One meaning per name: a rollout samples under a ``SamplingContext`` (aligned, privileged), a teacher reads
under a ``TeacherContext``; configs stored before the split read back through the new models unchanged;
``replay.rebuild`` is the one place that branches on the teacher context; the distill job reads a run's
sampling context and policy from its stored config through the config's model."""

from __future__ import annotations

import pytest

from agentmem.config import DistillConfig, PromptLayout, RolloutConfig, ScoreConfig
from agentmem.errors import ConfigError
from agentmem.jobs.distill import check_rl_runs
from agentmem.records import Invocation, Run, RunKind, SamplingContext, TeacherContext
from agentmem.replay import ReplayError, rebuild
from store import repository as repo

# A rollout config exactly as runs stored it before ``prompt_layout`` existed and before SamplingContext.
OLD_ROLLOUT = {
    "env": "synthetic", "data": None, "env_knobs": {}, "model": "default", "policy": "model",
    "backend": "transformers", "base_url": None, "dtype": "float32", "episodes": 2, "group_size": 1, "seed": 0,
    "chunk_tokens": 512, "agent": {"memory_tokens": 256, "answer_max_new_tokens": 32, "max_chunks": None,
                                   "temperature": 1.0, "top_p": 1.0, "memory_policy": "overwrite",
                                   "memory_options": {}, "max_batch": 8, "seed": 0},
    "context": "privileged",
}
# A score config as stored when ``kinds`` was list[InvocationKind].
OLD_SCORE = {
    "run_ids": ["r"], "teacher": "default", "student": None, "context": "persistent",
    "kinds": ["memory_update", "answer"], "row_tokens": 4096, "rows_per_batch": 1, "topk": 0,
    "topk_dir": "agentmem_topk", "path": "fast", "packing": "shared_prefix", "teacher_truncation": "error",
    "dtype": "float32", "temperature": 1.0, "privileged_file": None,
}


def test_stored_configs_from_before_read_through_the_new_models():
    rollout = RolloutConfig.stored(OLD_ROLLOUT)
    assert rollout.context is SamplingContext.privileged
    assert rollout.agent.prompt_layout is PromptLayout.memory_first
    assert rollout.model_dump(mode="json") == {
        **OLD_ROLLOUT, "agent": {**OLD_ROLLOUT["agent"], "prompt_layout": "memory-first"}}
    score = ScoreConfig.model_validate(OLD_SCORE)
    assert score.context is TeacherContext.persistent and score.kinds == ["memory_update", "answer"]
    assert score.model_dump(mode="json") == OLD_SCORE
    distill = DistillConfig(run_ids=["r"], context="persistent_chat").model_dump(mode="json")
    del distill["loss_terms"]  # the one field added since
    assert DistillConfig.model_validate(distill).model_dump(mode="json") == {**distill, "loss_terms": {}}


def test_a_rollout_samples_under_two_contexts_only():
    assert [c.value for c in SamplingContext] == ["aligned", "privileged"]
    assert {c.value for c in SamplingContext} < {c.value for c in TeacherContext}
    for teacher_only in ("persistent", "persistent_chat"):
        with pytest.raises(ValueError, match="Input should be 'aligned' or 'privileged'"):
            RolloutConfig(context=teacher_only)
        with pytest.raises(ValueError, match="Input should be 'aligned' or 'privileged'"):
            Invocation(episode_id="e", step=0, kind="answer", prompt_ids=[1], output_ids=[2], output_logprobs=None,
                       sampled_context=teacher_only)


def test_distill_reads_the_stored_sampling_context_and_policy_through_the_config(sqlite_store):
    runs = {"privileged": OLD_ROLLOUT, "oracle": {**OLD_ROLLOUT, "context": "aligned", "policy": "oracle"},
            "plain": {**OLD_ROLLOUT, "context": "aligned"}}
    ids = {}
    with sqlite_store.session() as s:
        for name, config in runs.items():
            run = Run(kind=RunKind.rollout, config=config, status="finished")
            repo.insert_run(s, run)
            ids[name] = run.id
        s.commit()
    check_rl_runs(sqlite_store, DistillConfig(run_ids=[ids["plain"]], teacher=None, kd_weight=0))
    with pytest.raises(ConfigError, match=f"run {ids['privileged']} was sampled under the privileged prompt"):
        check_rl_runs(sqlite_store, DistillConfig(run_ids=[ids["privileged"]], teacher=None, kd_weight=0))
    with pytest.raises(ConfigError, match=f"run {ids['oracle']} is an oracle rollout"):
        check_rl_runs(sqlite_store, DistillConfig(run_ids=[ids["oracle"]], teacher=None, kd_weight=0))


def call(step: int, episode: str = "e") -> Invocation:
    return Invocation(id=f"{episode}{step}", episode_id=episode, step=step, kind="memory_update",
                      prompt_ids=[10 + step, 20 + step], output_ids=[30 + step], output_logprobs=[-0.5])


def test_rebuild_alone_checks_what_each_teacher_context_needs():
    gappy = [call(0), call(2)]  # step 1 not selected (say, another kind)
    assert [s.input_ids.tolist() for s in rebuild(gappy, TeacherContext.aligned)] == [[10, 20, 30], [12, 22, 32]]
    for context in (TeacherContext.persistent, TeacherContext.persistent_chat):
        with pytest.raises(ReplayError, match=rf"teacher context '{context.value}' needs whole episodes: episode e "
                                              r"has step 2 without step 1"):
            list(rebuild(gappy, context, conversation=lambda history, inv: [1, int(inv.prompt_ids[-1])]))
    whole = [call(0), call(1)]
    assert [s.input_ids.tolist() for s in rebuild(whole, TeacherContext.persistent)][1][:3] == [10, 20, 30]
    with pytest.raises(ReplayError, match="teacher context 'privileged' needs the teacher's tokenizer"):
        list(rebuild(whole, TeacherContext.privileged))

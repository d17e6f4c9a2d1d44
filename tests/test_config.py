"""The job configs: a rollout samples under a ``SamplingContext`` (aligned, privileged), a teacher reads under a
``TeacherContext``; configs stored before the split read back through the current models unchanged."""

from __future__ import annotations

import pytest

from agentmem.config import DistillConfig, PromptLayout, RolloutConfig, ScoreConfig
from agentmem.records import Invocation, SamplingContext, TeacherContext

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

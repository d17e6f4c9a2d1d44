"""The job configs: a rollout samples under a ``SamplingContext`` (aligned, privileged), a teacher reads under a
``TeacherContext``; configs stored before the split read back through the current models unchanged."""

from __future__ import annotations

import pytest
from helpers import OLD_ROLLOUT

from agentmem.config import (
    DistillConfig,
    LossSection,
    PromptLayout,
    RLKind,
    RLSection,
    RolloutConfig,
    ScoreConfig,
    TeacherSection,
)
from agentmem.records import Invocation, SamplingContext, TeacherContext

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


def test_a_distill_config_takes_its_fields_in_their_sections_only():
    """A field of a section given at the top level is an unknown field, never moved into its section."""
    distill = DistillConfig(run_ids=["r"], teacher=TeacherSection(model=None), rl=RLSection(kind=RLKind.none),
                            loss=LossSection(ce_weight=1.0))
    assert distill.teacher.model is None
    stored = distill.model_dump(mode="json")
    assert list(stored) == ["run_ids", "student", "kinds", "seed", "out", "save_every", "keep_last", "keep_optimizer",
                            "dtype", "mixed_precision", "monitor_start_kl", "teacher", "loss", "rl", "optim", "batch"]
    assert DistillConfig.model_validate(stored) == distill
    for flat in ({"lr": 1e-4}, {"teacher_temperature": 0.5}, {"truncate": "left"}):
        with pytest.raises(ValueError, match="Extra inputs are not permitted"):
            DistillConfig.model_validate({"run_ids": ["r"], **flat})


def test_a_rollout_samples_under_the_student_and_the_two_teacher_prompts_only():
    # hint: the teacher's prompt with the one-line chunk hint (validating a hint teacher samples under it)
    assert [c.value for c in SamplingContext] == ["aligned", "privileged", "hint"]
    assert {c.value for c in SamplingContext} < {c.value for c in TeacherContext}
    for teacher_only in ("persistent", "persistent_chat"):
        with pytest.raises(ValueError, match="Input should be 'aligned', 'privileged' or 'hint'"):
            RolloutConfig(context=teacher_only)
        with pytest.raises(ValueError, match="Input should be 'aligned', 'privileged' or 'hint'"):
            Invocation(episode_id="e", step=0, kind="answer", prompt_ids=[1], output_ids=[2], output_logprobs=None,
                       sampled_context=teacher_only)

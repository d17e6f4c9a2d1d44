"""The job configs: a rollout samples under a ``SamplingContext`` (aligned, privileged), a teacher reads under a
``TeacherContext``; configs stored before the split read back through the current models unchanged."""

from __future__ import annotations

import pytest

from agentmem.config import (
    DistillConfig,
    Divergence,
    Oversize,
    Packing,
    PromptLayout,
    RLKind,
    RolloutConfig,
    ScoreConfig,
    TeacherTruncation,
)
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
# A distill config as runs stored it before its fields were grouped into sections (and before loss_terms).
OLD_DISTILL = {
    "run_ids": ["r"], "student": "default", "teacher": "teacher-ckpt", "teacher_source": "model",
    "context": "persistent_chat", "aligned_kinds": None, "loss": "forward_kl", "beta": 0.5, "temperature": 1.0,
    "teacher_temperature": 1.0, "teacher_min_confidence": 0.0, "teacher_centering": "none", "rl": "none",
    "kd_weight": 1.0, "rl_weight": 1.0, "ce_weight": 0.0, "anchor_weight": 0.0, "normalize_std": False,
    "clip_eps": 0.2, "weighting": "token", "steps": 3, "invocations_per_step": 4, "row_tokens": 4096, "lr": 3e-05,
    "warmup_steps": 0, "schedule": "constant", "min_lr_ratio": 0.1, "schedule_offset": 0, "schedule_steps": None,
    "carry_optimizer": False, "carry_first_moment": True, "reward": "sub_em", "monitor_start_kl": False,
    "weight_decay": 0.0, "max_grad_norm": 1.0, "seed": 0, "out": "checkpoints", "save_every": None, "kinds": None,
    "path": "fast", "packing": "shared_prefix", "oversize": "error", "teacher_truncation": "error",
    "dtype": "float32", "mixed_precision": False, "target": "teacher", "alpha_tau": 0.1, "alpha_topk": 20,
    "alpha_min": 0.0, "alpha_max": 1.0, "alpha_ema": 0.0, "prob_floor": 0.0, "jsd_clip": None, "psd": "none",
    "psd_mix": 0.5,
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




def test_a_distill_config_stored_flat_reads_into_its_sections():
    """A run stored before the sections names every field at the top level: it loads, each value in its
    section, and stores the nested form, which loads to the same config."""
    distill = DistillConfig.model_validate(OLD_DISTILL)
    assert (distill.teacher.model, distill.teacher.context, distill.loss.divergence, distill.rl.kind) == (
        "teacher-ckpt", TeacherContext.persistent_chat, Divergence.forward_kl, RLKind.none)
    assert (distill.optim.steps, distill.optim.lr, distill.batch.invocations_per_step, distill.batch.packing) == (
        3, 3e-5, 4, Packing.shared_prefix)
    assert distill.rl.reward.value == "sub_em" and distill.loss.terms == {} and distill.loss.kd_form.value == "additive"
    stored = distill.model_dump(mode="json")
    assert list(stored) == ["run_ids", "student", "kinds", "seed", "out", "save_every", "keep_last", "keep_optimizer",
                            "dtype", "mixed_precision", "monitor_start_kl", "teacher", "loss", "rl", "optim", "batch"]
    assert stored["optim"]["lr"] == 3e-5 and stored["teacher"]["model"] == "teacher-ckpt"
    assert DistillConfig.model_validate(stored) == distill
    # every flat value lands where the sections keep it
    flat = {name: stored[path.split(".")[0]][path.split(".")[1]] for name, path in DistillConfig.FLAT_FIELDS.items()}
    top = {k: v for k, v in stored.items() if not isinstance(v, dict)}
    assert {**top, **flat} == {**OLD_DISTILL, "loss_terms": {}, "kd_form": "additive", "keep_last": None,
                               "keep_optimizer": False}  # with the fields added since
    # a flat call reads the same way; ``teacher`` is the teacher's name when it is no mapping
    assert DistillConfig(run_ids=["r"], teacher=None, rl="none", ce_weight=1.0).teacher.model is None
    # the field ``truncate`` of older runs: ``left`` skipped long calls and cut long teacher contexts
    legacy = DistillConfig.model_validate({"run_ids": ["r"], "truncate": "left"})
    assert (legacy.batch.oversize, legacy.teacher.truncation) == (Oversize.skip, TeacherTruncation.left)
    with pytest.raises(ValueError, match="optim.lr is given twice"):
        DistillConfig.model_validate({"lr": 1e-4, "optim": {"lr": 2e-4}})


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

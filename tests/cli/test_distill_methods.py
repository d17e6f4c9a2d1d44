"""The seed distillation methods' flags (docs/methods.md): `distill` and `train` build the config they
name (the job itself patched out), `sft` takes the anchor weight, `score` and `distill` accept `--context persistent_chat`, and an
inconsistent method option fails validation naming its flag, before any store or model is opened."""

from __future__ import annotations

import pytest
from helpers import Called
from typer.testing import CliRunner

from agentmem.config import DistillConfig, DistillTarget, TeacherSourceKind
from agentmem.errors import ConfigError
from agentmem.records import TeacherContext
from cli.app import app, error_message


def invoke(*args: str):
    return CliRunner().invoke(app, [*args, "--device", "cpu"])


METHOD_FLAGS = ["--target", "barycenter", "--alpha-tau", "0.3", "--alpha-topk", "8", "--alpha-min", "0.1",
                "--alpha-max", "0.9", "--alpha-ema", "0.5", "--prob-floor", "1e-6", "--jsd-clip", "0.25",
                "--anchor-weight", "0.2"]
METHOD_FIELDS = {"target": DistillTarget.barycenter, "alpha_tau": 0.3, "alpha_topk": 8, "alpha_min": 0.1,
                 "alpha_max": 0.9, "alpha_ema": 0.5, "prob_floor": 1e-6, "jsd_clip": 0.25, "anchor_weight": 0.2}


def test_distill_flags_reach_the_config(captured):
    result = invoke("distill", "--run", "r1", "--teacher-context", "persistent_chat", *METHOD_FLAGS)
    assert isinstance(result.exception, Called), result.output
    config: DistillConfig = captured["distill"]
    assert {k: getattr(config.loss, k) for k in METHOD_FIELDS} == METHOD_FIELDS
    assert config.teacher.context is TeacherContext.persistent_chat
    defaults = invoke("distill", "--run", "r1")
    assert isinstance(defaults.exception, Called)
    plain = captured["distill"]
    assert plain.loss.target is DistillTarget.teacher and plain.loss.jsd_clip is None and plain.loss.anchor_weight == 0.0


def test_train_forwards_the_method_flags(captured):
    result = invoke("train", *METHOD_FLAGS)
    assert isinstance(result.exception, Called), result.output
    distill = captured["train"].distill
    assert {k: getattr(distill.loss, k) for k in METHOD_FIELDS} == METHOD_FIELDS


def test_sft_takes_the_anchor_weight(captured):
    result = invoke("sft", "--run", "r1", "--anchor-weight", "0.2")
    assert isinstance(result.exception, Called), result.output
    assert captured["sft"].anchor_weight == 0.2 and captured["sft"].distill_config().loss.anchor_weight == 0.2


def test_score_accepts_persistent_chat(captured):
    result = invoke("score", "--run", "r1", "--teacher-context", "persistent_chat")
    assert isinstance(result.exception, Called), result.output
    assert captured["score"].context is TeacherContext.persistent_chat


@pytest.mark.parametrize("args,flag,message", [
    (["--alpha-tau", "0.3"], "--alpha-tau", "an option of the barycenter target"),
    (["--target", "barycenter", "--alpha-min", "0.6", "--alpha-max", "0.4"], "--alpha-max",
     "--alpha-max (0.4) must be >= --alpha-min (0.6)"),
    (["--target", "barycenter", "--teacher-source", "scores"], "--target", "needs the teacher's full distribution"),
    (["--jsd-clip", "0.5", "--teacher-source", "scores"], "--jsd-clip", "needs the teacher's full distribution"),
    (["--jsd-clip", "0.5", "--teacher", "none"], "--jsd-clip", "needs a teacher and --kd-weight > 0"),
    (["--jsd-clip", "0"], "--jsd-clip", "greater than 0"),
    (["--target", "barycenter", "--alpha-ema", "1"], "--alpha-ema", "less than 1"),
])
def test_bad_method_options_name_their_flag_before_anything_opens(captured, args, flag, message):
    result = invoke("distill", "--run", "r1", *args)
    assert isinstance(result.exception, ConfigError), result.output  # the flags' words, not the fields'
    line = error_message(result.exception)
    assert line.startswith((f"{flag}: ", f"{flag} ")) and message in line, line
    assert "distill" not in captured


def test_stored_configs_without_the_method_fields_still_load():
    """Runs stored before these options existed read back with the plain teacher target and no clip."""
    stored = DistillConfig(run_ids=["r"]).model_dump(mode="json")
    for key in METHOD_FIELDS:
        if key != "anchor_weight":
            stored["loss"].pop(key)
    config = DistillConfig.model_validate(stored)
    assert config.loss.target is DistillTarget.teacher and config.loss.jsd_clip is None
    assert config.teacher.source is TeacherSourceKind.model


def test_train_recipe_flags_reach_the_config(captured):
    """The recipe's flags (warm start, init, schedule, optimizer, reward, caps, teacher check) build the
    TrainConfig the loop gets; with no flags the defaults are TrainConfig's recipe."""
    from agentmem.config import LrSchedule, RewardKind, TrainConfig

    result = invoke("train", "--warm-start-run", "oracle1", "--warm-start-steps", "3", "--student", "ckpt9",
                    "--schedule", "constant", "--warmup-steps", "0", "--no-carry-optimizer", "--reward", "sub_em",
                    "--steps", "3", "--answer-tokens", "20", "--teacher-check-episodes", "0", "--lr", "3e-6")
    assert isinstance(result.exception, Called), result.output
    config: TrainConfig = captured["train"]
    d = config.distill
    assert config.warm_start is not None and config.warm_start.run_ids == ["oracle1"] and config.warm_start.optim.steps == 3
    o = d.optim
    assert (d.student, o.schedule, o.warmup_steps, o.carry_optimizer, d.rl.reward, o.steps, o.lr) == (
        "ckpt9", LrSchedule.constant, 0, False, RewardKind.sub_em, 3, 3e-6)
    assert o.carry_first_moment is False  # the recipe's default (moot here, with nothing carried)
    result = invoke("train", "--student", "ckpt9", "--carry-first-moment")
    assert isinstance(result.exception, Called), result.output
    assert captured["train"].distill.optim.carry_first_moment is True and captured["train"].distill.optim.carry_optimizer
    assert config.rollout.agent.answer_max_new_tokens == 20 and config.teacher_check_episodes == 0
    assert isinstance(invoke("train").exception, Called)
    plain, recipe = captured["train"], TrainConfig()
    assert plain.distill.optim == recipe.distill.optim and plain.distill.rl.reward == recipe.distill.rl.reward
    assert plain.distill.monitor_start_kl == recipe.distill.monitor_start_kl
    assert plain.rollout.group_size == recipe.rollout.group_size
    assert plain.rollout.agent.answer_max_new_tokens == recipe.rollout.agent.answer_max_new_tokens
    assert plain.warm_start is None and plain.teacher_check_episodes == recipe.teacher_check_episodes


def test_mixed_precision_flag_reaches_distill_and_the_warm_start(captured):
    """``train --mixed-precision``: every round's distill and the warm start's SFT (tied to it unless given)."""
    result = invoke("train", "--warm-start-run", "oracle1", "--mixed-precision")
    assert isinstance(result.exception, Called), result.output
    config = captured["train"]
    assert config.distill.mixed_precision and config.warm_start.mixed_precision
    result = invoke("train", "--warm-start-run", "oracle1", "--mixed-precision", "--no-warm-start-mixed-precision")
    assert isinstance(result.exception, Called), result.output
    assert captured["train"].distill.mixed_precision and not captured["train"].warm_start.mixed_precision
    assert isinstance(invoke("sft", "--run", "r", "--mixed-precision").exception, Called)
    assert captured["sft"].mixed_precision
    result = invoke("distill", "--run", "r", "--train-dtype", "bfloat16", "--mixed-precision")
    assert not isinstance(result.exception, Called) and "distill" not in captured
    assert "needs --train-dtype float32, got --train-dtype bfloat16" in result.output + str(result.exception)

"""Training progress on a pipe or in a log: one plain line every few steps, flushed as the steps finish; the
loss part shows the terms that are on, read from the step's metrics (built-in and plugin terms alike)."""

from __future__ import annotations

import io

from agentmem.records import TrainStep
from cli.training_progress import LineProgress, loss_parts


def step(n: int) -> TrainStep:
    return TrainStep(run_id="r", step=n, loss=1.0 / n, lr=5e-5, tokens=1000,
                     seconds=2.0, metrics={"ce_loss": 1.0 / n, "skipped_calls": 1.0 if n == 2 else 0.0})


def test_one_line_per_step_for_short_runs_and_every_twentieth_for_long_ones():
    out = io.StringIO()
    lines = LineProgress("sft", stream=out)
    lines.on_start(3)
    for n in (1, 2, 3):
        lines.on_step(step(n))
    printed = out.getvalue().splitlines()
    assert [line.split(" loss ")[0] for line in printed] == ["sft step 1/3", "sft step 2/3", "sft step 3/3"]
    assert printed[0].startswith("sft step 1/3 loss 1.0000 (ce 1.0000) 500 tok/s 2.0 s/step 0:00")
    assert printed[1].endswith(" skipped_calls=1") and printed[2].endswith(" skipped_calls=1")
    out = io.StringIO()
    lines = LineProgress("sft", stream=out)
    lines.on_start(45, 0)
    for n in range(1, 46):
        lines.on_step(step(n))
    assert [int(line.split()[2].split("/")[0]) for line in out.getvalue().splitlines()] == [
        2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42, 44, 45]


def step_with(metrics: dict) -> TrainStep:
    return TrainStep(run_id="r", step=1, loss=0.75, tokens=10, lr=1e-5, seconds=1.0, metrics=metrics)


def test_progress_shows_the_terms_that_are_on():
    assert loss_parts(step_with({"ce_loss": 0.75, "actions": 12.0})) == "ce 0.7500"
    assert loss_parts(step_with({"ce_loss": 0.7, "anchor_loss": 0.05})) == "ce 0.7000, anchor 0.0500"
    distill = step_with({"kd_loss": 0.0, "rl_loss": -0.125, "clip_fraction": 0.5, "entropy_bonus_loss": 0.25})
    assert loss_parts(distill) == "kd 0.0000, rl -0.1250, entropy_bonus 0.2500"  # a plugin's term too
    assert loss_parts(step_with({})) == ""

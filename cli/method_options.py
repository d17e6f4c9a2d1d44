"""The distillation-method flags shared by ``distill`` and ``train`` (docs/methods.md): the target (the
teacher, or DemoPSD's barycenter with its alpha options), OPSD's per-token clip and the frozen anchor
(also on ``sft``); PSD's sample mode and mix (``distill`` only). Defaults are ``DistillConfig``'s."""

from __future__ import annotations

from typing import Annotated

import typer

from agentmem.config import DistillTarget, LrSchedule, PsdMode

TargetOption = Annotated[DistillTarget, typer.Option(
    help="What the distillation term pulls towards: teacher (its distribution) or barycenter (DemoPSD: "
         "q ∝ p_teacher^alpha p_student^(1-alpha) per token, alpha = exp(-JSD/tau) from their disagreement).")]
AlphaTauOption = Annotated[float, typer.Option(
    help="Barycenter: tau of alpha = exp(-D / tau), D the top-K-union JSD (at most ln 2 = 0.69).")]
AlphaTopkOption = Annotated[int, typer.Option(
    help="Barycenter: K, the JSD is taken on the union of teacher's and student's top-K tokens.")]
AlphaMinOption = Annotated[float, typer.Option(help="Barycenter: lower clamp of alpha.")]
AlphaMaxOption = Annotated[float, typer.Option(help="Barycenter: upper clamp of alpha.")]
AlphaEmaOption = Annotated[float, typer.Option(
    help="Barycenter: decay of a running mean of alpha over steps, blended into each token's alpha "
         "(0 = off; saved in checkpoints, restored by --resume).")]
ProbFloorOption = Annotated[float, typer.Option(
    help="Barycenter: raise every target probability to at least this, then renormalise (0 = off).")]
JsdClipOption = Annotated[float | None, typer.Option(
    help="OPSD clip: cap each token's divergence at C (min(D, C); a clipped token gets no gradient; "
         "train_steps.metrics.kd_clip_fraction). Any --loss, either --target. Default: no clip.",
    show_default=False)]
AnchorWeightOption = Annotated[float, typer.Option(
    help="Weight of KL(student || frozen starting student), OPTD's frozen anchor against drift (in train: "
         "each round's starting checkpoint; in sft: the starting weights, without LoRA adapters).")]
PsdOption = Annotated[PsdMode, typer.Option(
    help="Pseudo self-distillation (needs --context privileged): whose samples the privileged teacher scores: "
         "on_policy (the student's rollouts), off_policy (`rollout --context privileged` runs), mixed (one of "
         "each; loss (1 - m) L_on + m L_off, m = --psd-mix). Checks the runs before any model loads.")]
PsdMixOption = Annotated[float, typer.Option(
    help="PSD mixed: m, the off-policy part's share of the step loss (each part's tokens weighted within the "
         "part; each step draws half its calls from each).")]

# The learning-rate schedule (``agentmem.training.schedule``), shared by distill and sft.
WarmupStepsOption = Annotated[int, typer.Option(help="Linear warmup steps (step s at lr x (s+1)/(warmup+1)).")]
ScheduleOption = Annotated[LrSchedule, typer.Option(help="After warmup: constant, or cosine decay to 0.1 x lr at "
                                                         "the last step.")]

"""``agentmem distill``: train a student from stored invocations."""

from __future__ import annotations

from typing import Annotated

import typer

from agentmem.config import (
    AttentionPath,
    Device,
    DistillTarget,
    Divergence,
    LrSchedule,
    Oversize,
    Packing,
    PsdMode,
    RewardKind,
    RLKind,
    TeacherSourceKind,
    TeacherTruncation,
    Weighting,
)
from agentmem.records import TeacherContext
from cli.method_options import (
    AlphaEmaOption,
    AlphaMaxOption,
    AlphaMinOption,
    AlphaTauOption,
    AlphaTopkOption,
    AnchorWeightOption,
    JsdClipOption,
    ProbFloorOption,
    PsdMixOption,
    PsdOption,
    ScheduleOption,
    TargetOption,
    WarmupStepsOption,
)
from cli.options import DbOption, DeviceOption, FsdpOption, ReportToOption, ThreadsOption


def distill(
    run: Annotated[list[str], typer.Option("--run", help="Rollout run id(s) to train on (repeatable).")] = [],  # noqa: B006
    student: Annotated[str, typer.Option(help="Student: model folder, checkpoint id, hub name or 'default'.")]
    = "default",
    teacher: Annotated[str, typer.Option(help="Teacher (same tokenizer as the student); 'none' for RL only.")]
    = "default",
    context: Annotated[TeacherContext, typer.Option(
        help="Teacher context: aligned (the student's own state) | persistent (earlier calls concatenated as "
             "stored) | persistent_chat (the episode as one multi-turn chat) | privileged.")]
    = TeacherContext.aligned,
    loss: Annotated[Divergence, typer.Option(help="Divergence at action positions.")] = Divergence.reverse_kl,
    teacher_source: Annotated[TeacherSourceKind, typer.Option(
        help="Teacher targets: model (run online on packed rows) | shards (top-K log-probs written by "
             "`agentmem score --topk`) | scores (stored per-token teacher log-probs of `agentmem score`).")]
    = TeacherSourceKind.model,
    beta: Annotated[float, typer.Option(help="Generalised JSD interpolation (TRL semantics).")] = 0.5,
    temperature: Annotated[float, typer.Option(help="Temperature of both distributions in the divergence.")]
    = 1.0,
    rl: Annotated[RLKind, typer.Option(help="RL term on the final reward.")] = RLKind.grpo,
    kd_weight: Annotated[float, typer.Option(help="Weight of the distillation term.")] = 1.0,
    rl_weight: Annotated[float, typer.Option(help="Weight of the policy-gradient term.")] = 1.0,
    ce_weight: Annotated[float, typer.Option(help="Weight of cross-entropy on the action tokens.")] = 0.0,
    kinds: Annotated[str | None, typer.Option(help="Call kinds to train on, comma-separated: memory_update "
                                                   "(alias update), answer, or a memory policy's own (route, "
                                                   "event_view, log_search, ...). Default: all.")] = None,
    anchor_weight: AnchorWeightOption = 0.0,
    target: TargetOption = DistillTarget.teacher,
    alpha_tau: AlphaTauOption = 0.1,
    alpha_topk: AlphaTopkOption = 20,
    alpha_min: AlphaMinOption = 0.0,
    alpha_max: AlphaMaxOption = 1.0,
    alpha_ema: AlphaEmaOption = 0.0,
    prob_floor: ProbFloorOption = 0.0,
    jsd_clip: JsdClipOption = None,
    psd: PsdOption = PsdMode.none,
    psd_mix: PsdMixOption = 0.5,
    normalize_std: Annotated[bool, typer.Option(help="Divide advantages by the group's std.")] = False,
    weighting: Annotated[Weighting, typer.Option(help="Token averaging over the global step.")] = Weighting.token,
    steps: Annotated[int | None, typer.Option(help="Optimizer steps in all (default 10; on --resume, the "
                                                   "stored value unless given).")] = None,
    invocations_per_step: Annotated[int, typer.Option(help="Stored calls per optimizer step.")] = 8,
    row_tokens: Annotated[int, typer.Option(help="Tokens per packed row.")] = 4096,
    oversize: Annotated[Oversize, typer.Option(help="A stored call longer than --row-tokens: error, or skip "
                                                    "(left out and counted). Never cut.")] = Oversize.error,
    teacher_truncation: Annotated[TeacherTruncation, typer.Option(
        help="A teacher context longer than --row-tokens: error, or left (cut from the left, counted).")]
    = TeacherTruncation.error,
    lr: Annotated[float, typer.Option(help="Peak AdamW learning rate.")] = 1e-5,
    warmup_steps: WarmupStepsOption = 0,
    schedule: ScheduleOption = LrSchedule.constant,
    carry_optimizer: Annotated[bool, typer.Option(
        help="Start AdamW from the state saved in the student's checkpoint folder (a previous distill's).")]
    = False,
    reward: Annotated[RewardKind, typer.Option(help="Episode reward of the RL term: f1 (the stored reward), "
                                                    "sub_em, or max_f1_sub_em.")] = RewardKind.f1,
    monitor_start_kl: Annotated[bool, typer.Option(help="Also load the starting student to log KL(student || "
                                                        "start) every step.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the data order.")] = 0,
    out: Annotated[str, typer.Option(help="Folder for checkpoints.")] = "checkpoints",
    save_every: Annotated[int | None, typer.Option(help="Save a checkpoint every N steps (and at the end).")]
    = None,
    attention: Annotated[AttentionPath, typer.Option(help="Packed attention path.")] = AttentionPath.fast,
    packing: Annotated[Packing, typer.Option(
        help="Row layout: segments (each call whole) or shared_prefix (a (run, task, step) group's common "
             "prompt prefix placed and computed once; exact).")] = Packing.segments,
    resume: Annotated[str | None, typer.Option(help="Continue distill run RUN_ID from its last checkpoint.")]
    = None,
    report_to: ReportToOption = [],  # noqa: B006
    device: DeviceOption = Device.auto,
    threads: ThreadsOption = None,
    fsdp: FsdpOption = False,
    db: DbOption = None,
) -> None:
    """On-policy distillation from the store: the teacher scores each sampled token under the state the
    student saw (or another context), plus a clipped group-relative policy gradient on the final F1."""
    from agentmem.config import DistillConfig
    from agentmem.errors import ConfigError
    from agentmem.records import RunKind
    from agentmem.tracking import check_installed, parse_report_to
    from cli.common import preflight, runtime, setup_logging

    trackers = parse_report_to(report_to)
    check_installed(trackers)
    config = None
    if not resume:
        if not run:
            raise ConfigError("give at least one --run RUN_ID to train on (see `agentmem runs`)")
        config = DistillConfig(
            run_ids=run, student=student, teacher=None if teacher == "none" else teacher, context=context, kinds=kinds,
            teacher_source=teacher_source, loss=loss, beta=beta, temperature=temperature, rl=rl,
            kd_weight=kd_weight, rl_weight=rl_weight, ce_weight=ce_weight, anchor_weight=anchor_weight,
            normalize_std=normalize_std, weighting=weighting, steps=steps or 10,
            invocations_per_step=invocations_per_step, row_tokens=row_tokens, oversize=oversize,
            teacher_truncation=teacher_truncation, lr=lr, warmup_steps=warmup_steps, schedule=schedule,
            carry_optimizer=carry_optimizer, reward=reward, monitor_start_kl=monitor_start_kl,
            seed=seed, out=out, save_every=save_every,
            path=attention, packing=packing, target=target, alpha_tau=alpha_tau, alpha_topk=alpha_topk,
            alpha_min=alpha_min, alpha_max=alpha_max, alpha_ema=alpha_ema, prob_floor=prob_floor, jsd_clip=jsd_clip,
            psd=psd, psd_mix=psd_mix,
        )
    preflight(db, runs=None if resume else run, resume=resume, kind=RunKind.distill,
              models=() if resume else (student, None if teacher == "none" else teacher),
              kinds=config.kinds if config else None)
    rt = runtime(device, threads, fsdp)
    setup_logging()
    with rt:
        result = _train(rt, db, config, resume, steps, trackers)
    if not rt.is_main:
        return
    ckpt = result.last_checkpoint
    skipped = result.skipped_calls
    typer.echo(f"distill_run_id={result.run_id} steps={result.steps_done}"
               + (f" checkpoint={ckpt.id} path={ckpt.path}" if ckpt else "")
               + (f" skipped_calls={skipped}" if skipped else "")
               + (f" teacher_truncated_calls={result.teacher_truncated_calls}" if result.teacher_truncated_calls
                  else ""))
    from agentmem.training.dynamics import round_warnings
    from cli.console import console

    for warning in round_warnings(result.history, any("rl_groups" in s.metrics for s in result.history)):
        console(stderr=True).print(f"warning: {warning}")


def _train(rt, db: str | None, config, resume: str | None, steps: int | None, trackers):
    """Run the job; progress and trackers on rank 0 only (the only process under plain ``agentmem``)."""
    from agentmem.jobs.distill import run_distill
    from cli.common import training_store
    from cli.job_session import job_session
    from cli.training_progress import train_progress

    store = training_store(db, rt)
    if not rt.is_main:
        return run_distill(store, config, rt, resume=resume, steps=steps)
    with job_session(db), train_progress() as progress:
        return run_distill(store, config, rt, resume=resume, steps=steps, on_start=progress.on_start,
                           on_step=progress.on_step, report_to=trackers)


def register(app: typer.Typer) -> None:
    app.command()(distill)

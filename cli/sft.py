"""``agentmem sft``: supervised fine-tuning (cross-entropy on the action tokens) from stored calls."""

from __future__ import annotations

from typing import Annotated

import typer

from agentmem.config import AttentionPath, Device, DType, LrSchedule, Oversize, Packing, Weighting
from cli.method_options import AnchorWeightOption, ScheduleOption, WarmupStepsOption
from cli.options import DbOption, DeviceOption, FsdpOption, ReportToOption, ThreadsOption


def sft(
    run: Annotated[list[str], typer.Option("--run", help="Run id(s) whose stored calls to train on: oracle runs, "
                                                         "a teacher's runs or the student's own (repeatable).")]
    = [],  # noqa: B006
    student: Annotated[str, typer.Option(help="Student: model folder, checkpoint id, hub name or 'default'.")]
    = "default",
    min_f1: Annotated[float | None, typer.Option(help="Train only on calls of episodes with F1 >= this (e.g. a "
                                                      "student's own successful episodes).")] = None,
    kinds: Annotated[str | None, typer.Option(help="Call kinds to train on, comma-separated: memory_update "
                                                   "(alias update), answer, or a memory policy's own (route, event_view, "
                                                   "log_search, ...). "
                                                   "Default: all.")] = None,
    lora_rank: Annotated[int | None, typer.Option(help="Train LoRA adapters of this rank instead of every "
                                                       "weight; checkpoints hold the merged weights.")] = None,
    lora_alpha: Annotated[float, typer.Option(help="LoRA scaling numerator (scale = alpha / rank).")] = 16.0,
    lora_dropout: Annotated[float, typer.Option(help="Dropout on the LoRA input.")] = 0.0,
    lora_targets: Annotated[str | None, typer.Option(
        help="Modules that get adapters, comma-separated (default: q_proj,k_proj,v_proj,o_proj,gate_proj,"
             "up_proj,down_proj).")] = None,
    steps: Annotated[int | None, typer.Option(help="Optimizer steps in all (default 10; on --resume, the "
                                                   "stored value unless given).")] = None,
    invocations_per_step: Annotated[int, typer.Option(help="Stored calls per optimizer step.")] = 8,
    row_tokens: Annotated[int, typer.Option(help="Tokens per packed row.")] = 4096,
    oversize: Annotated[Oversize, typer.Option(help="A stored call longer than --row-tokens: error, or skip "
                                                    "(left out and counted). Never cut.")] = Oversize.error,
    weighting: Annotated[Weighting, typer.Option(help="Token averaging over the global step.")] = Weighting.token,
    lr: Annotated[float, typer.Option(help="Peak AdamW learning rate.")] = 1e-5,
    warmup_steps: WarmupStepsOption = 0,
    schedule: ScheduleOption = LrSchedule.constant,
    weight_decay: Annotated[float, typer.Option(help="AdamW weight decay.")] = 0.0,
    anchor_weight: AnchorWeightOption = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of the data order (and of the LoRA initialisation).")] = 0,
    out: Annotated[str, typer.Option(help="Folder for checkpoints.")] = "checkpoints",
    save_every: Annotated[int | None, typer.Option(help="Save a checkpoint every N steps (and at the end).")]
    = None,
    attention: Annotated[AttentionPath, typer.Option(help="Packed attention path.")] = AttentionPath.fast,
    packing: Annotated[Packing, typer.Option(
        help="Row layout: segments (each call whole) or shared_prefix (a (run, task, step) group's common "
             "prompt prefix placed and computed once; exact).")] = Packing.segments,
    dtype: Annotated[DType, typer.Option(help="Student weights dtype (bf16 is faster on most CPUs).")]
    = DType.float32,
    resume: Annotated[str | None, typer.Option(help="Continue sft run RUN_ID from its last checkpoint.")] = None,
    report_to: ReportToOption = [],  # noqa: B006
    device: DeviceOption = Device.auto,
    threads: ThreadsOption = None,
    fsdp: FsdpOption = False,
    db: DbOption = None,
) -> None:
    """Supervised fine-tuning from the store: cross-entropy on the stored outputs given each call's own
    prompt (the prompt carries no loss), on the same packed path as distill; full or LoRA."""
    from agentmem.config import SftConfig
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
        extra = {"lora_targets": [t.strip() for t in lora_targets.split(",") if t.strip()]} if lora_targets else {}
        config = SftConfig(
            run_ids=run, student=student, min_f1=min_f1, kinds=kinds, lora_rank=lora_rank, lora_alpha=lora_alpha,
            lora_dropout=lora_dropout, steps=steps or 10, invocations_per_step=invocations_per_step,
            row_tokens=row_tokens, oversize=oversize, weighting=weighting, lr=lr, warmup_steps=warmup_steps,
            schedule=schedule, weight_decay=weight_decay,
            seed=seed, out=out, save_every=save_every, path=attention, packing=packing, dtype=dtype,
            anchor_weight=anchor_weight, **extra,
        )
    preflight(db, runs=None if resume else run, resume=resume, kind=RunKind.sft,
              models=() if resume else (student,), kinds=config.kinds if config else None)
    rt = runtime(device, threads, fsdp)
    setup_logging()
    with rt:
        result = _train(rt, db, config, resume, steps, trackers)
    if not rt.is_main:
        return
    ckpt = result.last_checkpoint
    typer.echo(f"sft_run_id={result.run_id} steps={result.steps_done}"
               + (f" checkpoint={ckpt.id} path={ckpt.path}" if ckpt else "")
               + (f" skipped_calls={result.skipped_calls}" if result.skipped_calls else ""))


def _train(rt, db: str | None, config, resume: str | None, steps: int | None, trackers):
    """Run the job; progress and trackers on rank 0 only (the only process under plain ``agentmem``)."""
    from agentmem.jobs.sft import run_sft
    from cli.common import training_store
    from cli.job_session import job_session
    from cli.training_progress import train_progress

    store = training_store(db, rt)
    if not rt.is_main:
        return run_sft(store, config, rt, resume=resume, steps=steps)
    # sft trains cross-entropy (and the anchor when on): the bar shows those, no kd and no rl
    with job_session(db), train_progress(label="sft", terms=()) as progress:
        return run_sft(store, config, rt, resume=resume, steps=steps, on_start=progress.on_start,
                       on_step=progress.on_step, report_to=trackers)


def register(app: typer.Typer) -> None:
    app.command()(sft)

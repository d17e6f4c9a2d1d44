"""The one command of the jobs that train from stored calls (``distill`` and ``sft``): trackers checked, the
config built from the command line (or none on ``--resume``), the cheap checks, the runtime, the job run with
progress and trackers on rank 0 only (the only process under plain ``agentmem``), one result line."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Annotated, Any, NamedTuple

import typer

from agentmem.config import Device
from agentmem.records import RunKind
from cli.config_options import CommandLineError, JobSpec, invocation, job_command, usage_error
from cli.options import DbOption, DeviceOption, FsdpOption, ReportToOption, ThreadsOption
from cli.ray_workers import (
    RayAddressOption,
    RayTrainOption,
    TrainWorkersOption,
    WorkerCpusOption,
    WorkerGpusOption,
    check_train_flags,
)

ResumeOption = Annotated[str | None, typer.Option(
    help="Continue run RUN_ID (of this command's kind) from its last checkpoint, with its stored config; "
         "--steps N extends it.")]


def training_command(spec: JobSpec, kind: RunKind, job: str, *,
                     models: Callable[[Any], tuple[str | None, ...]], doc: str,
                     after: Callable[[Any], None] = lambda result: None) -> Callable:
    """The typer command of ``kind``: ``job`` (``module.function``) is imported when the command runs (after
    the fast checks; tests patch it there); ``after`` gets the result on rank 0, after its line."""

    @job_command(spec)
    def command(ctx: typer.Context, resume: ResumeOption = None, report_to: ReportToOption = [],  # noqa: B006
                device: DeviceOption = Device.auto, threads: ThreadsOption = None, fsdp: FsdpOption = False,
                db: DbOption = None, ray: RayTrainOption = False, ray_address: RayAddressOption = None,
                train_workers: TrainWorkersOption = 1, worker_gpus: WorkerGpusOption = 0.0,
                worker_cpus: WorkerCpusOption = 1.0) -> None:
        check_train_flags(ray, ray_address, train_workers, worker_gpus, worker_cpus, fsdp)
        module, name = job.rsplit(".", 1)
        run_job = getattr(importlib.import_module(module), name)
        group = RayGroup(ray_address, train_workers, worker_gpus, worker_cpus) if ray else None
        result = train_job(ctx, kind, run_job, resume=resume, report_to=report_to, device=device,
                           threads=threads, fsdp=fsdp, db=db, models=models, ray=group)
        if result is not None:
            typer.echo(result_line(kind, result))
            after(result)

    command.__doc__ = doc
    return command


class RayGroup(NamedTuple):
    """``--ray``'s placement of the training processes: the cluster's address, how many, each one's GPUs and CPUs."""

    address: str | None
    workers: int
    gpus: float
    cpus: float


def train_job(ctx: typer.Context, kind: RunKind, run_job: Callable[..., Any], *, resume: str | None,
              report_to: list[str], device, threads: int | None, fsdp: bool, db: str | None,
              models: Callable[[Any], tuple[str | None, ...]], ray: RayGroup | None = None) -> Any:
    """Run ``run_job`` (``run_distill`` or ``run_sft``); its result on rank 0, None on the other ranks.
    ``--steps`` on ``--resume`` extends the run (the stored value unless given). With ``ray``, this process runs
    no rank: the ranks are a Ray Train group's (``cli.ray_workers.train_with_ray``), and rank 0's result comes
    back here."""
    from agentmem.tracking import check_installed, parse_report_to
    from cli.common import preflight, runtime, setup_logging

    call = invocation(ctx)
    steps_option = next(o for o in call.spec.options() if o.flags[0] == "--steps")  # distill's: optim.steps
    call.refuse_on_resume(resume, allowed=frozenset({steps_option.path}))
    with usage_error():
        trackers = parse_report_to(report_to)
    check_installed(trackers)
    config = None if resume else call.config()
    if config is not None and not config.run_ids:
        raise CommandLineError("give at least one --run RUN_ID to train on (see `agentmem runs`)")
    preflight(db, runs=config.run_ids if config else None, resume=resume, kind=kind,
              models=models(config) if config else (), kinds=config.kinds if config else None)
    steps = call.values[steps_option.param] if call.passed(steps_option.param) else None
    if ray is not None:
        from cli.ray_workers import train_with_ray

        return train_with_ray(run_job, db, address=ray.address, workers=ray.workers, gpus=ray.gpus, cpus=ray.cpus,
                              config=config, resume=resume, steps=steps, device=device, threads=threads, fsdp=fsdp,
                              report_to=trackers)
    rt = runtime(device, threads, fsdp)
    setup_logging()
    with rt:
        return _run(rt, db, run_job, config, resume, steps, trackers, kind)


def _run(rt, db: str | None, run_job, config, resume: str | None, steps: int | None, trackers, kind: RunKind):
    from cli.common import training_store
    from cli.job_session import job_session
    from cli.training_progress import train_progress

    store = training_store(db, rt)
    if not rt.is_main:
        run_job(store, config, rt, resume=resume, steps=steps)
        return None
    with job_session(db), train_progress(label=kind.value) as progress:
        return run_job(store, config, rt, resume=resume, steps=steps, on_start=progress.on_start,
                       on_step=progress.on_step, report_to=trackers)


def result_line(kind: RunKind, result) -> str:
    """``KIND_run_id=... steps=N checkpoint=... path=... size=...`` (the checkpoint folder's size on disk) and the
    calls left out or cut, if any."""
    from pathlib import Path

    ckpt = result.last_checkpoint
    truncated = result.teacher_truncated_calls
    size = sum(p.stat().st_size for p in Path(ckpt.path).rglob("*") if p.is_file()) if ckpt else 0
    return (f"{kind.value}_run_id={result.run_id} steps={result.steps_done}"
            + (f" checkpoint={ckpt.id} path={ckpt.path} size={size / 1e9:.2f}GB" if ckpt else "")
            + (f" skipped_calls={result.skipped_calls}" if result.skipped_calls else "")
            + (f" teacher_truncated_calls={truncated}" if truncated else ""))

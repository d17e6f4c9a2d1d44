"""``agentmem distill``: train a student from stored invocations."""

from __future__ import annotations

from typing import Annotated

import typer

from agentmem.config import Device
from agentmem.records import RunKind
from cli.config_options import job_command
from cli.job_specs import DISTILL
from cli.options import DbOption, DeviceOption, FsdpOption, ReportToOption, ThreadsOption
from cli.training_job import result_line, train_job


@job_command(DISTILL)
def distill(
    ctx: typer.Context,
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
    from agentmem.jobs.distill import run_distill
    from agentmem.training.dynamics import round_warnings
    from cli.console import console

    result = train_job(ctx, RunKind.distill, run_distill, resume=resume, report_to=report_to, device=device,
                       threads=threads, fsdp=fsdp, db=db, terms=("kd", "rl"),
                       models=lambda config: (config.student, config.teacher))
    if result is None:
        return
    typer.echo(result_line(RunKind.distill, result))
    for warning in round_warnings(result.history, any("rl_groups" in s.metrics for s in result.history)):
        console(stderr=True).print(f"warning: {warning}")


def register(app: typer.Typer) -> None:
    app.command()(distill)

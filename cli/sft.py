"""``agentmem sft``: supervised fine-tuning (cross-entropy on the action tokens) from stored calls."""

from __future__ import annotations

from typing import Annotated

import typer

from agentmem.config import Device
from agentmem.records import RunKind
from cli.config_options import job_command
from cli.job_specs import SFT
from cli.options import DbOption, DeviceOption, FsdpOption, ReportToOption, ThreadsOption
from cli.training_job import result_line, train_job


@job_command(SFT)
def sft(
    ctx: typer.Context,
    resume: Annotated[str | None, typer.Option(help="Continue sft run RUN_ID from its last checkpoint.")] = None,
    report_to: ReportToOption = [],  # noqa: B006
    device: DeviceOption = Device.auto,
    threads: ThreadsOption = None,
    fsdp: FsdpOption = False,
    db: DbOption = None,
) -> None:
    """Supervised fine-tuning from the store: cross-entropy on the stored outputs given each call's own
    prompt (the prompt carries no loss), on the same packed path as distill; full or LoRA."""
    from agentmem.jobs.sft import run_sft

    # sft trains cross-entropy (and the anchor when on): the bar shows those, no kd and no rl
    result = train_job(ctx, RunKind.sft, run_sft, resume=resume, report_to=report_to, device=device,
                       threads=threads, fsdp=fsdp, db=db, terms=(), models=lambda config: (config.student,))
    if result is not None:
        typer.echo(result_line(RunKind.sft, result))


def register(app: typer.Typer) -> None:
    app.command()(sft)

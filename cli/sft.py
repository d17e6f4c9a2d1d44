"""``agentmem sft``: supervised fine-tuning (cross-entropy on the action tokens) from stored calls."""

from __future__ import annotations

import typer

from agentmem.records import RunKind
from cli.job_specs import SFT
from cli.training_command import training_command

sft = training_command(
    SFT, RunKind.sft, "agentmem.jobs.sft.run_sft", models=lambda config: (config.student,),
    doc="Supervised fine-tuning from the store: cross-entropy on the stored outputs given each call's own prompt "
        "(the prompt carries no loss), on the same packed path as distill; full or LoRA.")


def register(app: typer.Typer) -> None:
    app.command("sft")(sft)

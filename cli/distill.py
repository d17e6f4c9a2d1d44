"""``agentmem distill``: train a student from stored invocations."""

from __future__ import annotations

import typer

from agentmem.records import RunKind
from cli.job_specs import DISTILL
from cli.training_command import training_command


def _warnings(result) -> None:
    """The run's dynamics warnings (no RL signal, EOS-only outputs, ...) on stderr."""
    from agentmem.training.dynamics import round_warnings
    from cli.console import console

    for warning in round_warnings(result.history, any("rl_groups" in s.metrics for s in result.history)):
        console(stderr=True).print(f"warning: {warning}")


distill = training_command(
    DISTILL, RunKind.distill, "agentmem.jobs.distill.run_distill",
    models=lambda config: (config.student, config.teacher.model), after=_warnings,
    doc="On-policy distillation from the store: the teacher scores each sampled token under the state the "
        "student saw (or another context), plus a clipped group-relative policy gradient on the final F1.")


def register(app: typer.Typer) -> None:
    app.command("distill")(distill)

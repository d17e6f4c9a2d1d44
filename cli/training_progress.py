"""A progress bar for training steps: loss parts and tokens/s."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cli.console import console


@contextlib.contextmanager
def train_progress(total: int, done: int = 0, label: str = "distill") -> Iterator[Callable]:
    progress = Progress(
        TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
        TextColumn("loss {task.fields[loss]:.4f} (kd {task.fields[kd]:.4f}, rl {task.fields[rl]:+.4f}) "
                   "{task.fields[tps]:.0f} tok/s"),
        TimeElapsedColumn(), console=console(stderr=True),
    )
    task = progress.add_task(label, total=total, completed=done, loss=0.0, kd=0.0, rl=0.0, tps=0.0)

    def on_step(step) -> None:
        progress.update(task, completed=step.step, loss=step.loss, kd=step.kd_loss, rl=step.rl_loss,
                        tps=step.tokens / max(step.seconds, 1e-9))

    with progress:
        yield on_step

"""A progress bar for training steps: loss parts, tokens/s, and calls left out or cut."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentmem.training.dynamics import note
from cli.console import console


@dataclass
class TrainProgress:
    progress: Progress
    label: str
    task: int | None = None
    counts: dict[str, float] = field(default_factory=dict)

    def on_start(self, total: int, done: int = 0) -> None:
        if self.task is None:
            self.task = self.progress.add_task(self.label, total=total, completed=done, loss=0.0, kd=0.0, rl=0.0,
                                               tps=0.0, notes="")

    def on_step(self, step) -> None:
        if self.task is None:
            self.on_start(step.step)
        for key in ("skipped_calls", "teacher_truncated_calls"):
            self.counts[key] = self.counts.get(key, 0.0) + float(step.metrics.get(key, 0.0))
        notes = " ".join([f"{k}={int(v)}" for k, v in self.counts.items() if v] + [note(step)])
        self.progress.update(self.task, completed=step.step, loss=step.loss, kd=step.kd_loss,
                             rl=step.rl_loss, tps=step.tokens / max(step.seconds, 1e-9), notes=notes)


@contextlib.contextmanager
def train_progress(total: int | None = None, done: int = 0, label: str = "distill") -> Iterator[TrainProgress]:
    progress = Progress(
        TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
        TextColumn("loss {task.fields[loss]:.4f} (kd {task.fields[kd]:.4f}, rl {task.fields[rl]:+.4f}) "
                   "{task.fields[tps]:.0f} tok/s {task.fields[notes]}"),
        TimeElapsedColumn(), console=console(stderr=True),
    )
    state = TrainProgress(progress, label)
    if total is not None:
        state.on_start(total, done)
    with progress:
        yield state

"""Progress of training steps: the loss and each of its terms that is on (every term the step reports, built-in
or a plugin's), tokens/s, and calls left out or cut; a bar on a terminal, one plain line every few steps on a pipe
or in a log."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TextIO

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentmem.training.dynamics import note
from cli.console import console


def loss_parts(step) -> str:
    """The terms of a step's loss that are on, as the step reports them (``TrainStep.term_losses``: kd, rl,
    ce, anchor, a plugin's term...), each ``name value``."""
    return ", ".join(f"{name} {value:.4f}" for name, value in step.term_losses.items())


@dataclass
class TrainProgress:
    progress: Progress
    label: str
    task: int | None = None
    counts: dict[str, float] = field(default_factory=dict)

    def on_start(self, total: int, done: int = 0) -> None:
        if self.task is None:
            self.task = self.progress.add_task(self.label, total=total, completed=done, loss=0.0, parts="",
                                               tps=0.0, notes="")

    def on_step(self, step) -> None:
        if self.task is None:
            self.on_start(step.step)
        for key in ("skipped_calls", "teacher_truncated_calls"):
            self.counts[key] = self.counts.get(key, 0.0) + float(step.metrics.get(key, 0.0))
        notes = " ".join([f"{k}={int(v)}" for k, v in self.counts.items() if v] + [note(step)])
        parts = loss_parts(step)
        self.progress.update(self.task, completed=step.step, loss=step.loss, parts=f" ({parts})" if parts else "",
                             tps=step.tokens / max(step.seconds, 1e-9), notes=notes)


@dataclass
class LineProgress:
    """``TrainProgress`` where stderr is a pipe or a file (no bar can be redrawn there): one plain line every
    ``every`` steps and at the last step, flushed at once, so a log shows the run going."""

    label: str
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    total: int | None = None
    every: int = 1
    started: float = field(default_factory=time.perf_counter)
    counts: dict[str, float] = field(default_factory=dict)

    def on_start(self, total: int, done: int = 0) -> None:
        if self.total is None:
            self.total, self.every = total, max(1, total // 20)
            self.started = time.perf_counter()

    def on_step(self, step) -> None:
        for key in ("skipped_calls", "teacher_truncated_calls"):
            self.counts[key] = self.counts.get(key, 0.0) + float(step.metrics.get(key, 0.0))
        if step.step % self.every and step.step != self.total:
            return
        parts = loss_parts(step)
        notes = " ".join([f"{k}={int(v)}" for k, v in self.counts.items() if v] + [note(step)]).strip()
        elapsed = int(time.perf_counter() - self.started)
        line = (f"{self.label} step {step.step}/{self.total or step.step} loss {step.loss:.4f}"
                + (f" ({parts})" if parts else "") + f" {step.tokens / max(step.seconds, 1e-9):.0f} tok/s"
                + f" {step.seconds:.1f} s/step {elapsed // 60}:{elapsed % 60:02d}" + (f" {notes}" if notes else ""))
        print(line, file=self.stream, flush=True)


@contextlib.contextmanager
def train_progress(total: int | None = None, done: int = 0,
                   label: str = "distill") -> Iterator[TrainProgress | LineProgress]:
    if not sys.stderr.isatty():
        lines = LineProgress(label)
        if total is not None:
            lines.on_start(total, done)
        yield lines
        return
    progress = Progress(
        TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
        TextColumn("loss {task.fields[loss]:.4f}{task.fields[parts]} {task.fields[tps]:.0f} tok/s "
                   "{task.fields[notes]}"),
        TimeElapsedColumn(), console=console(stderr=True),
    )
    state = TrainProgress(progress, label)
    if total is not None:
        state.on_start(total, done)
    with progress:
        yield state

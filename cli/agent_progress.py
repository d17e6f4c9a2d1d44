"""What `rollout` and `eval` share: a progress bar over episodes."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cli.console import console


@dataclass
class EpisodeProgress:
    """``on_start`` / ``on_round`` callbacks for the agent loop, drawing episodes, calls and tokens/s."""

    progress: Progress
    label: str
    task: int | None = None
    calls: int = 0
    tokens: int = 0
    t0: float = 0.0

    def next_part(self, label: str) -> None:
        """A new bar (its own counts) for the next evaluation of a sweep."""
        self.label, self.calls, self.tokens = label, 0, 0

    def on_start(self, total: int, done: int) -> None:
        self.t0 = time.perf_counter()
        self.task = self.progress.add_task(self.label, total=total, completed=done, calls=0, tps=0.0)

    def on_round(self, stats) -> None:
        self.calls += stats.calls
        self.tokens += stats.output_tokens
        tps = self.tokens / max(time.perf_counter() - self.t0, 1e-9)
        self.progress.update(self.task, advance=stats.finished, calls=self.calls, tps=tps)


@contextlib.contextmanager
def episode_progress(label: str) -> Iterator[EpisodeProgress]:
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("episodes"),
                        TextColumn("{task.fields[calls]} calls · {task.fields[tps]:.0f} tok/s"),
                        TimeElapsedColumn(), console=console(stderr=True))
    with progress:
        yield EpisodeProgress(progress, label)

"""How a job that makes model calls (``rollout``, ``eval``, ``score``) shows its progress: in calls, not whole
episodes.

- On a terminal: a rich bar of calls done out of the planned calls, with episodes finished, calls per second
  and the time left.
- On a pipe or in a log (stderr is not a terminal): one plain line, ``rollout: 96/400 calls (24%), 3/80
  episodes, 2.1 calls/s, about 2 min 24 s left, 46 s in``, after a round of calls when the last line is 5 s old
  or more, and from a timer when it is 30 s old (a round of calls may take longer than that on busy cores): so
  lines come at most every 5 s and at least every 30 s.

The calls of a job are planned before it starts (``cli.plan``); an agent may answer early or a memory policy
make more calls than one a chunk, so the total is corrected when the job ends or a count passes it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cli.console import console

MIN_GAP = 5.0  # seconds between two lines on a pipe, at least
MAX_GAP = 30.0  # seconds without a line on a pipe, at most


def _now() -> float:
    return time.monotonic()


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``1 h 2 min``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


@dataclass
class Counts:
    """Calls and episodes of one job (or one part of a sweep): done, planned, and since when."""

    label: str
    calls_total: int | None = None
    calls: int = 0
    episodes_total: int | None = None
    episodes: int = 0
    started: float | None = None  # when the first call could start (the job's on_start)
    done_at_start: int = 0  # calls a resumed job found done

    def line(self, now: float) -> str:
        """The plain progress line (see the module docstring)."""
        total = self.calls_total if self.calls_total is not None and self.calls_total >= self.calls else None
        parts = [f"{self.calls}/{total} calls ({100 * self.calls / total:.0f}%)" if total else f"{self.calls} calls"]
        if self.episodes_total is not None:
            parts.append(f"{self.episodes}/{self.episodes_total} episodes")
        if self.started is None:
            parts.append("loading")
            return f"{self.label}: {', '.join(parts)}"
        elapsed = now - self.started
        rate = (self.calls - self.done_at_start) / elapsed if elapsed > 0 else 0.0
        if rate > 0:
            parts.append(f"{rate:.1f} calls/s")
            if total:
                parts.append(f"about {duration((total - self.calls) / rate)} left")
        else:
            parts.append("first calls running")
        parts.append(f"{duration(elapsed)} in")
        return f"{self.label}: {', '.join(parts)}"


@dataclass
class PipeLines:
    """The plain lines of a job on a pipe: ``tick`` after a round of calls (a line when the last is ``MIN_GAP``
    old) and from a timer (a line when the last is ``MAX_GAP`` old). ``clock`` and ``emit`` are injectable."""

    counts: Counts
    emit: Callable[[str], None]
    clock: Callable[[], float] = _now
    last: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.last = self.clock()

    def tick(self, force_gap: float = MIN_GAP) -> None:
        now = self.clock()
        if now - self.last >= force_gap:
            self.emit(self.counts.line(now))
            self.last = now


@dataclass
class CallProgress:
    """``on_start`` / ``on_round`` callbacks for the agent loop (``on_start`` / ``on_batch`` for score): calls
    done, on a bar or in plain lines (see the module docstring)."""

    counts: Counts
    bar: Progress | None
    pipe: PipeLines | None
    task: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_part(self, label: str, calls_total: int | None = None, episodes_total: int | None = None) -> None:
        """New counts for the next evaluation of a sweep."""
        with self.lock:
            self.counts.label, self.counts.calls, self.counts.episodes = label, 0, 0
            self.counts.calls_total, self.counts.episodes_total = calls_total, episodes_total
            self.counts.started, self.counts.done_at_start = None, 0
            if self.bar is not None and self.task is not None:
                self.bar.update(self.task, visible=False)
                self.task = None

    def on_start(self, episodes_total: int, episodes_done: int) -> None:
        """The agent loop's ``on_start``: the episodes are known and the first calls start now."""
        with self.lock:
            self.counts.episodes_total, self.counts.episodes = episodes_total, episodes_done
            self._started()

    def on_round(self, stats) -> None:
        """The agent loop's ``on_round``: a round of ``stats.calls`` calls ended, ``stats.finished`` episodes."""
        self.advance(stats.calls, stats.finished)

    def on_calls(self, total: int, done: int) -> None:
        """Score's ``on_start``: ``total`` calls to score, ``done`` of them scored before."""
        with self.lock:
            self.counts.calls_total, self.counts.calls, self.counts.done_at_start = total, done, done
            self._started()

    def on_batch(self, p) -> None:
        """Score's ``on_batch``: ``p.invocations`` more calls scored."""
        self.advance(p.invocations, 0)

    def advance(self, calls: int, episodes: int) -> None:
        with self.lock:
            self.counts.calls += calls
            self.counts.episodes += episodes
            if self.counts.calls_total is not None and self.counts.calls > self.counts.calls_total:
                self.counts.calls_total = self.counts.calls  # more calls than planned (a policy's extra calls)
            self._draw()
            if self.pipe is not None:
                self.pipe.tick()

    def heartbeat(self) -> None:
        """The timer's call: a line on a pipe when the last is ``MAX_GAP`` old."""
        with self.lock:
            if self.pipe is not None:
                self.pipe.tick(MAX_GAP)

    def _started(self) -> None:
        self.counts.started = _now()
        if self.bar is not None and self.task is None:
            self.task = self.bar.add_task(self.counts.label, total=self.counts.calls_total,
                                          completed=self.counts.calls, episodes=self._episodes(), rate="")
        self._draw()

    def _episodes(self) -> str:
        c = self.counts
        return f"{c.episodes}/{c.episodes_total} episodes" if c.episodes_total is not None else ""

    def _draw(self) -> None:
        if self.bar is None or self.task is None:
            return
        c = self.counts
        elapsed = _now() - (c.started or _now())
        rate = (c.calls - c.done_at_start) / elapsed if elapsed > 0 else 0.0
        self.bar.update(self.task, total=c.calls_total, completed=c.calls, episodes=self._episodes(),
                        rate=f"{rate:.1f} calls/s" if rate else "")


@contextlib.contextmanager
def call_progress(label: str, calls_total: int | None = None, episodes_total: int | None = None,
                  terminal: bool | None = None) -> Iterator[CallProgress]:
    """A ``CallProgress`` for the job's duration: a bar when stderr is a terminal (``terminal``), else plain
    lines with a timer thread that keeps them coming while a round of calls runs."""
    counts = Counts(label, calls_total, episodes_total=episodes_total)
    on_terminal = sys.stderr.isatty() if terminal is None else terminal
    if on_terminal:
        bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("calls"),
                       TextColumn("{task.fields[episodes]}"), TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                       console=console(stderr=True))
        with bar:
            yield CallProgress(counts, bar, None)
        return

    def emit(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    progress = CallProgress(counts, None, PipeLines(counts, emit))
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(1.0):
            progress.heartbeat()

    timer = threading.Thread(target=beat, name="agentmem-progress", daemon=True)
    timer.start()
    try:
        yield progress
    finally:
        stop.set()
        timer.join()

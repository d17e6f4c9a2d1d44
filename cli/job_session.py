"""A job as the user sees it run: its run id first, and one line when it is interrupted.

``job_session(command, db=...)`` wraps a job's call in a CLI command:

- each top-level run the job opens prints ``run_id=RUN`` the moment its row is written, before any model
  loads (``agentmem.jobs.runs.announcing``), so a job killed while loading can still be resumed; what the
  command decided before the row was written (``--dtype auto``'s choice: ``after_run_id``) follows it;
- SIGTERM raises the same ``KeyboardInterrupt`` as Ctrl-C inside the job, so the job marks its run
  ``interrupted`` (``agentmem.jobs.runs.tracked_run``) in both cases;
- the interrupt then prints one line, ``interrupted: N calls stored; resume with: agentmem rollout --resume
  RUN``, and exits 130 (SIGINT) or 143 (SIGTERM), as shells do (128 + the signal's number).

Typer turns a ``KeyboardInterrupt`` that leaves a command into a silent exit 130, so the line is printed
here, inside the command.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from contextvars import ContextVar

import typer

from agentmem.records import Run, RunKind

# What the count of stored work names, per run kind (the resumable unit of each job).
_UNITS = {RunKind.score: "calls scored", RunKind.distill: "steps stored", RunKind.sft: "steps stored",
          RunKind.train: "steps stored"}


# Lines printed right after the next ``run_id=`` line (``after_run_id``).
_AFTER_RUN_ID: ContextVar[tuple[str, ...]] = ContextVar("agentmem_after_run_id", default=())


def after_run_id(line: str) -> None:
    """Print ``line`` right after the next run id (``print_run_id``), so ``run_id=RUN`` stays the first line."""
    _AFTER_RUN_ID.set(_AFTER_RUN_ID.get() + (line,))


def print_run_id(run_id: str) -> None:
    """``run_id=RUN``, then the lines waiting for it (``after_run_id``)."""
    typer.echo(f"run_id={run_id}")
    for line in _AFTER_RUN_ID.get():
        typer.echo(line)
    _AFTER_RUN_ID.set(())


_RESUMABLE = (RunKind.rollout, RunKind.replay, RunKind.distill, RunKind.sft, RunKind.train, RunKind.score)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the job is, like Ctrl-C's KeyboardInterrupt."""


def _on_sigterm(signum, frame) -> None:
    raise _Terminated()


def resume_command(run: Run, db: str | None) -> str:
    """The command that continues ``run``: ``--resume`` for the jobs that take it, else the same command
    (score skips the calls already scored)."""
    from cli.paste import db_flag

    flag = db_flag(db)
    if run.kind in (RunKind.rollout, RunKind.replay):
        return f"agentmem rollout --resume {run.id}{flag}"
    if run.kind in (RunKind.distill, RunKind.sft, RunKind.train):
        return f"agentmem {run.kind.value} --resume {run.id}{flag}"
    return "agentmem " + shlex.join(sys.argv[1:])


def interrupted_line(run: Run | None, stored: int | None, db: str | None) -> str:
    """The one line an interrupted job prints (pure: ``stored`` is counted by the caller)."""
    if run is None:
        return "interrupted: before any run was stored; nothing to resume"
    unit = _UNITS.get(run.kind, "calls stored")
    count = f"{stored} {unit}" if stored is not None else f"run {run.id}"
    # eval and memories runs do not resume: the same command starts a new run
    again = "resume with" if run.kind in _RESUMABLE else "start again with"
    return f"interrupted: {count}; {again}: {resume_command(run, db)}"


def _stored(run: Run, db: str | None) -> int | None:
    """How much of ``run`` is stored (None when the store cannot tell now)."""
    from store import repository as repo
    from store.engine import open_store

    try:
        store = open_store(db, check=False)
        with store.session() as s:
            if run.kind is RunKind.score:
                return repo.count_teacher_scores(s, run.id)
            if run.kind in (RunKind.distill, RunKind.sft):
                return repo.count_train_steps(s, run.id)
            if run.kind is RunKind.train:
                return None
            return repo.count_invocations(s, [run.id])
    except Exception:  # the store may be what failed: the line still names the run
        return None


@contextlib.contextmanager
def job_session(db: str | None) -> Iterator[None]:
    """Print each top-level run's id as it is written; turn SIGINT and SIGTERM into one line and exit 130
    or 143 (see the module docstring)."""
    from agentmem.jobs.runs import announcing

    runs: list[Run] = []

    def announce(run: Run) -> None:
        runs.append(run)
        print_run_id(run.id)

    main_thread = threading.current_thread() is threading.main_thread()  # only it may set handlers
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    try:
        with announcing(announce):
            yield
    except KeyboardInterrupt as exc:
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second TERM does not cut the line short
        run = runs[-1] if runs else None
        typer.echo(interrupted_line(run, _stored(run, db) if run else None, db))
        raise typer.Exit(143 if isinstance(exc, _Terminated) else 130) from None
    finally:
        _AFTER_RUN_ID.set(())  # a job that ended before its run was written leaves nothing for the next
        if main_thread:
            signal.signal(signal.SIGTERM, previous)

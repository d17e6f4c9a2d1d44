"""The life of a run row, shared by every job.

``tracked_run`` opens a run (new, or an existing one taken over for ``--resume``), keeps its heartbeat,
and ends it whatever happens: ``finished`` on success, ``failed`` with a one-line error on an exception,
``interrupted`` on Ctrl-C. No error leaves a run ``running``; only a killed process does, and then the
run's process id tells it apart (``agentmem runs``). A rollout run's episodes may be shared by several
worker processes (``agentmem.jobs.worker``, ``store.repository.leases``): its run (``tracked_run(shared=True)``) is
marked finished only once none of its episodes is running, by whichever process finishes last; until then
it stays running.

Several processes (torchrun): ``job_run`` opens the run on rank 0 only and hands its id to the others,
whose handle never writes (their store may be read-only).

``announcing(callback)``: the caller (the CLI) learns each top-level run's id the moment its row is written,
before the job loads any model, so a user can ``--resume`` even a job killed while it loads. Runs a job
opens inside another run (the train loop's rounds) are not announced.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from pydantic import BaseModel

from agentmem.errors import ConfigError, RunError
from agentmem.records import Run, RunKind
from agentmem.runtime import Runtime
from store import repository as repo
from store.engine import Store
from store.repository import leases

HEARTBEAT_EVERY_S = 30.0

# Who hears of the next top-level run (``announcing``); None inside a run, so nested runs stay quiet.
_ANNOUNCE: ContextVar[Callable[[Run], None] | None] = ContextVar("agentmem_run_announce", default=None)


@contextlib.contextmanager
def announcing(callback: Callable[[Run], None]) -> Iterator[None]:
    """Call ``callback(run)`` as each top-level run this block opens is written (``tracked_run``)."""
    token = _ANNOUNCE.set(callback)
    try:
        yield
    finally:
        _ANNOUNCE.reset(token)


@dataclass
class RunHandle:
    """The run a job writes to; ``beat()`` refreshes its heartbeat (at most every 30 s)."""

    store: Store
    id: str
    writes: bool = True  # False on the ranks other than 0 of a job over several processes
    discarded: bool = False  # the row was deleted (``provisional``): nothing is left to end
    _last: float = field(default_factory=time.monotonic)

    @contextlib.contextmanager
    def provisional(self) -> Iterator[None]:
        """A new run's set-up, after its row is written (so its id is printed first) and before it holds
        anything: an error here (a bad input found while the tasks are built) deletes the row, so a refused
        job leaves no run behind. Ctrl-C keeps the row, interrupted, for ``--resume``."""
        try:
            yield
        except Exception:
            with contextlib.suppress(Exception):  # the store itself may be what failed: keep the first error
                with self.store.session() as s:
                    repo.delete_run(s, self.id)
                    s.commit()
                self.discarded = True
            raise

    def beat(self, force: bool = False) -> None:
        if not self.writes:
            return
        now = time.monotonic()
        if force or now - self._last >= HEARTBEAT_EVERY_S:
            with self.store.session() as s:
                repo.heartbeat(s, self.id)
                s.commit()
            self._last = now


def error_line(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def load_run(store: Store, run_id: str, kind: RunKind) -> Run:
    """The run named by ``run_id`` (abbreviations allowed), which must be of ``kind``."""
    with store.session() as s:
        run = repo.get_run(s, run_id)
    if run.kind is not kind:
        raise RunError(f"run {run.id} is a {run.kind.value} run, not a {kind.value} run")
    return run


def check_runs(store: Store, run_ids: list[str]) -> list[str]:
    """Full ids of the runs to train on; each must exist and hold stored calls."""
    if not run_ids:
        raise ConfigError("give at least one run to train on (--run RUN_ID; see `agentmem runs`)")
    full = []
    with store.session() as s:
        for rid in run_ids:
            run = repo.get_run(s, rid)
            if repo.count_invocations(s, [run.id]) == 0:
                raise RunError(f"run {run.id} ({run.kind.value}) has no stored invocations to train on")
            full.append(run.id)
    return full


@contextlib.contextmanager
def tracked_run(store: Store, kind: RunKind, config: BaseModel, *, resume: str | None = None,
                extra: dict | None = None, shared: bool = False) -> Iterator[RunHandle]:
    """Open (or, with ``resume``, take over the run of that full id) a run and end it on exit as finished,
    failed or interrupted. ``shared``: a run whose episodes other workers may hold; a success marks it
    finished only when none of its episodes is running (``store.repository.leases.finish_run_if_done``)."""
    with store.session() as s:
        if resume is None:
            run = Run(kind=kind, config=config.model_dump(mode="json") | (extra or {}))
            repo.start_run(s, run)
            rid = run.id
        else:
            run = repo.claim_run(s, resume)
            rid = run.id
        s.commit()
    handle = RunHandle(store, rid)
    announce = _ANNOUNCE.get()
    token = _ANNOUNCE.set(None)  # runs opened inside this one are not announced
    try:
        if announce is not None:
            announce(run)
        yield handle
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):  # the store itself may be what failed: keep the first error
            _end(store, rid, "interrupted", None)
        raise
    except BaseException as exc:
        if not handle.discarded:
            with contextlib.suppress(Exception):
                _end(store, rid, "failed", error_line(exc))
        raise
    finally:
        _ANNOUNCE.reset(token)
    if shared:
        with store.session() as s:
            leases.finish_run_if_done(s, rid)
            s.commit()
    else:
        _end(store, rid, "finished", None)


@contextlib.contextmanager
def job_run(store: Store, kind: RunKind, config: BaseModel, runtime: Runtime, *,
            resume: str | None = None) -> Iterator[RunHandle]:
    """``tracked_run`` on rank 0; on the other ranks, a handle on the same run id that writes nothing."""
    if runtime.is_main:
        with tracked_run(store, kind, config, resume=resume) as handle:
            runtime.broadcast(handle.id)
            yield handle
    else:
        yield RunHandle(store, runtime.broadcast(None), writes=False)


def _end(store: Store, run_id: str, status: str, error: str | None) -> None:
    with store.session() as s:
        repo.finish_run(s, run_id, status=status, error=error)
        s.commit()

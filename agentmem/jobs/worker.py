"""A rollout worker: claims episodes of a rollout run and does their calls, alongside any number of others.

``run_worker`` works one run (given) or every running rollout run with claimable episodes (oldest first),
on any machine that reaches the store. Per run it rebuilds what the run's stored config describes (the
environment and tasks, the sampling model on this machine's device: ``rollout.rollout_setup``), then
claims episodes in batches (``store.repository.leases``) and steps them through the agent loop with a sink that
renews and checks its leases at every round (``rollout.StoreSink(lease=...)``): an episode whose lease was
taken over is dropped with its in-memory state, never continued. A worker with a given run waits (polling)
while other workers hold its last episodes, so that it takes over the leases of a worker that dies. The
run is marked finished by whichever worker sees none of its episodes running.

Determinism: a worker's outputs depend on the prompts it sends and on its rounds' sampling seeds
(``AgentLoop``: one seed per round of one process). Greedy decoding (temperature 0, with batches that do
not change the logits) and the scripted backend give the same calls however the episodes are spread over
workers; sampling at temperature > 0 gives equally valid but different samples (the seed is per round of a
process, not per episode).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from agentmem import model_refs
from agentmem.agent.loop import RoundStats
from agentmem.backends.types import Backend
from agentmem.errors import RunError
from agentmem.jobs.rollout import (
    LeaseTerms,
    StoreSink,
    WorkStats,
    load_rollout_config,
    rollout_loop,
    rollout_setup,
    work_run,
)
from agentmem.jobs.runs import RunHandle
from agentmem.records import Checkpoint, RunKind
from agentmem.runtime import CPU, Runtime
from store import repository as repo
from store.engine import Store
from store.repository import leases
from store.retry import retrying


@dataclass
class WorkerResult:
    """What one worker did: the runs it worked (in order), the runs it marked finished, and its totals."""

    owner: str
    runs: list[str] = field(default_factory=list)
    finished_runs: list[str] = field(default_factory=list)
    stats: WorkStats = field(default_factory=WorkStats)


def run_worker(
    store: Store,
    run_id: str | None,
    runtime: Runtime = CPU,
    lease: LeaseTerms | None = None,
    *,
    batch: int | None = None,
    wait: bool | None = None,
    backend: Backend | Mapping[str, Backend] | None = None,
    policy: Checkpoint | None = None,
    on_round: Callable[[RoundStats], None] | None = None,
) -> WorkerResult:
    """Work run ``run_id`` (an abbreviation is fine), or with None every running rollout run that has
    claimable episodes, until there is nothing left to claim.

    ``batch``: episodes held at once (default: the run's ``agent.max_batch``, one backend batch per round).
    ``wait`` (default: when a run is given): while other workers hold the run's last episodes, poll until
    they finish or their leases expire (then take them over). ``backend`` and ``policy`` inject a ready
    backend and its checkpoint row (tests, benchmarks), as ``run_rollout`` takes them."""
    lease = lease or LeaseTerms()
    wait = run_id is not None if wait is None else wait
    result = WorkerResult(owner=lease.owner)
    samplers: dict[tuple, tuple[Checkpoint | None, Backend | Mapping[str, Backend] | None]] = {}
    done: set[str] = set()
    while True:
        rid = _next_run(store, run_id, done)
        if rid is None:
            return result
        done.add(rid)
        result.runs.append(rid)
        _work_one(store, rid, runtime, lease, result, samplers, batch=batch, wait=wait, backend=backend,
                  policy=policy, on_round=on_round)
        if run_id is not None:
            return result


def _next_run(store: Store, run_id: str | None, done: set[str]) -> str | None:
    if run_id is not None:
        def claim() -> str:
            rid, _ = load_rollout_config(store, run_id)
            with store.session() as s:
                run = repo.get_run(s, rid)
                if run.status not in ("running", "finished") and leases.running_episodes(s, rid):
                    repo.claim_run(s, rid)  # an interrupted or failed run: running again, worked by this process
                    s.commit()
            return rid

        return retrying(claim, "reading the run")
    def find() -> list[str]:
        with store.session() as s:
            return [r for r in leases.runs_with_work(s, RunKind.rollout.value) if r not in done]

    waiting = retrying(find, "looking for runs with work")
    return waiting[0] if waiting else None


def _work_one(store: Store, rid: str, runtime: Runtime, lease: LeaseTerms, result: WorkerResult,
              samplers: dict, *, batch: int | None, wait: bool, backend, policy,
              on_round: Callable[[RoundStats], None] | None) -> None:
    if (backend is None) != (policy is None):
        raise RunError("give both backend and policy, or neither")
    # every store read of the set-up is retried while the store is unreachable (a worker may start, or pick
    # up its next run, during a Postgres restart); the set-up writes nothing but the model's checkpoint row
    _, config = retrying(lambda: load_rollout_config(store, rid), "reading the run's config")
    setup = retrying(lambda: rollout_setup(store, config, RunKind.rollout, backend), "setting up the run")
    if backend is None and not setup.oracle:
        key = (setup.model.path, config.backend, config.dtype)
        if key not in samplers:
            samplers.clear()  # one model in memory at a time
            samplers[key] = retrying(lambda: model_refs.sampler(store, setup.model, config.backend, config.dtype,
                                                            runtime, base_url=config.base_url),
                                     "registering the model")  # the store is touched before any weights load
        policy, backend = samplers[key]
    handle = RunHandle(store, rid)
    loop = rollout_loop(store, setup, backend, policy)
    sink = StoreSink(store, handle, memory=loop.memory, lease=lease)
    poll = min(5.0, max(0.05, lease.seconds / 4))
    while True:
        stats = work_run(store, rid, loop, setup, lease, sink, batch=batch or config.agent.max_batch,
                         on_round=on_round)
        for name in ("claimed", "resumed", "calls", "lost"):
            setattr(result.stats, name, getattr(result.stats, name) + getattr(stats, name))
        def settle() -> tuple[bool, int]:
            with store.session() as s:
                done_now = leases.finish_run_if_done(s, rid)
                left = leases.running_episodes(s, rid)
                s.commit()
            return done_now, left

        finished, running = retrying(settle, "checking whether the run is finished")
        if finished:
            result.finished_runs.append(rid)
        if not running or not wait:
            return
        time.sleep(poll)

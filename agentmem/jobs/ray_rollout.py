"""Rollout workers as Ray actors: Ray places them on its cluster and restarts the ones that die; the store stays
the queue and the system of record.

``work_with_ray`` connects to a Ray cluster (``ray.init``: the given address, else Ray's own rules:
``RAY_ADDRESS``, a cluster started on this machine by ``ray start``, else a new local one), checks that the
cluster has the resources asked for, and starts ``workers`` actors, spread over the nodes (``SPREAD``), each with
``cpus`` CPUs and ``gpus`` GPUs. Each actor runs ``jobs.worker.run_worker`` on the run (the lease loop of
``agentmem worker``) against the same database, with its own lease owner (``host:pid:random``), and returns its
totals. Ray holds no data: an actor that dies is restarted by Ray (``max_restarts``) and its unfinished ``work``
call run again (``max_task_retries``); the restarted process is a new lease owner, and every write is fenced by the
current lease holder (``store.leases``: the round's lease check and renewal share the transaction of its calls), so
a restarted actor, a retried call or a dead actor's late write never stores a call twice. The dead actor's leases
are released at once by a worker on its host (its process is gone), else they expire after ``lease.seconds``.

Every check (Ray importable, the database a server that every node can reach, the cluster reachable, its
resources enough) happens before anything is written: ``connect`` first, then the caller writes the run.

The database must be Postgres: the actors run on any node of the cluster, and a SQLite file is one machine's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from agentmem.backends.types import Backend
from agentmem.config import RolloutConfig
from agentmem.errors import ConfigError, RunError
from agentmem.jobs.rollout import LeaseTerms, RolloutResult, WorkStats
from agentmem.records import Checkpoint
from store.engine import Store, open_store

RAY_MISSING = "Ray is not installed: pip install 'agentmem[ray]'"
# (store) -> (checkpoint row, backend): built inside each actor instead of the run's model (tests, benchmarks)
SamplerFactory = Callable[[Store], tuple[Checkpoint, Backend]]


@dataclass(frozen=True)
class Placement:
    """Where the workers run: ``address`` of the Ray cluster (None: ``ray.init()``'s own choice, which starts a
    local cluster when it finds none), how many actors, each one's CPUs and GPUs, and how often Ray restarts each
    one (-1: without limit). ``flag`` names the count in messages (``--train-workers`` for a Ray Train group)."""

    address: str | None = None
    workers: int = 1
    cpus: float = 1.0
    gpus: float = 0.0
    max_restarts: int = -1
    flag: str = "--workers"

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError(f"{self.flag} must be >= 1, got {self.workers}")
        if self.cpus < 0 or self.gpus < 0:
            raise ConfigError(f"--worker-cpus and --worker-gpus must be >= 0, got {self.cpus} and {self.gpus}")


@dataclass
class RayResult:
    """What the actors did: each one's owner name (the last process of a restarted actor) and totals."""

    owners: list[str] = field(default_factory=list)
    stats: WorkStats = field(default_factory=WorkStats)
    finished: bool = False


def check_store(url: str) -> None:
    """A ``ConfigError`` unless ``url`` names a Postgres server (every node of the cluster must reach it)."""
    if url.split(":", 1)[0].split("+", 1)[0] not in ("postgresql", "postgres"):
        raise ConfigError("--ray places workers on any node of a cluster, and a SQLite file is one machine's: give a "
                          "Postgres --db (postgresql://USER@HOST/DB)")


def connect(placement: Placement) -> bool:
    """Connect this process to Ray (unless it already is) and check the cluster's resources; True when this call
    connected (the caller then disconnects: ``disconnect``). Raises ``ConfigError``/``RunError`` in one line."""
    try:
        import ray
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    started = False
    if not ray.is_initialized():
        if placement.address:
            _probe(placement.address)
        try:
            ray.init(address=placement.address, include_dashboard=False, log_to_driver=False,
                     logging_level="WARNING")
        except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError ...
            where = placement.address or os.environ.get("RAY_ADDRESS") or "a local cluster"
            raise RunError(f"cannot reach the Ray cluster at {where}: {_first_line(exc)}") from None
        started = True
    try:
        check_resources(placement)
    except BaseException:
        if started:
            ray.shutdown()
        raise
    return started


def _probe(address: str, timeout_s: float = 5.0) -> None:
    """A ``RunError`` when nothing listens at ``address`` (``HOST:PORT`` or ``ray://HOST:PORT``): ``ray.init``
    itself would retry for minutes."""
    import socket

    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", or a form Ray parses itself
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise RunError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}") from None


def disconnect() -> None:
    import ray

    ray.shutdown()


def check_resources(placement: Placement) -> None:
    """A ``RunError`` unless the connected cluster's live nodes have ``placement``'s CPUs and GPUs."""
    import ray

    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    total = {k: sum(n.get(k, 0.0) for n in nodes) for k in ("CPU", "GPU")}
    most = {k: max((n.get(k, 0.0) for n in nodes), default=0.0) for k in ("CPU", "GPU")}
    for kind, each, flag in (("CPU", placement.cpus, "--worker-cpus"), ("GPU", placement.gpus, "--worker-gpus")):
        need = each * placement.workers
        if each and (most[kind] < each or total[kind] < need):
            raise RunError(f"the Ray cluster has {total[kind]:g} {kind}s (at most {most[kind]:g} on one node): "
                           f"{placement.flag} {placement.workers} x {flag} {each:g} needs {need:g}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class RolloutActor:
    """One worker process of the cluster: ``work`` runs the lease loop of ``agentmem worker`` on a run, with a
    fresh lease owner per call (a call Ray retries after a restart is a new owner)."""

    def __init__(self, db_url: str, lease_seconds: float, max_attempts: int, device: str, threads: int | None,
                 batch: int | None, sampler: SamplerFactory | None):
        self.db_url, self.lease_seconds, self.max_attempts = db_url, lease_seconds, max_attempts
        self.device, self.threads, self.batch, self.sampler = device, threads, batch, sampler

    def pid(self) -> int:
        return os.getpid()

    def work(self, run_id: str) -> dict:
        from agentmem.jobs.worker import run_worker
        from agentmem.runtime import Runtime

        store = open_store(self.db_url)
        try:
            runtime = Runtime.create(device=self.device, threads=self.threads)
            policy, backend = self.sampler(store) if self.sampler else (None, None)
            lease = LeaseTerms(seconds=self.lease_seconds, max_attempts=self.max_attempts)
            result = run_worker(store, run_id, runtime, lease, batch=self.batch, wait=True, backend=backend,
                                policy=policy)
        finally:
            store.dispose()
        st = result.stats
        return {"owner": result.owner, "claimed": st.claimed, "resumed": st.resumed, "calls": st.calls,
                "lost": st.lost, "finished": bool(result.finished_runs)}


def start_actors(db_url: str, placement: Placement, lease: LeaseTerms, *, device: str = "auto",
                 threads: int | None = None, batch: int | None = None, sampler: SamplerFactory | None = None) -> list:
    """``placement.workers`` actors, spread over the cluster (``connect`` first)."""
    import ray

    actor = ray.remote(RolloutActor).options(
        num_cpus=placement.cpus, num_gpus=placement.gpus, max_restarts=placement.max_restarts,
        max_task_retries=-1, scheduling_strategy="SPREAD")
    return [actor.remote(db_url, lease.seconds, lease.max_attempts, device, threads, batch, sampler)
            for _ in range(placement.workers)]


def work_with_ray(db_url: str, run_id: str, placement: Placement, lease: LeaseTerms | None = None, *,
                  device: str = "auto", threads: int | None = None, batch: int | None = None,
                  sampler: SamplerFactory | None = None) -> RayResult:
    """Work run ``run_id`` (already written) with ``placement.workers`` Ray actors until none of its episodes is
    claimable; the caller has ``connect``ed. ``sampler`` builds each actor's backend and checkpoint row instead of
    the run's model (tests, benchmarks; it must pickle)."""
    import ray

    check_store(db_url)
    lease = lease or LeaseTerms()
    actors = start_actors(db_url, placement, lease, device=device, threads=threads, batch=batch, sampler=sampler)
    out = RayResult()
    try:
        for answer in ray.get([a.work.remote(run_id) for a in actors]):
            out.owners.append(answer["owner"])
            for name in ("claimed", "resumed", "calls", "lost"):
                setattr(out.stats, name, getattr(out.stats, name) + answer[name])
            out.finished = out.finished or answer["finished"]
    except ray.exceptions.RayError as exc:
        raise RunError(f"run {run_id}: a Ray worker failed: {_first_line(exc)}; finish the run with "
                       f"`agentmem worker --run {run_id}`") from None
    finally:
        for a in actors:
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
    return out


def round_rollout(db_url: str, placement: Placement, lease: LeaseTerms | None = None, *, device: str = "auto",
                  threads: int | None = None) -> Callable[[Store, RolloutConfig, Checkpoint | None], RolloutResult]:
    """A train round's rollout by Ray actors (``jobs.train.RolloutWith``): write the round's run and episodes, work
    them with ``placement.workers`` actors (the caller has ``connect``ed), and return the finished run as
    ``run_rollout`` would; a ``RunError`` when an episode is left running."""

    def rollout(store: Store, config: RolloutConfig, policy: Checkpoint | None) -> RolloutResult:
        from agentmem.jobs.rollout import create_rollout
        from store import repository as repo

        run_id = create_rollout(store, config)
        work_with_ray(db_url, run_id, placement, lease, device=device, threads=threads)
        with store.session() as s:
            episodes = repo.list_episodes(s, run_id)
        left = sum(1 for e in episodes if e.status.value == "running")
        if left:
            raise RunError(f"rollout run {run_id}: {left} episodes are still running: finish it with "
                           f"`agentmem worker --run {run_id}`, then resume the train run")
        return RolloutResult(run_id, episodes, 0, policy, config)

    return rollout

"""``agentmem worker``: one rollout worker on a shared store; ``start_workers`` runs N of them locally
(``agentmem rollout --workers N``)."""

from __future__ import annotations

import subprocess
import sys
from typing import Annotated

import typer

from cli.options import DbOption, ThreadsOption

LeaseSecondsOption = Annotated[float, typer.Option(
    help="How long an episode stays leased to a worker without renewal (it renews at every round of calls). A "
         "killed worker's episodes are taken over by others after this long (at once by a worker on the same "
         "host). Keep it well above the time of one round.", min=0.001)]
MaxAttemptsOption = Annotated[int, typer.Option(
    help="Claims an episode gets before it is marked failed (with its last error, or 'lease expired N times').",
    min=1)]


def worker(
    db: DbOption = None,
    run: Annotated[str | None, typer.Option(
        help="The rollout run to work (id or abbreviation). Default: every running rollout run with episodes "
             "left to claim, oldest first.", show_default=False)] = None,
    device: Annotated[str, typer.Option(
        help="Where the model runs: auto (CUDA when available, else CPU) | cpu | cuda | cuda:N.")] = "auto",
    threads: ThreadsOption = None,
    lease_seconds: LeaseSecondsOption = 120.0,
    max_attempts: MaxAttemptsOption = 3,
    batch: Annotated[int | None, typer.Option(
        help="Episodes held at once (default: the run's --batch, one backend batch per round).", min=1,
        show_default=False)] = None,
    wait: Annotated[bool | None, typer.Option(
        "--wait/--no-wait", help="While other workers hold a run's last episodes, poll until they finish or their "
        "leases expire (default: with --run).", show_default=False)] = None,
) -> None:
    """Work a rollout run's episodes alongside any number of other workers, on any machine that reaches the
    database (Postgres for several machines; a SQLite file for processes of one machine).

    Each worker claims a batch of episodes (a lease with an expiry), loads the run's model on --device,
    stores every call as it completes while renewing its leases, and claims more until none is left. A
    killed worker's episodes are taken over once their leases expire and resume from their last stored
    call; its late writes are refused. The run is marked finished when its last episode is. Prints one
    line: worker=OWNER runs=... claimed=N calls=N lost=N finished=RUN_IDS.
    """
    from agentmem.jobs.rollout import LeaseTerms
    from agentmem.jobs.worker import run_worker
    from agentmem.records import RunKind
    from cli.common import preflight, runtime, setup_logging
    from store.engine import open_store

    lease = LeaseTerms(seconds=lease_seconds, max_attempts=max_attempts)
    preflight(db, resume=run, kind=RunKind.rollout)
    rt = runtime(device, threads)
    setup_logging()
    store = open_store(db)
    result = run_worker(store, run, rt, lease, batch=batch, wait=wait)
    st = result.stats
    typer.echo(f"worker={result.owner} runs={','.join(result.runs) or '-'} claimed={st.claimed} resumed={st.resumed} "
               f"calls={st.calls} lost={st.lost} finished={','.join(result.finished_runs) or '-'}")


def start_workers(n: int, run_id: str, *, db: str | None, device: str, threads: int | None,
                  lease_seconds: float, max_attempts: int) -> list[int]:
    """Start ``n`` local ``agentmem worker --run RUN_ID`` processes and wait for them; their exit codes.
    Ctrl-C reaches them too (one process group); each releases its leases and stops."""
    args = [sys.executable, "-m", "agentmem", "worker", "--run", run_id, "--device", device,
            "--lease-seconds", str(lease_seconds), "--max-attempts", str(max_attempts)]
    if db:
        args += ["--db", db]
    if threads:
        args += ["--threads", str(threads)]
    procs = [subprocess.Popen(args) for _ in range(n)]
    try:
        return [p.wait() for p in procs]
    except KeyboardInterrupt:
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        raise


def register(app: typer.Typer) -> None:
    app.command()(worker)

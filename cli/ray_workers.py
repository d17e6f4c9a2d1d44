"""``agentmem rollout --ray``: the rollout's workers as Ray actors (``agentmem.jobs.ray_rollout``)."""

from __future__ import annotations

from typing import Annotated

import typer

RayOption = Annotated[bool, typer.Option(
    "--ray", help="Start the --workers workers as Ray actors, placed over the Ray cluster and restarted by Ray when "
    "they die; each runs `agentmem worker`'s lease loop against the same Postgres --db (pip install "
    "'agentmem[ray]').", rich_help_panel="Workers")]
RayAddressOption = Annotated[str | None, typer.Option(
    help="With --ray: the cluster's address (HOST:6379, or ray://HOST:10001). Default: ray.init()'s own choice: "
    "$RAY_ADDRESS, a cluster `ray start` began on this machine, else a new local one.", show_default=False,
    rich_help_panel="Workers")]
WorkerGpusOption = Annotated[float, typer.Option(
    help="With --ray: GPUs per worker (each loads the model on its own; 0 with --backend openai, whose servers "
         "generate).", min=0, rich_help_panel="Workers")]
WorkerCpusOption = Annotated[float, typer.Option(help="With --ray: CPUs per worker.", min=0,
                                                 rich_help_panel="Workers")]


def check_flags(ray: bool, address: str | None, gpus: float, cpus: float, db: str | None) -> None:
    """The Ray flags go with --ray, and --ray with a Postgres --db: checked before anything is opened."""
    from agentmem.jobs.ray_rollout import check_store
    from cli.config_options import CommandLineError
    from store.engine import resolve_url

    given = [f for f, v in (("--ray-address", address is not None), ("--worker-gpus", gpus != 0),
                            ("--worker-cpus", cpus != 1)) if v]
    if given and not ray:
        raise CommandLineError(f"{', '.join(given)} place(s) Ray workers: add --ray")
    if ray:
        check_store(resolve_url(db))


def with_ray(workers: int, address: str | None, gpus: float, cpus: float, config, resume: str | None, *,
             db: str | None, device, threads: int | None) -> None:
    """Check the store (Postgres) and the Ray cluster (reachable, enough resources), then write the run and its
    episodes and work them with ``workers`` Ray actors; nothing is written when a check fails."""
    from agentmem.errors import RunError
    from agentmem.jobs import ray_rollout
    from agentmem.jobs.rollout import LeaseTerms, create_rollout
    from cli.common import runtime, setup_logging
    from cli.job_session import print_run_id
    from cli.rollout import _summary
    from store import repository as repo
    from store.engine import open_store, resolve_url

    url = resolve_url(db)
    placement = ray_rollout.Placement(address=address, workers=workers, cpus=cpus, gpus=gpus)
    runtime(device, threads)  # a bad --device or --threads fails here, before Ray starts
    setup_logging()
    started = ray_rollout.connect(placement)
    try:
        store = open_store(db)
        run_id = create_rollout(store, config, resume=resume)
        print_run_id(run_id)
        result = ray_rollout.work_with_ray(url, run_id, placement, LeaseTerms(), device=device.value, threads=threads)
    finally:
        if started:
            ray_rollout.disconnect()
    with store.session() as s:
        episodes = repo.list_episodes(s, run_id)
    left = sum(1 for e in episodes if e.status.value == "running")
    st = result.stats
    typer.echo(f"ray_workers={workers} claimed={st.claimed} resumed={st.resumed} calls={st.calls} lost={st.lost}")
    if left:
        raise RunError(f"run {run_id}: {left} episodes are still running: finish it with "
                       f"`agentmem worker --run {run_id}`")
    _summary(run_id, episodes, db)

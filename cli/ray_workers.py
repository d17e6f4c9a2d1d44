"""``--ray``: a rollout's workers as Ray actors (``agentmem.jobs.ray_rollout``), a training job's data-parallel
processes as a Ray Train group (``agentmem.jobs.ray_train``), and in ``train`` both, round after round."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
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
    help="With --ray: GPUs per worker, rollout actor or training process (each loads the model on its own; 0 for "
         "rollout workers with --backend openai, whose servers generate).", min=0, rich_help_panel="Workers")]
WorkerCpusOption = Annotated[float, typer.Option(
    help="With --ray: CPUs per worker, rollout actor or training process (its torch threads).", min=0,
    rich_help_panel="Workers")]
RayTrainOption = Annotated[bool, typer.Option(
    "--ray", help="Run the job's --train-workers data-parallel processes as one Ray Train group (TorchTrainer; gloo "
    "on CPU, NCCL with --worker-gpus) placed over the Ray cluster, the same steps as under torchrun; rank 0 writes "
    "the store and --out, which every node must share (pip install 'agentmem[ray]').", rich_help_panel="Workers")]
RayLoopOption = Annotated[bool, typer.Option(
    "--ray", help="Work each round's rollout with --workers Ray actors against the same Postgres --db (as rollout "
    "--ray does), and run each round's distill (and the warm start) as a Ray Train group of --train-workers "
    "processes (as distill --ray does); the loop stays in this process (pip install 'agentmem[ray]').",
    rich_help_panel="Workers")]
RolloutWorkersOption = Annotated[int, typer.Option(
    "--workers", help="With --ray: the Ray actors that work each round's rollout (each loads the round's model).",
    min=1, rich_help_panel="Workers")]
TrainWorkersOption = Annotated[int, typer.Option(
    help="With --ray: the data-parallel training processes (Ray Train workers), as torchrun --nproc-per-node N "
         "starts them; each trains on its share of every step.", min=1, rich_help_panel="Workers")]


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


def check_train_flags(ray: bool, address: str | None, train_workers: int, gpus: float, cpus: float,
                      fsdp: bool) -> None:
    """The Ray Train flags go with --ray, and --ray neither under torchrun nor with --fsdp in one process."""
    import os

    from cli.config_options import CommandLineError

    given = [f for f, v in (("--ray-address", address is not None), ("--train-workers", train_workers != 1),
                            ("--worker-gpus", gpus != 0), ("--worker-cpus", cpus != 1)) if v]
    if given and not ray:
        raise CommandLineError(f"{', '.join(given)} place(s) Ray workers: add --ray")
    if ray and int(os.environ.get("WORLD_SIZE") or 1) > 1:
        raise CommandLineError("--ray starts its own group of --train-workers processes: run it without torchrun")
    if ray and fsdp and train_workers < 2:
        raise CommandLineError("--fsdp shards the student over several processes: give --train-workers N (N >= 2)")


@contextlib.contextmanager
def ray_loop(address: str | None, workers: int, train_workers: int, gpus: float, cpus: float, *,
             db: str | None, device, threads: int | None) -> Iterator[dict]:
    """``train --ray``: connected to the cluster (checked for the rollout actors and the training group alike),
    ``run_train``'s ``rollout_with`` (``workers`` actors) and ``launch`` (a group of ``train_workers``)."""
    from agentmem.jobs import ray_rollout, ray_train
    from agentmem.jobs.rollout import LeaseTerms
    from cli.config_options import usage_error
    from store.engine import resolve_url

    url = resolve_url(db)
    with usage_error():
        actors = ray_rollout.Placement(address=address, workers=workers, cpus=cpus, gpus=gpus)
        group = ray_rollout.Placement(address=address, workers=train_workers, cpus=cpus, gpus=gpus,
                                      flag="--train-workers")
        ray_train.check_device(device.value, group)
    ray_train.check_installed()
    started = ray_rollout.connect(actors)
    try:
        ray_rollout.check_resources(group)
        yield {"rollout_with": ray_rollout.round_rollout(url, actors, LeaseTerms(), device=device.value,
                                                         threads=threads),
               "launch": ray_train.launcher(url, group, device=device.value, threads=threads)}
    finally:
        if started:
            ray_rollout.disconnect()


def train_with_ray(run_job, db: str | None, *, address: str | None, workers: int, gpus: float, cpus: float,
                   config, resume: str | None, steps: int | None, device, threads: int | None, fsdp: bool,
                   report_to) -> object:
    """``run_job`` on a Ray Train group of ``workers`` processes (``agentmem.jobs.ray_train.fit``); rank 0's
    result."""
    from agentmem.jobs import ray_rollout, ray_train
    from cli.common import setup_logging
    from cli.config_options import usage_error
    from store.engine import resolve_url

    with usage_error():
        placement = ray_rollout.Placement(address=address, workers=workers, cpus=cpus, gpus=gpus,
                                          flag="--train-workers")
        ray_train.check_device(device.value, placement)
    setup_logging()
    return ray_train.fit(run_job, resolve_url(db), placement, config=config, resume=resume, steps=steps,
                         device=device.value, threads=threads, fsdp=fsdp, report_to=report_to)


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

"""``agentmem train``: the on-policy loop (rollout -> distill -> new checkpoint, repeated)."""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer

from agentmem.config import Device
from agentmem.records import RunKind
from cli.config_options import CommandLineError, invocation, job_command, job_config, usage_error
from cli.job_specs import TRAIN
from cli.options import DbOption, DeviceOption, ReportToOption, ThreadsOption
from cli.ray_workers import (
    RayAddressOption,
    RayLoopOption,
    RolloutWorkersOption,
    TrainWorkersOption,
    WorkerCpusOption,
    WorkerGpusOption,
)


@job_command(TRAIN)
def train(
    ctx: typer.Context,
    resume: Annotated[str | None, typer.Option(
        help="Continue train run RUN_ID at its first unfinished round, from the last finished round's "
             "checkpoint, with its stored config (a config flag given too is refused).")] = None,
    report_to: ReportToOption = [],  # noqa: B006
    device: DeviceOption = Device.auto,
    threads: ThreadsOption = None,
    db: DbOption = None,
    ray: RayLoopOption = False,
    ray_address: RayAddressOption = None,
    workers: RolloutWorkersOption = 1,
    train_workers: TrainWorkersOption = 1,
    worker_gpus: WorkerGpusOption = 0.0,
    worker_cpus: WorkerCpusOption = 1.0,
) -> None:
    """Run the whole on-policy loop on the embedded default: a few minutes per round on a laptop CPU.
    A killed loop continues with --resume RUN_ID."""
    from agentmem.tracking import check_installed, parse_report_to
    from cli.common import preflight, runtime, setup_logging
    from cli.ray_workers import check_flags, check_train_flags, ray_loop
    from store.engine import open_store

    check_train_flags(ray, ray_address, train_workers, worker_gpus, worker_cpus, fsdp=False)
    if workers != 1 and not ray:
        raise CommandLineError("--workers places Ray rollout actors in train: add --ray")
    check_flags(ray, ray_address, worker_gpus, worker_cpus, db)  # --ray: a Postgres --db
    invocation(ctx).refuse_on_resume(resume)
    with usage_error():
        trackers = parse_report_to(report_to)
    check_installed(trackers)
    config = None if resume else job_config(ctx)
    preflight(db, resume=resume, kind=RunKind.train, rollout=config.rollout if config else None)
    rt = runtime(device if not ray else Device.cpu, threads)  # under --ray the models load on the cluster
    setup_logging()
    phases = ray_loop(ray_address, workers, train_workers, worker_gpus, worker_cpus, db=db, device=device,
                      threads=threads) if ray else contextlib.nullcontext({})
    with phases as where:  # where the rounds' rollouts and training jobs run (run_train's rollout_with, launch)
        store = open_store(db, create=not resume)
        run_id, results = _loop(store, config, rt, resume, db, trackers, where)
    _summary(run_id, results)


def _steps(store, config, resume: str | None) -> tuple[int, int]:
    """(steps in all, steps already done) of the loop, warm start included, for the progress bar."""
    from agentmem.jobs.train import load_train_state

    if not resume:
        warm = config.warm_start.optim.steps if config.warm_start else 0
        return warm + config.rounds * config.distill.optim.steps, 0
    state = load_train_state(store, resume)
    rounds, per_round = state.config.rounds, state.config.distill.optim.steps
    warm = state.config.warm_start.optim.steps if state.config.warm_start else 0
    return warm + rounds * per_round, len(state.finished) * per_round + (warm if state.finished else 0)


def _loop(store, config, rt, resume: str | None, db: str | None, trackers, phases: dict):
    from agentmem.jobs.train import run_train
    from cli.console import console
    from cli.job_session import job_session
    from cli.training_progress import train_progress

    err = console(stderr=True)
    total, start = _steps(store, config, resume)
    with job_session(db), train_progress(total, done=start, label="train") as bar:
        done = {"n": start}

        def step(record) -> None:
            done["n"] += 1
            bar.on_step(record.model_copy(update={"step": done["n"]}))

        def rollout_round(stats) -> None:
            err.log(f"  rollout: {stats.calls} calls, {stats.output_tokens} tokens generated in {stats.seconds:.1f}s, "
                    f"{stats.finished} episodes finished")

        return run_train(store, config, rt, resume=resume, on_phase=lambda msg: err.log(msg),
                         on_step=step, on_round=rollout_round, report_to=trackers, **phases)


def _summary(run_id: str, results) -> None:
    from rich.table import Table

    from cli.console import console

    table = Table("round", "policy", "rollout run", "rollout F1", "RL live groups", "distill run", "new checkpoint",
                  title=f"train {run_id}")
    for r in results:
        live = "off" if r.rl_live_fraction is None else f"{r.rl_live_fraction:.2f}"
        table.add_row(str(r.round + 1), r.policy.id[:12], r.rollout_run_id[:12], f"{r.mean_f1:.3f}", live,
                      r.distill_run_id[:12], r.checkpoint.id)
    console().print(table)
    for r in results:
        for w in r.warnings:
            console(stderr=True).print(f"warning: round {r.round + 1}: {w}")
    typer.echo(f"train_run_id={run_id} final_checkpoint={results[-1].checkpoint.id} path={results[-1].checkpoint.path}")


def register(app: typer.Typer) -> None:
    app.command()(train)

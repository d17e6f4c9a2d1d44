"""``agentmem rollout``: collect agent trajectories into the store."""

from __future__ import annotations

from typing import Annotated

import typer

from agentmem.config import Device, PolicySource, ReplayConfig
from agentmem.records import RunKind
from cli.config_options import CommandLineError, invocation, job_command
from cli.job_specs import ROLLOUT
from cli.options import DbOption, DeviceOption, ThreadsOption
from cli.paste import command, sql_command
from cli.ray_workers import (
    RayAddressOption,
    RayOption,
    WorkerCpusOption,
    WorkerGpusOption,
    check_flags,
    with_ray,
)

ReplayFromOption = Annotated[str | None, typer.Option(
    help="ReOPD: branch from stored run RUN_ID instead of reading an environment: per episode one step t drawn "
         "with P(t) ∝ kappa^t, sampled --group-size times by --model from the stored prompt; stored as a replay "
         "run (no reward). Environment and memory flags do not apply.", show_default=False)]
KappaOption = Annotated[float, typer.Option(help=ReplayConfig.model_fields["kappa"].description)]
ResumeOption = Annotated[str | None, typer.Option(help="Finish run RUN_ID (its stored config is used).")]
WorkersOption = Annotated[int, typer.Option(
    help="Local worker processes: 1 does the calls in this process; N > 1 writes the run and its episodes, then "
         "starts N `agentmem worker --run RUN_ID` processes that share them (each loads the model). More workers "
         "on other machines may join with `agentmem worker`. With --ray: N Ray actors instead.", min=1)]


@job_command(ROLLOUT)
def rollout(ctx: typer.Context, replay_from: ReplayFromOption = None,
            kappa: KappaOption = ReplayConfig.model_fields["kappa"].default, resume: ResumeOption = None,
            workers: WorkersOption = 1, ray: RayOption = False, ray_address: RayAddressOption = None,
            worker_gpus: WorkerGpusOption = 0.0, worker_cpus: WorkerCpusOption = 1.0,
            device: DeviceOption = Device.auto, threads: ThreadsOption = None, db: DbOption = None) -> None:
    """Run the memory agent over an environment and stream every call to the store.

    With no flags: 8 synthetic tasks with the default model on sqlite:///agentmem.db (measured on an idle
    2-core CPU: 2 min 45 s; a first run also prepares the default model, once). Kill it at any time (Ctrl-C
    prints the command that resumes); `--resume RUN_ID` finishes the run without duplicating
    rows. `--replay-from RUN_ID` samples ReOPD's single calls branched from a stored teacher run instead.
    """
    from cli.common import measured_dtype, preflight
    from cli.job_session import after_run_id
    from cli.plan import agent_plan

    call = invocation(ctx)
    call.refuse_on_resume(resume)
    check_flags(ray, ray_address, worker_gpus, worker_cpus, db)
    if replay_from is not None or call.passed("kappa") or (resume and _is_replay(resume, db)):
        return _replay(call, replay_from, resume, kappa=kappa, device=device, threads=threads, db=db)
    config = None if resume else call.config()
    preflight(db, resume=resume, kind=RunKind.rollout, models=(config.model,) if config else (), rollout=config,
              create=True)
    plan = agent_plan(config or _stored_config(str(resume), db), db)
    after_run_id(plan.line())
    config = measured_dtype(call, config, db, threads)
    if ray:
        return with_ray(workers, ray_address, worker_gpus, worker_cpus, config, resume, db=db, device=device,
                        threads=threads)
    if workers > 1:
        return _with_workers(workers, config, resume, db=db, device=device, threads=threads)
    result = _run(config, resume, device, threads, db, plan)
    _summary(result.run_id, result.episodes, db)
    if result.config.model == "default" and result.config.policy is PolicySource.model:  # a resumed run's own
        typer.echo(UNTRAINED_NOTE)


def _stored_config(run_id: str, db: str | None):
    from agentmem.jobs.rollout import load_rollout_config
    from store.engine import open_store

    return load_rollout_config(open_store(db), run_id)[1]


def _run(config, resume: str | None, device: Device, threads: int | None, db: str | None, plan):
    from agentmem.jobs.rollout import run_rollout
    from cli.agent_progress import call_progress
    from cli.common import runtime, setup_logging
    from cli.job_session import job_session
    from store.engine import open_store

    rt = runtime(device, threads)
    setup_logging()
    with job_session(db), call_progress("rollout", plan.calls, plan.episodes) as bar:
        return run_rollout(open_store(db, create=True), config, rt, resume=resume, on_start=bar.on_start,
                           on_round=bar.on_round)


# The quick start's last line: an untrained 135M model scoring 0 is the expected first result, not a failure.
UNTRAINED_NOTE = ("note: the untrained SmolLM2-135M scores near 0 here; that is expected. To see learning: "
                  "agentmem rollout --policy oracle, then agentmem sft --run ORACLE_RUN, then agentmem eval --model "
                  "CHECKPOINT (docs/learning.md)")


def summary_query(run_id: str) -> str:
    """The narrow query a rollout suggests: what was asked, the gold answer (the first of the stored JSON
    list, as plain text: ``->>`` reads it on SQLite and Postgres alike, and holds no ``$`` for bash to expand)
    and the predicted one, F1, calls, and how the episode ended and why (``stop_reason``: e.g. why it was
    truncated)."""
    return ("select question, gold->>0 as gold, prediction, f1, n_calls, status, stop_reason from episode_summary "
            f"where run_id = '{run_id}'")


def _summary(run_id: str, eps, db: str | None = None) -> None:
    """The run's table of episodes by status and their mean scores, then the query that inspects them."""
    from rich.table import Table

    from cli.console import console

    done = [e for e in eps if e.f1 is not None]

    def mean(xs):
        return sum(xs) / len(xs) if xs else float("nan")

    table = Table(title=f"run {run_id}")
    for col in ("episodes", "answered", "truncated", "failed", "F1", "EM", "substring EM"):
        table.add_column(col, justify="right")
    by = {s: sum(1 for e in eps if e.status.value == s) for s in ("answered", "truncated", "failed")}
    table.add_row(str(len(eps)), str(by["answered"]), str(by["truncated"]), str(by["failed"]),
                  f"{mean([e.f1 for e in done]):.3f}", f"{mean([e.em for e in done]):.3f}",
                  f"{mean([e.sub_em for e in done]):.3f}")
    console().print(table)
    typer.echo(f"inspect: {sql_command(summary_query(run_id), db)}")


def _with_workers(n: int, config, resume: str | None, *, db: str | None, device: Device, threads: int | None) -> None:
    """``rollout --workers N``: the run and its episodes are written here, the calls by N local workers."""
    from agentmem.errors import RunError
    from agentmem.jobs.rollout import LeaseTerms, create_rollout
    from cli.common import runtime, setup_logging
    from cli.job_session import print_run_id
    from cli.worker import start_workers
    from store import repository as repo
    from store.engine import open_store

    runtime(device, threads)  # a bad --device or --threads fails here, before any worker starts
    setup_logging()
    store = open_store(db, create=True)
    run_id = create_rollout(store, config, resume=resume)
    print_run_id(run_id)
    terms = LeaseTerms()
    codes = start_workers(n, run_id, db=db, device=device.value, threads=threads, lease_seconds=terms.seconds,
                          max_attempts=terms.max_attempts)
    with store.session() as s:
        episodes = repo.list_episodes(s, run_id)
    left = sum(1 for e in episodes if e.status.value == "running")
    if left or any(codes):
        failed = sum(1 for c in codes if c)
        raise RunError(f"run {run_id}: {failed} of {n} workers failed and {left} episodes are still running: "
                       f"finish it with `agentmem worker --run {run_id}`")
    _summary(run_id, episodes, db)


# What a replay takes from the rollout flags (ReplayConfig field <- RolloutConfig path); any other does not apply.
_REPLAY_FIELDS = {"model": "model", "backend": "backend", "dtype": "dtype", "group_size": "group_size",
                  "seed": "seed", "temperature": "agent.temperature", "top_p": "agent.top_p",
                  "max_batch": "agent.max_batch"}


def _replay(call, replay_from: str | None, resume: str | None, *, kappa: float, device: Device,
            threads: int | None, db: str | None) -> None:
    """``rollout --replay-from``: ReOPD's replay run (``agentmem.jobs.replay``)."""
    from agentmem.jobs.replay import run_replay
    from cli.common import preflight, runtime, setup_logging, weights_dtype
    from cli.config_options import get_path
    from cli.job_session import job_session
    from store.engine import open_store

    config, auto = None, False
    if resume is None:
        if replay_from is None:
            raise CommandLineError("--kappa weights the branch steps of a replay: give --replay-from RUN_ID")
        data, paths = call.given()
        other = [o.flags[0] for o in ROLLOUT.options() if o.path in paths - set(_REPLAY_FIELDS.values())]
        if other or call.extras["level"] is not None:
            flags = ", ".join(other + (["--level"] if call.extras["level"] is not None else []))
            raise CommandLineError(f"--replay-from takes the tasks, prompts and token limits from the teacher run: "
                              f"{flags} do(es) not apply")
        auto = data.get("dtype") == "auto"
        fields = {k: get_path(data, p) for k, p in _REPLAY_FIELDS.items() if p in paths and not (k == "dtype" and auto)}
        config = ReplayConfig(teacher_run=replay_from, kappa=kappa, **fields)
    preflight(db, resume=resume or replay_from, kind=RunKind.replay if resume else RunKind.rollout,
              models=(config.model,) if config else ())
    if config is not None and auto:
        config = config.model_copy(update={"dtype": weights_dtype("auto", config.model, db, threads)})
    rt = runtime(device, threads)
    setup_logging()
    with job_session(db):
        result = run_replay(open_store(db, create=True), config, rt, resume=resume)
    failed = sum(1 for e in result.episodes if e.status.value == "failed")
    typer.echo(f"replay_run_id={result.run_id} episodes={len(result.episodes)} calls={result.calls}"
               + (f" failed={failed}" if failed else ""))
    typer.echo(f"next: {command('distill', '--run', result.run_id, '--rl', 'none', db=db)}")


def _is_replay(run_id: str, db: str | None) -> bool:
    from agentmem.records import RunKind
    from store import repository as repo
    from store.engine import open_store

    with open_store(db).session() as s:
        return repo.get_run(s, run_id).kind is RunKind.replay


def replay_audit(
    student_run: Annotated[str, typer.Option(help="A normal rollout of the student (its on-policy states).")],
    teacher_run: Annotated[str, typer.Option(help="The teacher (or oracle) rollout ReOPD branches from.")],
    db: DbOption = None,
) -> None:
    """ReOPD's state-coverage audit: the share of the student's calls whose state (task, step, call kind,
    memory read) the teacher run visited, in all and per step."""
    from agentmem.jobs.replay import audit_coverage
    from store.engine import open_store

    cov = audit_coverage(open_store(db), student_run, teacher_run)
    later = cov.share_after_first
    typer.echo(f"coverage={cov.share:.4f} matched={cov.matched} student_calls={cov.total} "
               f"teacher_states={cov.teacher_states}"
               + (f" coverage_after_step0={later:.4f}" if later is not None else ""))
    for step, (matched, total) in cov.by_step.items():
        typer.echo(f"step={step} matched={matched} of={total} share={matched / total:.4f}")


def register(app: typer.Typer) -> None:
    app.command()(rollout)
    app.command("replay-audit")(replay_audit)

"""``agentmem score``: teacher scores for stored invocations."""

from __future__ import annotations

import time

import typer

from agentmem.config import Device
from cli.config_options import job_command, job_config
from cli.job_specs import SCORE
from cli.options import DbOption, DeviceOption, ThreadsOption
from cli.paste import sql_command


@job_command(SCORE)
def score(
    ctx: typer.Context,
    device: DeviceOption = Device.auto,
    threads: ThreadsOption = None,
    db: DbOption = None,
) -> None:
    """Score the sampled tokens of stored invocations with a teacher, under exactly the state the student
    saw (aligned), the flattened history (persistent) or with privileged context. Resumable."""
    from agentmem.jobs.score import run_score
    from cli.agent_progress import call_progress
    from cli.common import preflight, runtime, setup_logging
    from cli.job_session import after_run_id, job_session
    from cli.plan import score_plan
    from store.engine import open_store

    config = job_config(ctx)
    preflight(db, runs=config.run_ids, models=(config.teacher, config.student), kinds=config.kinds)
    plan = score_plan(config, db)
    after_run_id(plan.line())
    rt = runtime(device, threads)
    setup_logging()
    t0 = time.perf_counter()
    with job_session(db), call_progress("score", plan.calls) as bar:
        result = run_score(open_store(db), config, rt, on_start=bar.on_calls, on_batch=bar.on_batch)
    typer.echo(f"scored={result.scored} skipped_already_scored={result.skipped} fill={result.fill:.3f} "
               f"teacher_truncated_calls={result.teacher_truncated_calls} "
               + (f"skipped_not_chat={result.not_chat} " if result.not_chat else "")
               + f"seconds={time.perf_counter() - t0:.1f} "
               f"score_run_id={result.run_id}")
    typer.echo("inspect: " + sql_command("select invocation_id, context, n_tokens, mean_logprob, mean_reverse_kl, "
                                         f"mean_entropy, temperature from teacher_scores where run_id = '{result.run_id}'",
                                         db))


def register(app: typer.Typer) -> None:
    app.command()(score)

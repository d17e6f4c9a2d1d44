"""``agentmem score``: teacher scores for stored invocations."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

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
    from cli.common import preflight, runtime, setup_logging
    from cli.job_session import job_session
    from store.engine import open_store

    config = job_config(ctx)
    preflight(db, runs=config.run_ids, models=(config.teacher, config.student), kinds=config.kinds)
    rt = runtime(device, threads)
    setup_logging()
    t0 = time.perf_counter()
    with job_session(db), _progress() as (on_start, on_batch):
        result = run_score(open_store(db), config, rt, on_start=on_start, on_batch=on_batch)
    typer.echo(f"scored={result.scored} skipped_already_scored={result.skipped} fill={result.fill:.3f} "
               f"teacher_truncated_calls={result.teacher_truncated_calls} "
               + (f"skipped_not_chat={result.not_chat} " if result.not_chat else "")
               + f"seconds={time.perf_counter() - t0:.1f} "
               f"score_run_id={result.run_id}")
    typer.echo("inspect: " + sql_command("select invocation_id, context, n_tokens, mean_logprob, mean_reverse_kl, "
                                         f"mean_entropy, temperature from teacher_scores where run_id = '{result.run_id}'",
                                         db))


@contextlib.contextmanager
def _progress() -> Iterator[tuple[Callable, Callable]]:
    """A bar of calls scored with tokens/s: yields the job's (on_start, on_batch)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from cli.console import console

    progress = Progress(TextColumn("[bold]score"), BarColumn(), MofNCompleteColumn(), TextColumn("invocations"),
                        TextColumn("{task.fields[tps]:.0f} tok/s"), TimeElapsedColumn(), console=console(stderr=True))
    state = {"task": None, "tokens": 0, "seconds": 0.0}

    def on_start(total: int, skipped: int) -> None:
        state["task"] = progress.add_task("score", total=total, completed=skipped, tps=0.0)

    def on_batch(p) -> None:
        state["tokens"] += p.tokens
        state["seconds"] += p.seconds
        progress.update(state["task"], advance=p.invocations, tps=state["tokens"] / max(state["seconds"], 1e-9))

    with progress:
        yield on_start, on_batch


def register(app: typer.Typer) -> None:
    app.command()(score)

"""``agentmem score``: teacher scores for stored invocations."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from agentmem.config import AttentionPath, Device, DType, Packing, TeacherTruncation
from agentmem.records import TeacherContext
from cli.options import DbOption, DeviceOption, ThreadsOption


def score(
    run: Annotated[list[str], typer.Option("--run", help="Rollout run id to score (repeatable).")],
    teacher: Annotated[str, typer.Option(help="Teacher: model folder, hub name, checkpoint id or 'default'.")]
    = "default",
    student: Annotated[str | None, typer.Option(help="Student model; adds the per-token reverse KL "
                                                     "KL(student_T || teacher_T) at --temperature.")] = None,
    context: Annotated[TeacherContext, typer.Option(
        help="Teacher context: aligned (the student's own state) | persistent (earlier calls concatenated as "
             "stored) | persistent_chat (the episode as one multi-turn chat) | privileged.")]
    = TeacherContext.aligned,
    kind: Annotated[list[str], typer.Option(help="Only these invocation kinds (e.g. memory_update, answer).")]
    = [],  # noqa: B006
    row_tokens: Annotated[int, typer.Option(help="Tokens per packed row (hard cap).")] = 4096,
    rows_per_batch: Annotated[int, typer.Option(help="Packed rows per forward pass.")] = 1,
    topk: Annotated[int, typer.Option(help="Also write the teacher's top-K log-probs to safetensors shards.")]
    = 0,
    topk_dir: Annotated[str, typer.Option(help="Folder for the top-K shards.")] = "agentmem_topk",
    attention: Annotated[AttentionPath, typer.Option(help="Packed attention path.")] = AttentionPath.fast,
    packing: Annotated[Packing, typer.Option(
        help="Row layout: segments (each call whole) or shared_prefix (a (run, task, step) group's common "
             "prompt prefix placed and computed once; exact).")] = Packing.shared_prefix,
    teacher_truncation: Annotated[TeacherTruncation, typer.Option(
        help="A teacher context longer than --row-tokens: error, or left (cut from the left; counted and "
             "shown).")] = TeacherTruncation.error,
    temperature: Annotated[float, typer.Option(help="Temperature of both distributions (stored per row).")]
    = 1.0,
    dtype: Annotated[DType, typer.Option(help="Teacher/student weights dtype.")] = DType.float32,
    privileged_file: Annotated[str | None, typer.Option(
        help="With --context privileged: a JSONL of {\"task_id\", \"answers\", \"text\"} giving the privileged "
             "context of episodes stored without one (e.g. an `agentmem serve` run).", show_default=False)] = None,
    device: DeviceOption = Device.auto,
    threads: ThreadsOption = None,
    db: DbOption = None,
) -> None:
    """Score the sampled tokens of stored invocations with a teacher, under exactly the state the student
    saw (aligned), the flattened history (persistent) or with privileged context. Resumable."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agentmem.config import ScoreConfig
    from agentmem.jobs.score import run_score
    from cli.common import preflight, runtime, setup_logging
    from cli.console import console
    from cli.job_session import job_session
    from store.engine import open_store

    config = ScoreConfig(run_ids=run, teacher=teacher, student=student, context=context, kinds=kind or None,
                         row_tokens=row_tokens, rows_per_batch=rows_per_batch, topk=topk, topk_dir=topk_dir,
                         path=attention, packing=packing, teacher_truncation=teacher_truncation, temperature=temperature,
                         dtype=dtype, privileged_file=privileged_file)
    preflight(db, runs=run, models=(teacher, student), kinds=config.kinds)
    rt = runtime(device, threads)
    setup_logging()
    store = open_store(db)
    out = console(stderr=True)
    progress = Progress(TextColumn("[bold]score"), BarColumn(), MofNCompleteColumn(), TextColumn("invocations"),
                        TextColumn("{task.fields[tps]:.0f} tok/s"), TimeElapsedColumn(), console=out)
    state = {"task": None, "tokens": 0, "seconds": 0.0}

    def on_start(total: int, skipped: int) -> None:
        state["task"] = progress.add_task("score", total=total, completed=skipped, tps=0.0)

    def on_batch(p) -> None:
        state["tokens"] += p.tokens
        state["seconds"] += p.seconds
        progress.update(state["task"], advance=p.invocations, tps=state["tokens"] / max(state["seconds"], 1e-9))

    t0 = time.perf_counter()
    with job_session(db), progress:
        result = run_score(store, config, rt, on_start=on_start, on_batch=on_batch)
    typer.echo(f"scored={result.scored} skipped_already_scored={result.skipped} fill={result.fill:.3f} "
               f"teacher_truncated_calls={result.teacher_truncated_calls} seconds={time.perf_counter() - t0:.1f} "
               f"score_run_id={result.run_id}")
    typer.echo("inspect: agentmem sql \"select invocation_id, context, n_tokens, mean_logprob, mean_reverse_kl, "
               f"mean_entropy, temperature from teacher_scores where run_id = '{result.run_id}'\"")


def register(app: typer.Typer) -> None:
    app.command()(score)

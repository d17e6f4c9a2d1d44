"""``agentmem score``: teacher scores for stored invocations."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from cli.options import DbOption


def load(store, ref: str, dtype: str):
    from agentmem.agent.models import resolve_model_ref
    from agentmem.policy.models import load_model
    from agentmem.training.scoring import LoadedModel

    path, _base = resolve_model_ref(store, ref)
    model, tokenizer = load_model(path, dtype=dtype)
    model.requires_grad_(False)
    return LoadedModel(model, tokenizer, path)


def score(
    run: Annotated[list[str], typer.Option("--run", help="Rollout run id to score (repeatable).")],
    teacher: Annotated[str, typer.Option(help="Teacher: model folder, hub name, checkpoint id or 'default'.")]
    = "default",
    student: Annotated[str | None, typer.Option(help="Student model; adds the per-token reverse KL "
                                                     "KL(student || teacher) at the sampling temperature.")] = None,
    context: Annotated[str, typer.Option(help="Teacher context: aligned | persistent | privileged.")] = "aligned",
    kind: Annotated[list[str], typer.Option(help="Only these invocation kinds: memory_update | answer.")]
    = [],  # noqa: B006
    row_tokens: Annotated[int, typer.Option(help="Tokens per packed row (hard cap).")] = 4096,
    rows_per_batch: Annotated[int, typer.Option(help="Packed rows per forward pass.")] = 1,
    topk: Annotated[int, typer.Option(help="Also write the teacher's top-K log-probs to safetensors shards.")]
    = 0,
    topk_dir: Annotated[str, typer.Option(help="Folder for the top-K shards.")] = "agentmem_topk",
    attention: Annotated[str, typer.Option(help="Packed attention path: fast | reference.")] = "fast",
    truncate_left: Annotated[bool, typer.Option(help="Cut over-long prompts from the left instead of "
                                                     "failing (counted in the summary).")] = False,
    dtype: Annotated[str, typer.Option(help="Teacher/student weights dtype: float32 | bfloat16.")] = "float32",
    threads: Annotated[int | None, typer.Option(help="torch CPU threads.")] = None,
    db: DbOption = None,
) -> None:
    """Score the sampled tokens of stored invocations with a teacher, under exactly the state the student
    saw (aligned), the flattened history (persistent) or with privileged context. Resumable."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agentmem.records import InvocationKind, TeacherContext
    from agentmem.training.scoring import ScoreConfig, run_score
    from cli.common import set_threads, setup_logging
    from cli.console import console
    from store.engine import open_store

    setup_logging()
    set_threads(threads)
    config = ScoreConfig(run_ids=run, teacher=teacher, student=student, context=TeacherContext(context),
                         kinds=[InvocationKind(k) for k in kind] or None, row_tokens=row_tokens,
                         rows_per_batch=rows_per_batch, topk=topk, topk_dir=topk_dir, path=attention,
                         truncate="left" if truncate_left else "error")
    store = open_store(db)
    out = console(stderr=True)
    with out.status("loading models"):
        teacher_model = load(store, teacher, dtype)
        student_model = load(store, student, dtype) if student else None
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
    with progress:
        result = run_score(store, config, teacher_model, student_model, on_start=on_start, on_batch=on_batch)
    typer.echo(f"scored={result.scored} skipped_already_scored={result.skipped} fill={result.fill:.3f} "
               f"truncated={result.truncated_sequences} seconds={time.perf_counter() - t0:.1f} "
               f"score_run_id={result.run_id}")
    typer.echo("inspect: agentmem sql \"select invocation_id, context, n_tokens, mean_logprob, mean_reverse_kl, "
               f"mean_entropy from teacher_scores where run_id = '{result.run_id}'\"")


def register(app: typer.Typer) -> None:
    app.command()(score)

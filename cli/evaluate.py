"""``agentmem eval``: greedy evaluation of a model or checkpoint, written to ``eval_results``."""

from __future__ import annotations

from typing import Annotated

import typer

from agentmem.config import Device, PlotBy
from cli.config_options import CommandLineError, invocation, job_command, usage_error
from cli.job_specs import EVAL
from cli.options import DbOption, DeviceOption, ThreadsOption
from cli.paste import sql_command

DocsOption = Annotated[str | None, typer.Option(
    help="Length sweep over documents: comma-separated counts, e.g. 50,100,200,400,800 (ruler_hotpotqa's `docs` "
         "knob). One evaluation, one run and one eval_results row per count; the model loads once.")]
SweepOption = Annotated[str | None, typer.Option(
    help="Sweep any integer knob: KNOB=V1,V2,... (e.g. context_tokens=4096,16384 for needle or synthetic). "
         "--docs N,M is --sweep docs=N,M.")]
PlotOption = Annotated[str | None, typer.Option(
    help="Write a PNG of F1 (95% intervals) over every stored eval of this environment to PATH.")]
PlotByOption = Annotated[PlotBy | None, typer.Option(
    help="Plot F1 against the training step or the context length (default: context length for a sweep, else "
         "step).")]


@job_command(EVAL)
def evaluate(ctx: typer.Context, docs: DocsOption = None, sweep: SweepOption = None, plot: PlotOption = None,
             plot_by: PlotByOption = None, device: DeviceOption = Device.auto, threads: ThreadsOption = None,
             db: DbOption = None) -> None:
    """Evaluate a model or checkpoint greedily: F1, EM and substring EM with bootstrap 95% intervals.

    The episodes are stored as a run of kind `eval` (inspect them with `agentmem sql`) and the summary as
    one `eval_results` row; `--plot PATH` draws every stored eval of the environment.
    """
    from agentmem.jobs.eval import sweep_configs
    from cli.common import measured_dtype, preflight
    from cli.job_session import after_run_id
    from cli.plan import agent_plan, sum_plans

    call = invocation(ctx)
    config = call.config()
    swept = _sweep(docs, sweep)
    parts = [config]
    if swept is not None:
        with usage_error():  # a knob the environment lacks, a value given twice: before the store opens
            parts = sweep_configs(config, *swept)
    preflight(db, models=(config.model,), rollout=config, create=True)
    plans = [agent_plan(part, db) for part in parts]
    after_run_id(sum_plans(plans).line())
    results, store = _run(measured_dtype(call, config, db, threads), swept, device, threads, db, plans)
    for result in results:
        _summary(result, db)
    if swept is not None and len(results) > 1:
        _sweep_table(swept[0], swept[1], results)
    if plot:
        by = plot_by or (PlotBy.context_tokens if swept is not None else PlotBy.step)
        _plot(store, config.env, plot, by)


def _run(config, swept, device: Device, threads: int | None, db: str | None, plans):
    """One evaluation, or one per value of the sweep; (results, store)."""
    from agentmem.jobs.eval import run_eval, run_sweep
    from cli.agent_progress import call_progress
    from cli.common import runtime, setup_logging
    from cli.job_session import job_session
    from store.engine import open_store

    rt = runtime(device, threads)
    setup_logging()
    store = open_store(db, create=True)
    with job_session(db), call_progress("eval", plans[0].calls, plans[0].episodes) as bar:
        if swept is None:
            return [run_eval(store, config, rt, on_start=bar.on_start, on_round=bar.on_round)], store
        knob, values = swept

        def on_length(i: int, value: int) -> None:
            bar.next_part(f"eval {knob}={value} ({i + 1}/{len(values)})", plans[i].calls, plans[i].episodes)

        return run_sweep(store, config, knob, values, rt, on_length=on_length, on_start=bar.on_start,
                         on_round=bar.on_round), store


def _sweep(docs: str | None, sweep: str | None) -> tuple[str, list[int]] | None:
    """(knob, values) of --docs or --sweep, or None; a malformed list is a ``CommandLineError`` naming the flag."""
    if docs is not None and sweep is not None:
        raise CommandLineError("give --docs or --sweep, not both (--docs N,M is --sweep docs=N,M)")
    if docs is None and sweep is None:
        return None
    if docs is not None:
        flag, knob, raw = "--docs", "docs", docs
    else:
        flag, (knob, sep, raw) = "--sweep", str(sweep).partition("=")
        if not (knob and sep):
            raise CommandLineError(f"--sweep expects KNOB=V1,V2,..., got {sweep!r}")
    try:
        values = [int(v) for v in raw.split(",")]
    except ValueError:
        raise CommandLineError(f"{flag} expects comma-separated integers, got {raw!r}") from None
    return knob, values


def _sweep_table(knob: str, values: list[int], results) -> None:
    from rich.table import Table

    from cli.console import console

    table = Table(title=f"length sweep · {results[0].env} · {results[0].model}")
    for col in (knob, "context tokens", "F1", "95% interval", "EM", "substring EM", "run"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for value, r in zip(values, results, strict=True):
        table.add_row(str(value), f"{r.metrics['context_tokens']:.0f}", f"{r.f1:.3f}",
                      f"[{r.f1_ci[0]:.3f}, {r.f1_ci[1]:.3f}]", f"{r.em:.3f}", f"{r.sub_em:.3f}", r.run_id[:8])
    console().print(table)


def episodes_query(run_id: str) -> str:
    """The query an evaluation suggests: each episode's question, gold answer (as text), prediction and scores."""
    return ("select task_id, question, gold->>0 as gold, prediction, f1, em, status, stop_reason from episode_summary "
            f"where run_id = '{run_id}'")


def _summary(result, db: str | None) -> None:
    from rich.table import Table

    from cli.console import console

    table = Table(title=f"eval · {result.env} · {result.n_episodes} episodes · step {result.step}")
    for col, justify in (("metric", "left"), ("mean", "right"), ("95% interval", "right")):
        table.add_column(col, justify=justify)
    for label, name in (("F1", "f1"), ("EM", "em"), ("substring EM", "sub_em")):
        lo, hi = getattr(result, f"{name}_ci")
        table.add_row(label, f"{getattr(result, name):.3f}", f"[{lo:.3f}, {hi:.3f}]")
    for category, f1 in result.metrics.get("f1_by_category", {}).items():
        table.add_row(f"F1 category {category}", f"{f1:.3f}", "")
    table.add_row("context tokens", f"{result.metrics['context_tokens']:.0f}", "")
    if "empty_rate" in result.metrics:
        table.add_row("empty outputs (EOS only)", f"{result.metrics['empty_rate']:.3f}", "")
        for kind, rate in result.metrics.get("empty_by_kind", {}).items():
            length = result.metrics.get("out_len_by_kind", {}).get(kind, 0.0)
            table.add_row(f"  {kind}: empty / mean tokens", f"{rate:.3f} / {length:.1f}", "")
    if result.metrics.get("empty_after_evidence") is not None:
        table.add_row("updates empty after evidence", f"{result.metrics['empty_after_evidence']:.3f}", "")
    for read, rate in (result.metrics.get("empty_at_first_read") or {}).items():
        table.add_row(f"  empty at a first read: {read}", f"{rate:.3f}", "")
    console().print(table)
    typer.echo(f"run_id={result.run_id} eval_id={result.id}")
    typer.echo(f"inspect: {sql_command(episodes_query(result.run_id), db)}")


def _plot(store, env: str, path: str, by: str) -> None:
    from agentmem.plots import plot_eval_results
    from store import repository as repo

    with store.session() as s:
        results = [r for r in repo.list_eval_results(s) if r.env == env]
    typer.echo(f"plot: {plot_eval_results(results, path, by=by)}")


def register(app: typer.Typer) -> None:
    app.command(name="eval")(evaluate)

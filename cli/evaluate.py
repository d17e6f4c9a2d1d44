"""``agentmem eval``: greedy evaluation of a model or checkpoint, written to ``eval_results``."""

from __future__ import annotations

from typing import Annotated

import typer

from agentmem.config import HELD_OUT_SEED, BackendKind, Device, DType, PlotBy, PromptLayout
from cli.common import env_knobs
from cli.options import DbOption, DeviceOption, EnvName, LevelOption, ThreadsOption


def evaluate(
    model: Annotated[str, typer.Option(help="Model folder, hub name, checkpoint id, or 'default' "
                                            "(SmolLM2-135M-Instruct, prepared on first use).")] = "default",
    env: Annotated[EnvName, typer.Option(help="Environment.")] = EnvName("synthetic"),
    data: Annotated[str | None, typer.Option(help="Data file in the benchmark's official JSON format "
                                                  "(use a held-out split).")] = None,
    knob: Annotated[list[str], typer.Option(help="Environment knob KEY=VALUE (repeatable), e.g. "
                                                 "context_tokens=4096.")] = [],  # noqa: B006
    level: LevelOption = None,
    episodes: Annotated[int, typer.Option(help="Number of tasks (one greedy episode each).")] = 16,
    seed: Annotated[int, typer.Option(help="Seed for task selection. The default differs from rollout's (0) so "
                                           "that synthetic tasks are ones training never saw; data files are "
                                           "only reordered by it.")] = HELD_OUT_SEED,
    backend: Annotated[BackendKind, typer.Option(help="Generation backend.")] = BackendKind.transformers,
    dtype: Annotated[DType, typer.Option(help="Weights dtype for the transformers backend.")] = DType.float32,
    chunk_tokens: Annotated[int, typer.Option(help="Tokens per chunk the agent reads per call.")] = 512,
    memory_tokens: Annotated[int, typer.Option(help="Memory budget in tokens (max new tokens of an update).")]
    = 128,
    answer_tokens: Annotated[int, typer.Option(help="Max new tokens of the answer call.")] = 32,
    max_chunks: Annotated[int | None, typer.Option(help="Read at most this many chunks (episode truncated).")]
    = None,
    memory_policy: Annotated[str, typer.Option(help="Memory policy (registered name).")] = "overwrite",
    prompt_layout: Annotated[PromptLayout, typer.Option(
        help="Update prompt order: chunk-first (question, chunk, memory: a task's samples share the prefix) "
             "or memory-first (MemAgent's order).")] = PromptLayout.chunk_first,
    batch: Annotated[int, typer.Option(help="Calls per backend batch (across episodes).")] = 8,
    device: DeviceOption = Device.auto,
    threads: ThreadsOption = None,
    plot: Annotated[str | None, typer.Option(help="Write a PNG of F1 (95% intervals) over every stored eval "
                                                  "of this environment to PATH.")] = None,
    plot_by: Annotated[PlotBy, typer.Option(help="Plot F1 against the training step or the context length.")]
    = PlotBy.step,
    db: DbOption = None,
) -> None:
    """Evaluate a model or checkpoint greedily: F1, EM and substring EM with bootstrap 95% intervals.

    The episodes are stored as a run of kind `eval` (inspect them with `agentmem sql`) and the summary as
    one `eval_results` row; `--plot PATH` draws every stored eval of the environment.
    """
    from agentmem.config import AgentConfig, EvalConfig
    from agentmem.jobs.eval import run_eval
    from cli.agent_progress import episode_progress
    from cli.common import runtime, setup_logging
    from store.engine import open_store

    config = EvalConfig(env=env.value, data=data, env_knobs=env_knobs(env.value, knob, level), model=model, backend=backend,
                        dtype=dtype, episodes=episodes, seed=seed, chunk_tokens=chunk_tokens,
                        agent=AgentConfig(memory_tokens=memory_tokens, answer_max_new_tokens=answer_tokens,
                                          max_chunks=max_chunks, temperature=0.0, max_batch=batch, seed=seed,
                                          memory_policy=memory_policy, prompt_layout=prompt_layout))
    rt = runtime(device, threads)
    setup_logging()
    store = open_store(db, create=True)
    with episode_progress("eval") as bar:
        result = run_eval(store, config, rt, on_start=bar.on_start, on_round=bar.on_round)
    _summary(result)
    if plot:
        _plot(store, config.env, plot, plot_by)


def _summary(result) -> None:
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
    console().print(table)
    typer.echo(f"run_id={result.run_id} eval_id={result.id}  (inspect: agentmem sql \"select * from "
               f"episode_summary where run_id = '{result.run_id}'\")")


def _plot(store, env: str, path: str, by: str) -> None:
    from agentmem.plots import plot_eval_results
    from store import repository as repo

    with store.session() as s:
        results = [r for r in repo.list_eval_results(s) if r.env == env]
    typer.echo(f"plot: {plot_eval_results(results, path, by=by)}")


def register(app: typer.Typer) -> None:
    app.command(name="eval")(evaluate)

"""``agentmem memories``: build and list teacher-written workflow memories (AMD, DuoMem)."""

from __future__ import annotations

from typing import Annotated

import typer

from agentmem.config import Device
from cli.config_options import job_command, job_config
from cli.job_specs import MEMORIES
from cli.options import DbOption, DeviceOption, ThreadsOption

app = typer.Typer(help="Workflow memories written from a run's successful episodes (the teacher memory policy).",
                  no_args_is_help=True)


@app.command()
@job_command(MEMORIES)
def build(
    ctx: typer.Context,
    device: DeviceOption = Device.auto,
    threads: ThreadsOption = None,
    db: DbOption = None,
) -> None:
    """Write one workflow memory per successful episode of --run into the memories table, in a new run of
    kind memories; use it with `agentmem rollout --memory teacher --memory-option memories=BUILD_RUN`."""
    from agentmem.jobs.memories import ORACLE, build_memories
    from cli.common import preflight, runtime, setup_logging
    from cli.job_session import job_session
    from store.engine import open_store

    config = job_config(ctx)
    store = open_store(db)
    preflight(db, runs=[config.run], models=() if config.writer == ORACLE else (config.writer,))
    rt = None if config.writer == ORACLE else runtime(device, threads)
    setup_logging()
    from contextlib import nullcontext

    with rt or nullcontext(), job_session(db):
        result = build_memories(store, config, rt) if rt else build_memories(store, config)
    typer.echo(f"memories_run_id={result.run_id} memories={len(result.memories)} source_run={result.source_run_id}")


@app.command("list")
def list_(
    run: Annotated[str | None, typer.Option("--run", help="Only the memories of this build run.")] = None,
    full: Annotated[bool, typer.Option(help="Print each memory's text in full.")] = False,
    db: DbOption = None,
) -> None:
    """List workflow memories with their provenance (build run, source episode, writer, F1)."""
    from rich.table import Table

    from cli.console import console
    from store import repository as repo
    from store.engine import open_store
    from store.repository import memories as memory_repo

    store = open_store(db)
    with store.session() as s:
        build_id = repo.get_run(s, run).id if run else None
        memories = memory_repo.list_memories(s, build_id)
    if not memories:
        console().print("no memories yet: write some with `agentmem memories build --run RUN_ID`")
        return
    if full:
        for m in memories:
            typer.echo(f"== memory {m.id} (build {m.build_run_id}, episode {m.source_episode_id}, {m.writer})\n{m.text}")
        return
    table = Table("memory", "build run", "source episode", "calls", "writer", "F1", "question")
    for m in memories:
        table.add_row(m.id[:12], (m.build_run_id or "")[:12], m.source_episode_id[:12],
                      str(len(m.source_invocation_ids)), m.writer, "" if m.f1 is None else f"{m.f1:.2f}",
                      m.question[:60])
    console().print(table)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="memories")

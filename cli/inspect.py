"""Inspection commands: ``sql``, ``runs``, ``show episode``."""

from __future__ import annotations

import csv
import enum
import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.options import DbOption

if TYPE_CHECKING:
    from store.repository import RunSummary


class Format(str, enum.Enum):
    table = "table"
    csv = "csv"
    json = "json"


def _cell(value: Any) -> Any:
    if isinstance(value, (bytes, memoryview)):
        return f"<{len(value)} bytes>"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return value


def is_numeric(values: list[Any]) -> bool:
    """Whether a result column holds numbers only (nulls aside; at least one number): right-aligned."""
    present = [v for v in values if v is not None]
    return bool(present) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present)


def _statement(query: str) -> str:
    """``query`` without its comments, semicolons and white space at either end: empty for no statement."""
    import re

    return re.sub(r"--[^\n]*|/\*.*?\*/", " ", query, flags=re.S).strip().strip(";").strip()


def sql(
    query: Annotated[str, typer.Argument(help="One SQL statement, e.g. \"select * from episode_summary\".")],
    db: DbOption = None,
    write: Annotated[bool, typer.Option("--write/--no-write", help="Allow statements that change the database.")] = False,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
    limit: Annotated[int | None, typer.Option(help="Print at most this many rows.")] = None,
) -> None:
    """Run SQL against the store (read-only unless --write). Views: invocation_history, episode_summary."""
    import sqlalchemy as sa
    from sqlalchemy.exc import DBAPIError

    from store.engine import check_reachable, open_store
    from store.errors import ReadOnlyDatabase, StoreError
    from store.read_only import is_denied, sqlite_authorizer

    if not _statement(query):
        from cli.config_options import CommandLineError

        raise CommandLineError(f"empty SQL statement {query!r}: give one, e.g. agentmem sql \"select * from runs\"")
    read_only = "the database is opened read-only; pass --write to change it"
    engine = open_store(db, check=False).engine
    check_reachable(engine)
    sqlite = engine.dialect.name == "sqlite"
    with engine.connect() as conn:
        if not write:
            if sqlite:
                conn.exec_driver_sql("PRAGMA query_only=ON")
                conn.connection.driver_connection.set_authorizer(sqlite_authorizer)
            else:
                conn = conn.execution_options(postgresql_readonly=True)
                conn.exec_driver_sql("SET TRANSACTION READ ONLY")
        try:
            result = conn.execute(sa.text(query))
            columns = list(result.keys()) if result.returns_rows else []
            rows = [[_cell(v) for v in row] for row in (result.fetchmany(limit) if limit else result.fetchall())] \
                if result.returns_rows else []
            if write:
                conn.commit()
        except DBAPIError as exc:
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            if not write and is_denied(reason):
                reason = read_only
            raise StoreError(f"SQL failed: {reason}") from None
        except ReadOnlyDatabase:
            if write:
                raise
            raise StoreError(f"SQL failed: {read_only}") from None
        finally:
            if sqlite and not write:
                conn.connection.driver_connection.set_authorizer(None)
                conn.exec_driver_sql("PRAGMA query_only=OFF")
    if not columns:
        typer.echo(f"ok ({result.rowcount} rows affected)")
        return
    if fmt is Format.csv:
        out = csv.writer(sys.stdout, lineterminator="\n")
        out.writerow(columns)
        out.writerows(rows)
    elif fmt is Format.json:
        typer.echo(json.dumps([dict(zip(columns, r, strict=True)) for r in rows], default=str, indent=1))
    else:
        from rich.table import Table

        from cli.console import console

        table = Table(show_lines=False)
        for i, name in enumerate(columns):
            table.add_column(name, justify="right" if is_numeric([r[i] for r in rows]) else "left")
        for r in rows:
            table.add_row(*["" if v is None else str(v) for v in r])
        console().print(table)
        typer.echo(f"{len(rows)} row{'' if len(rows) == 1 else 's'}")


def run_status(summary: RunSummary) -> str:
    """The status column: a running run says whether its process is alive; a failed one says why."""
    run = summary.run
    if summary.liveness == "dead":
        return f"running (killed: pid {run.pid} is gone)"
    if summary.liveness == "stale":
        beat = (run.heartbeat_at or run.created_at).strftime("%Y-%m-%d %H:%M")
        return f"running (stale: no heartbeat from {run.host} since {beat})"
    if summary.liveness == "unknown":
        return "running (unknown: no process id stored)"
    if run.error:
        return f"{run.status}: {run.error[:80]}"
    return run.status


def runs(db: DbOption = None, limit: Annotated[int, typer.Option(help="Most recent N runs.")] = 50) -> None:
    """List runs, newest first, with their episode and invocation counts."""
    from rich.table import Table

    from cli.console import console
    from store import repository as repo
    from store.engine import open_store

    store = open_store(db)
    with store.session() as session:
        summaries = repo.list_runs(session, limit)
    table = Table("run", "kind", "status", "created (UTC)", "episodes", "invocations", "mean F1")
    for s in summaries:
        table.add_row(
            s.run.id, s.run.kind.value, run_status(s), s.run.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            str(s.episodes), str(s.invocations), "" if s.mean_f1 is None else f"{s.mean_f1:.3f}",
        )
    console().print(table if summaries else "no runs yet: start one with `agentmem rollout`")


show_app = typer.Typer(help="Show one stored object in full.", no_args_is_help=True)


@show_app.command("episode")
def show_episode(
    episode_id: Annotated[str, typer.Argument(help="Episode id (see episode_summary).")],
    db: DbOption = None,
    full: Annotated[bool, typer.Option(help="Print prompts in full, not only memory and outputs.")] = False,
) -> None:
    """An episode's calls in order, with the memory after each."""
    from rich.panel import Panel

    from cli.console import console as make_console
    from store import repository as repo
    from store.engine import open_store

    store = open_store(db)
    with store.session() as session:
        episode = repo.get_episode(session, episode_id)
        calls = repo.episode_invocations(session, episode.id)
    console = make_console()
    console.print(
        f"[bold]episode[/bold] {episode.id}  run {episode.run_id}  env {episode.env}  task {episode.task_id}"
        f"  sample {episode.sample_index}\n[bold]question[/bold] {episode.question}\n"
        f"[bold]gold[/bold] {episode.gold_answers}  [bold]prediction[/bold] {episode.prediction!r}  "
        f"F1 {episode.f1}  EM {episode.em}  status {episode.status.value} ({episode.stop_reason or ''})"
        + (f"\n[red]error[/red] {episode.error}" if episode.error else "")
    )
    for inv in calls:
        body = (f"[dim]prompt[/dim]\n{inv.prompt_text}\n" if full else "") + (
            f"[dim]output[/dim]\n{inv.output_text}\n[dim]memory after[/dim]\n{inv.memory_after}"
        )
        console.print(
            Panel(
                body,
                title=f"step {inv.step} · {inv.kind} · {inv.prompt_tokens}+{inv.output_tokens} tokens"
                f" · {inv.finish_reason.value} · {inv.latency_s:.2f}s",
                title_align="left",
            )
        )


def export(
    run: Annotated[list[str], typer.Option("--run", help="Run id to export (repeatable).")],
    out: Annotated[str, typer.Option(help="Output: FILE.parquet, or a folder for datasets' save_to_disk.")],
    db: DbOption = None,
) -> None:
    """Export stored invocations (exact token ids and log-probs, texts, episode outcome) as a Hugging Face
    dataset, one row per invocation."""
    from agentmem.jobs.export import run_export
    from store.engine import open_store

    ds = run_export(open_store(db), run, out)
    typer.echo(f"wrote {ds.num_rows} invocations to {out}")


def register(app: typer.Typer) -> None:
    app.command()(export)
    app.command()(sql)
    app.command()(runs)
    app.add_typer(show_app, name="show")

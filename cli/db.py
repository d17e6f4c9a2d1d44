"""``agentmem db``: schema migrations."""

from __future__ import annotations

import typer

from cli.options import DbOption


def _revision(revision: str) -> str:
    """``revision`` when the migrations know it, else a ``CommandLineError`` (before any database is opened)."""
    from cli.config_options import usage_error
    from store.errors import StoreError
    from store.migrations import check_revision

    with usage_error(StoreError):
        check_revision(revision)
    return revision

app = typer.Typer(help="Create or migrate the database schema.", no_args_is_help=True)


@app.command()
def upgrade(db: DbOption = None, revision: str = typer.Argument("head", help="Target revision.")) -> None:
    """Create the schema or bring it up to date (safe to run on a current database)."""
    from store.engine import check_reachable, make_engine
    from store.migrations import current_revision
    from store.migrations import upgrade as do_upgrade

    revision = _revision(revision)
    engine = make_engine(db)
    check_reachable(engine)
    do_upgrade(engine, revision)
    typer.echo(f"{engine.url.render_as_string()}: at revision {current_revision(engine)}")


@app.command()
def downgrade(
    db: DbOption = None, revision: str = typer.Argument(..., help="Target revision ('base' drops everything).")
) -> None:
    """Migrate the schema down to REVISION."""
    from store.engine import check_reachable, make_engine
    from store.migrations import current_revision
    from store.migrations import downgrade as do_downgrade

    revision = _revision(revision)
    engine = make_engine(db)
    check_reachable(engine)
    do_downgrade(engine, revision)
    typer.echo(f"{engine.url.render_as_string()}: at revision {current_revision(engine)}")


@app.command()
def current(db: DbOption = None) -> None:
    """Print the database's schema revision and the code's head revision."""
    from store.engine import check_reachable, make_engine, sqlite_file
    from store.migrations import current_revision, head_revision

    engine = make_engine(db)
    path = sqlite_file(db)
    missing = path is not None and not path.exists()  # connecting would create the file
    if not missing:
        check_reachable(engine)
    cur, head = (None if missing else current_revision(engine)), head_revision()
    from cli.paste import command

    state = "up to date" if cur == head else f"behind: run `{command('db', 'upgrade', db=db)}`"
    typer.echo(f"current={cur or 'none'} head={head} ({state})")

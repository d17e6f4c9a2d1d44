"""Options shared by every command, and the Enums of choices that are not in ``agentmem.config``."""

from __future__ import annotations

from typing import Annotated

import typer

from agentmem.config import Choice, Device
from envs import env_names

# --env: the built-in environments and the installed packages' (entry points), checked at parse time
EnvName = Choice("EnvName", [(n, n) for n in env_names()])
# --dtype of the generating jobs (rollout, eval): a weights dtype, or auto (the faster one measured on this CPU)
GenDType = Choice("GenDType", [(n, n) for n in ("auto", "float32", "bfloat16", "float16")])
# what a bare path (no ``scheme://``) must look like to be taken as a SQLite file that does not exist yet
SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3", ".db3")
_KINDS = "sqlite:///PATH or postgresql://USER@HOST/DB"
_SCHEMES = ("sqlite", "postgresql", "postgres", "postgresql+psycopg")


def check_db_url(url: str, where: str = "--db") -> str:
    """``url`` when its form is one agentmem reads, else a ``CommandLineError`` with a hint for the common
    mistakes (``where`` names the flag or variable it came from); nothing is opened or created. Accepted:
    ``sqlite:///PATH``, ``postgresql://...`` (or ``postgres://``), and a bare path to a SQLite file that exists
    or ends in ``.db``, ``.sqlite``, ``.sqlite3`` or ``.db3``. Refused, with the form meant: ``sqlite:/x.db``,
    ``sqlite:x.db`` and ``sqlite://x.db`` (a SQLite URL has three slashes before a relative path, four before an
    absolute one), an unknown kind (``mysql://``, ``sqlite3://``) and a bare word (``notaurl``), which would
    otherwise name a new SQLite file."""
    import difflib
    from pathlib import Path

    from cli.config_options import CommandLineError

    scheme, sep, rest = url.partition("://")
    if not sep:
        kind, colon, path = url.partition(":")
        if colon and kind.lower() in _SCHEMES:
            if kind.lower() != "sqlite":
                raise CommandLineError(f"{where} {url}: not a database URL: give postgresql://USER@HOST/DB")
            bare = path.lstrip("/")
            raise CommandLineError(f"{where} {url}: a SQLite URL has three slashes before a relative path and four "
                                   f"before an absolute one: sqlite:///{bare} or sqlite:////{bare}")
        if Path(url).expanduser().is_file() or url.lower().endswith(SQLITE_SUFFIXES):
            return url
        raise CommandLineError(f"{where} {url}: not a database URL: give sqlite:///{url} for a SQLite file of that "
                               "name, or postgresql://USER@HOST/DB")
    if scheme.lower() not in _SCHEMES:
        close = difflib.get_close_matches(scheme.lower(), ["sqlite", "postgresql"], n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}://{rest}?)" if close else ""
        raise CommandLineError(f"unknown database kind {scheme!r} in {url}{hint}: give {_KINDS}")
    if scheme.lower() == "sqlite" and rest and not rest.startswith("/"):
        raise CommandLineError(f"{where} {url}: a SQLite URL has three slashes before a relative path and four "
                               f"before an absolute one: sqlite:///{rest} or sqlite:////{rest}")
    return url


def _db(value: str | None) -> str | None:
    """``--db``'s callback: the URL checked (``check_db_url``), or ``$AGENTMEM_DB`` checked when no flag is given."""
    import os

    from store.engine import ENV_VAR

    if value is not None:
        return check_db_url(value)
    if os.environ.get(ENV_VAR):
        check_db_url(os.environ[ENV_VAR], f"${ENV_VAR}")
    return None


DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="Database URL: sqlite:///PATH (default sqlite:///agentmem.db) or postgresql://USER@HOST/DB. "
        "Defaults to $AGENTMEM_DB.",
        show_default=False,
        callback=_db,
    ),
]
DeviceOption = Annotated[
    Device, typer.Option(help="Where models run: auto (CUDA when available, else CPU) | cpu | cuda.")
]
ThreadsOption = Annotated[int | None, typer.Option(help="torch CPU threads (default: torch's choice).", min=1)]
ReportToOption = Annotated[
    list[str],
    typer.Option("--report-to", help="Also log each training step's metrics to an experiment tracker: tensorboard, "
                 "mlflow or wandb (repeatable or comma-separated; default none). Offline, in a folder under "
                 "OUT/RUN_ID; each needs its extra, e.g. pip install 'agentmem[tensorboard]'.", show_default=False),
]
FsdpOption = Annotated[
    bool,
    typer.Option("--fsdp", help="Under torchrun (2+ processes): shard the student with FSDP2 instead of replicating "
                 "it with DDP (NCCL on CUDA, gloo on CPU); checkpoints are gathered whole on rank 0.",
                 show_default=False),
]

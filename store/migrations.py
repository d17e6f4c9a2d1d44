"""Schema migrations through alembic, located both in a checkout (``alembic/`` at the repository root)
and in an installed wheel (packaged as ``store/migrations``).

On SQLite, foreign keys are switched off while migrating: a batch migration copies a table and drops the
original, which the implicit delete of ``DROP TABLE`` would refuse while other tables reference it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from alembic.util.exc import CommandError

from alembic import command
from store.errors import StoreError

_RELATIVE = re.compile(r"^[+-]\d+$")


def script_location() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "migrations", here.parent / "alembic"):
        if (candidate / "env.py").is_file():
            return candidate
    raise StoreError(f"migration scripts not found next to {here}; the installation is incomplete")


def _config(connection: sa.Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location()))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(_config())


def head_revision() -> str:
    head = _scripts().get_current_head()
    assert head is not None
    return head


def known_revisions() -> list[str]:
    """Every revision id, oldest first."""
    return [s.revision for s in reversed(list(_scripts().walk_revisions()))]


def check_revision(revision: str) -> None:
    """Raise StoreError naming ``revision`` and the known ones unless alembic can resolve it."""
    if _RELATIVE.match(revision):
        return
    try:
        _scripts().get_revisions(revision)
    except (CommandError, RevisionError):
        known = ", ".join(["base", *known_revisions(), "head"])
        raise StoreError(f"unknown schema revision {revision!r}: known revisions are {known}") from None


def current_revision(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: sa.Engine, revision: str = "head") -> None:
    _migrate(engine, command.upgrade, revision)


def downgrade(engine: sa.Engine, revision: str = "base") -> None:
    _migrate(engine, command.downgrade, revision)


def _migrate(engine: sa.Engine, step: Callable[[Config, str], None], revision: str) -> None:
    check_revision(revision)
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:  # outside any transaction, where SQLite honours it
            conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            conn.commit()
        try:
            with conn.begin():
                step(_config(conn), revision)
        except CommandError as exc:
            raise StoreError(f"cannot migrate {engine.url.render_as_string()} to {revision!r}: {exc}") from None
        finally:
            if sqlite:
                conn.exec_driver_sql("PRAGMA foreign_keys=ON")
                conn.commit()

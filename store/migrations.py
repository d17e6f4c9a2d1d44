"""Schema migrations through alembic, located both in a checkout (``alembic/`` at the repository root)
and in an installed wheel (packaged as ``store/migrations``)."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from alembic import command
from store.errors import StoreError


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


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: sa.Engine, revision: str = "head") -> None:
    with engine.begin() as conn:
        command.upgrade(_config(conn), revision)


def downgrade(engine: sa.Engine, revision: str = "base") -> None:
    with engine.begin() as conn:
        command.downgrade(_config(conn), revision)

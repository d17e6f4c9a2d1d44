"""The invocation store: SQLAlchemy 2 models, engine set-up, migrations and repository functions.

Everything outside this package talks to the store through ``store.repository`` (records in, records
out) and ``store.engine`` (open a database, check its schema). SQLite is the default, Postgres works by
URL; the schema is the same on both and is created only by the alembic migrations.
"""

from store.engine import DEFAULT_URL, open_store, resolve_url
from store.errors import ReadOnlyDatabase, SchemaOutOfDate, StoreError, StoreUnavailable

__all__ = [
    "DEFAULT_URL", "open_store", "resolve_url", "ReadOnlyDatabase", "SchemaOutOfDate", "StoreError", "StoreUnavailable",
]

"""Column types that behave the same on SQLite and Postgres."""

from __future__ import annotations

from datetime import datetime, timezone

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC datetimes; SQLite stores them naive, so tz is restored on the way out."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect):
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
# JSON kept as written (``json`` on Postgres, whose ``jsonb`` reorders object keys): what a chat template
# renders with ``tojson`` depends on the order of the keys.
OrderedJSON = sa.JSON()
Blob = sa.LargeBinary().with_variant(postgresql.BYTEA(), "postgresql")

"""The commands the CLI prints for the user to paste (``inspect:``, ``resume with:``, ``next:``): each runs as
printed in bash, on the database the printing command used.

- a command names ``--db URL`` when the printing command was given one (a database from ``$AGENTMEM_DB`` or
  the default is the pasted command's too);
- a SQL statement is written in double quotes and holds nothing bash expands inside them (``$``, a backquote,
  ``"``, ``\\``): JSON is read with ``->>`` (SQLite 3.38+ and Postgres alike), never a ``'$[0]'`` path;
- a word is quoted only when bash needs it (``shlex.quote``).

``tests/docs/test_docs_commands.py`` runs every such command in bash, on SQLite and on Postgres.
"""

from __future__ import annotations

import shlex

# what bash expands or ends inside double quotes
_UNSAFE_IN_DOUBLE_QUOTES = ('$', '`', '"', '\\')


def db_flag(db: str | None) -> str:
    """`` --db URL`` for a database given on the command line, else nothing."""
    return f" --db {shlex.quote(db)}" if db else ""


def command(*words: str, db: str | None = None) -> str:
    """``agentmem WORDS`` as bash reads it, with ``--db`` when ``db`` was given."""
    return "agentmem " + shlex.join(words) + db_flag(db)


def sql_command(query: str, db: str | None = None) -> str:
    """``agentmem sql "QUERY"`` (and ``--db``): ``query`` must hold nothing bash expands in double quotes."""
    bad = [c for c in _UNSAFE_IN_DOUBLE_QUOTES if c in query]
    if bad:
        raise ValueError(f"a suggested query must not hold {' '.join(bad)}: bash would expand it: {query}")
    return f'agentmem sql "{query}"' + db_flag(db)

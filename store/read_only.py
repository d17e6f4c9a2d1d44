"""Read-only SQL for people (``agentmem sql`` without ``--write``): only reading statements run.

SQLite: an authorizer (``sqlite3.Connection.set_authorizer``) allows reading tables, calling functions
(not ``load_extension``), recursive CTEs and the PRAGMAs that only report; every other action (a write,
ATTACH, which ``VACUUM`` also needs, DDL, a PRAGMA that sets a value, a transaction) is denied when the
statement is prepared, before any file is touched. ``query_only`` stays on as a second guard.

Postgres: the transaction is begun read-only (``BEGIN READ ONLY``, and ``SET TRANSACTION READ ONLY``) and
rolled back; the server refuses any write in it.
"""

from __future__ import annotations

import sqlite3

# PRAGMAs that only report; the first group also takes an argument (a table or index name) and stays read-only.
PRAGMAS_WITH_ARGUMENT = frozenset({
    "table_info", "table_xinfo", "index_list", "index_info", "index_xinfo", "foreign_key_list",
    "foreign_key_check", "integrity_check", "quick_check", "table_list",
})
PRAGMAS_WITHOUT_ARGUMENT = PRAGMAS_WITH_ARGUMENT | frozenset({
    "database_list", "collation_list", "function_list", "module_list", "pragma_list", "compile_options",
    "page_count", "page_size", "freelist_count", "journal_mode", "user_version", "schema_version",
    "application_id", "encoding", "data_version", "foreign_keys", "query_only", "max_page_count",
})
_DENIED_FUNCTIONS = frozenset({"load_extension"})


def sqlite_authorizer(action: int, arg1: str | None, arg2: str | None, _db: str | None, _source: str | None) -> int:
    """Allow a reading action, deny anything else (``sqlite3`` authorizer signature)."""
    if action in (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE):
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_FUNCTION:
        return sqlite3.SQLITE_DENY if (arg2 or "").lower() in _DENIED_FUNCTIONS else sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA:
        name = (arg1 or "").lower()
        allowed = PRAGMAS_WITH_ARGUMENT if arg2 is not None else PRAGMAS_WITHOUT_ARGUMENT
        return sqlite3.SQLITE_OK if name in allowed else sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_DENY


def is_denied(reason: str) -> bool:
    """Whether a driver's error says the read-only guard refused the statement (SQLite's authorizer,
    ``query_only``, or Postgres's read-only transaction)."""
    text = reason.lower()
    return ("not authorized" in text or "authorization denied" in text or "read-only transaction" in text or "readonly" in text.replace(" ", "")
            or "read-only" in text)

"""Open a store: URL resolution, engine set-up per dialect, and the schema check.

SQLite (the default) runs in WAL mode with foreign keys on and a busy timeout, so a reader never blocks
the writer and two writer processes wait for each other instead of failing. Postgres is reached through
psycopg 3 (``postgresql://`` URLs are mapped to ``postgresql+psycopg://``).

A SQLite file is never created by accident: only ``open_store(create=True)`` (jobs that write) and
``agentmem db upgrade`` create one. A read-only SQLite database fails with one ``ReadOnlyDatabase`` line
naming the file: at open when a writer can tell, else at the first write.

``open_read_only`` is for readers that must never write (``agentmem view``, ``agentmem report``): SQLite
through a ``mode=ro`` URI with ``query_only`` on (no write, no WAL checkpoint, nothing created), Postgres
with read-only transactions.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from store.errors import ReadOnlyDatabase, SchemaOutOfDate, StoreFull, StoreUnavailable

DEFAULT_URL = "sqlite:///agentmem.db"
ENV_VAR = "AGENTMEM_DB"
SQLITE_BUSY_TIMEOUT_MS = 60_000
CREATE_LOCK_TIMEOUT_S = 600


def resolve_url(url: str | None) -> str:
    """The URL given, else ``$AGENTMEM_DB``, else the default SQLite file; a bare path means SQLite."""
    url = url or os.environ.get(ENV_VAR) or DEFAULT_URL
    if "://" not in url:
        url = f"sqlite:///{url}"
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def _set_wal(cur) -> None:
    """Switch the file to WAL (persistent in the file, so usually already done). Changing the journal mode
    needs an exclusive lock, and SQLite can answer "database is locked" at once, without its busy handler,
    while another process is creating or switching the same file: retry with a short backoff then."""
    if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
        return
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    delay = 0.01
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    _set_wal(cur)
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _sqlite_errors(db: str):
    """A ``handle_error`` hook: SQLite's "attempt to write a readonly database" (a file or folder without
    write permission), "unable to open database file" (e.g. no journal can be made in the folder) and
    "database or disk is full" / "disk I/O error" (no space, or a file size limit) become one line naming the
    file, raised where the write fails."""

    def hook(context: sa.engine.ExceptionContext) -> None:
        orig = context.original_exception
        if not isinstance(orig, sqlite3.OperationalError):
            return
        if "readonly database" in str(orig):
            raise ReadOnlyDatabase(f"database {db} is read-only ({orig}): check the permissions of the file "
                                   "and its folder, or use another --db") from None
        if "database or disk is full" in str(orig) or "disk I/O error" in str(orig):
            raise StoreFull(f"cannot write database {db} ({orig}): the disk is full or the file hit its size "
                            "limit; everything committed before is intact. Free space, then re-run with "
                            "--resume RUN_ID") from None
        if "unable to open database file" in str(orig):
            raise StoreUnavailable(f"cannot open database {db} ({orig}): check that the file and its folder "
                                   "exist and are readable and writable") from None

    return hook


def shown_url(url: sa.URL | str | None) -> str:
    """A database URL as the user wrote it (``postgresql://``, not the driver's ``postgresql+psycopg://``),
    its password hidden."""
    text = url.render_as_string() if isinstance(url, sa.URL) else resolve_url(url)
    return text.replace("postgresql+psycopg://", "postgresql://", 1)


_KINDS = "sqlite:///PATH or postgresql://USER@HOST/DB"


def check_url(url: str | None) -> sa.URL:
    """The parsed URL of ``url`` (or ``$AGENTMEM_DB``, or the default) after the checks that need no
    connection: a URL of a database kind agentmem uses (SQLite, Postgres) and, for a SQLite file, an existing
    folder that is not the file itself. Each failure is one ``StoreUnavailable`` line."""
    resolved = resolve_url(url)
    try:
        parsed = make_url(resolved)
    except ArgumentError:
        raise StoreUnavailable(f"bad database URL {shown_url(url)!r}: give {_KINDS}") from None
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise StoreUnavailable(f"unknown database kind {parsed.get_backend_name()!r} in {shown_url(parsed)}: "
                               f"give {_KINDS}")
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database or ":memory:"
        path = sqlite_file(resolved)
        if path is not None and not path.resolve().parent.is_dir():
            raise StoreUnavailable(f"cannot create SQLite database {db!r}: its folder does not exist")
        if path is not None and path.is_dir():
            raise StoreUnavailable(f"{db} is a directory, not a SQLite database file: give a file path, "
                                   f"e.g. {path / 'agentmem.db'}")
    return parsed


def make_engine(url: str | None = None, *, read_only: bool = False) -> sa.Engine:
    """An engine for ``url``; raises StoreUnavailable for a malformed URL, a missing driver or a
    directory that does not exist (``check_url``). Nothing is connected yet. ``read_only`` makes every
    Postgres transaction read-only (SQLite files are opened read-only by ``open_read_only``)."""
    parsed = check_url(url)
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database or ":memory:"
        engine = sa.create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        sa.event.listen(engine, "handle_error", _sqlite_errors(db))
        return engine
    try:
        connect_args: dict = {"connect_timeout": 10}
        if read_only:
            connect_args["options"] = "-c default_transaction_read_only=on"
        return sa.create_engine(parsed, pool_pre_ping=True, connect_args=connect_args)
    except (ArgumentError, ImportError) as exc:
        raise StoreUnavailable(f"cannot use database URL {shown_url(parsed)}: {exc}") from None


def check_reachable(engine: sa.Engine) -> None:
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise StoreUnavailable(f"cannot reach database {shown_url(engine.url)}: {reason}") from None


def check_schema(engine: sa.Engine, name: str | None = None) -> None:
    """Raise SchemaOutOfDate unless the database is at the code's head revision; ``name`` is how the
    message names the database (default: the engine's URL)."""
    from store.migrations import current_revision, head_revision

    check_reachable(engine)
    current, head = current_revision(engine), head_revision()
    if current != head:
        where = "has no agentmem schema" if current is None else f"is at revision {current}, code expects {head}"
        raise SchemaOutOfDate(
            f"database {name or shown_url(engine.url)} {where}: run `agentmem db upgrade --db URL`"
        )


class Store:
    """An engine plus a session factory. Sessions are short: one per unit of completed work."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)

    @property
    def url(self) -> str:
        return self.engine.url.render_as_string()

    def session(self) -> Session:
        return self.sessions()

    def dispose(self) -> None:
        self.engine.dispose()


def sqlite_file(url: str | None) -> Path | None:
    """The file a SQLite URL names; None for other databases, in-memory and ``file:`` URI databases."""
    parsed = make_url(resolve_url(url))
    db = parsed.database
    if parsed.get_backend_name() != "sqlite" or not db or db == ":memory:" or parsed.query.get("uri"):
        return None
    return Path(db).expanduser()


def open_store(url: str | None = None, *, check: bool = True, create: bool = False) -> Store:
    """Open the store at ``url`` and (by default) check its schema is current.

    A SQLite file must exist, unless ``create``: then a new or empty file (no tables at all) is created
    and migrated to the head revision, under a file lock so concurrent creators wait for the first one.
    A file with tables is never migrated here (``agentmem db upgrade`` does that)."""
    path = sqlite_file(url)
    engine = make_engine(url)
    if path is not None and create:
        _create_sqlite(engine, path)
    elif path is not None and not path.exists():
        raise StoreUnavailable(
            f"no database at {path}: create it with `agentmem db upgrade --db {path}` or by running "
            "`agentmem rollout`"
        )
    if check:
        check_schema(engine)
    return Store(engine)


def _sqlite_read_only_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA query_only=ON")
    cur.close()


def open_read_only(url: str | None = None) -> Store:
    """Open the store at ``url`` for reading only and check its schema is current. A SQLite file must
    exist; it is opened read-only (a ``mode=ro`` URI), so no connection can write it or checkpoint its WAL."""
    path = sqlite_file(url)
    if path is None:
        engine = make_engine(url, read_only=True)
    else:
        if not path.is_file():
            raise StoreUnavailable(f"no database at {path}: nothing to read")
        uri = f"sqlite:///file:{quote(str(path.expanduser().resolve()))}?mode=ro&uri=true"
        engine = sa.create_engine(uri, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
                                                     "check_same_thread": False})
        sa.event.listen(engine, "connect", _sqlite_read_only_pragmas)
        sa.event.listen(engine, "handle_error", _sqlite_errors(str(path)))
    check_schema(engine, f"sqlite:///{path}" if path is not None else None)
    return Store(engine)


def _create_sqlite(engine: sa.Engine, path: Path) -> None:
    from filelock import FileLock, Timeout

    from store.migrations import upgrade

    check_writable(path)
    # Always under the lock, even when tables exist: they may be another creator's migration half done
    # (a file with some tables and no schema version yet); the lock waits for it to finish. An existing
    # store is left as it is (up to date or not: check_schema tells).
    lock = FileLock(f"{path}.lock", timeout=CREATE_LOCK_TIMEOUT_S)
    try:
        with lock:
            if not sa.inspect(engine).get_table_names():
                upgrade(engine)
    except Timeout:
        raise StoreUnavailable(f"timed out creating {path}: another process holds {lock.lock_file}") from None


def check_writable(path: Path) -> None:
    """Raise ReadOnlyDatabase when this process cannot write the SQLite file ``path`` or its folder (SQLite
    writes its journal files next to the database)."""
    folder = path.expanduser().resolve().parent
    if path.exists() and not os.access(path, os.W_OK):
        raise ReadOnlyDatabase(f"database {path} is read-only: make the file writable (chmod u+w) or use another --db")
    if not os.access(folder, os.W_OK):
        raise ReadOnlyDatabase(f"database {path} is read-only: its folder {folder} is not writable")

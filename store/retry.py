"""Retrying a unit of store work when the database connection is lost (a Postgres restart or failover).

A unit is a function that opens its own session, does its work and commits: rerunning it after a lost
connection is safe because the store's writes are idempotent (calls, log entries and episodes are inserted
with conflicts ignored; outcome updates and lease renewals write the same values again). Only errors that
say the connection is gone are retried, with exponential backoff (0.1 s doubling to 5 s) until
``AGENTMEM_STORE_RETRY_S`` seconds (default 120) have passed; anything else, and the last failure, is
raised as it came.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, OperationalError

from store.errors import StoreUnavailable

T = TypeVar("T")
log = logging.getLogger(__name__)

_GONE = ("server closed the connection", "connection refused", "terminating connection", "connection failed",
         "could not connect", "connection is closed", "the database system is shutting down",
         "the database system is starting up", "consuming input failed", "connection timed out",
         "no connection to the server", "ssl connection has been closed", "broken pipe")


def is_disconnect(exc: BaseException) -> bool:
    """Whether ``exc`` says the database connection was lost or the server cannot be reached right now."""
    if isinstance(exc, StoreUnavailable):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, (OperationalError, DBAPIError)):
        text = str(exc.orig if exc.orig is not None else exc).lower()
        return any(s in text for s in _GONE)
    return False


def retry_seconds() -> float:
    return float(os.environ.get("AGENTMEM_STORE_RETRY_S", "120"))


def retrying(unit: Callable[[], T], what: str, *, seconds: float | None = None,
             sleep: Callable[[float], None] = time.sleep) -> T:
    """``unit()``, run again with backoff while it fails because the connection is gone (module docstring)."""
    deadline = time.monotonic() + (retry_seconds() if seconds is None else seconds)
    delay = 0.1
    while True:
        try:
            return unit()
        except Exception as exc:
            if not is_disconnect(exc) or time.monotonic() + delay > deadline:
                raise
            log.warning("store: %s lost its connection (%s); retrying in %.1f s", what,
                        str(exc).splitlines()[0][:120], delay)
            sleep(delay)
            delay = min(delay * 2, 5.0)

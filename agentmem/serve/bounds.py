"""What a request may hold, checked at the edge before any work is done: pure checks, no I/O.

- The body: at most ``ServeSettings.max_body_bytes`` (``--max-body-mb``), refused by its ``Content-Length`` before
  it is read, or as soon as the bytes read pass the limit (``read_body``).
- JSON values (``check_json``): finite numbers (Python's parser takes ``NaN``, ``Infinity`` and ``1e999``, no
  database column holds them the same way), strings without a NUL (Postgres text and ``jsonb`` cannot hold it)
  and without a lone surrogate (not UTF-8: neither database takes it), and at most ``MAX_DEPTH`` levels of
  nesting.
- Ids, names and headers against the store's column limits (``store.bounds``): an episode name or a task at
  most 255 characters (a task is stored in ``episodes.task_id``, and an episode's name is its task unless the
  client names one), a call kind at most 32, an invocation or run id at most 64.

Each failure is a 400 whose ``param`` names the field (``messages.0.content``, ``X-Agentmem-Task``) and whose
message names the limit, the same on SQLite and Postgres.
"""

from __future__ import annotations

import math
from typing import Any

from agentmem.serve.protocol import ApiError, bad_request
from store.bounds import check_length
from store.errors import ValueOutOfBounds

MAX_DEPTH = 64

EPISODE = "episodes.task_id"  # an episode's name may become its task
TASK = "episodes.task_id"
KIND = "invocations.kind"
INVOCATION_ID = "invocations.id"
RUN_ID = "runs.id"


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is over {limit} bytes, the server's limit (agentmem serve "
                         "--max-body-mb)", param="body", code="request_too_large")


def check_json(value: Any, path: str = "", depth: int = 0) -> None:
    """A 400 naming the first value of ``value`` (a parsed JSON body) no store takes alike (see the module)."""
    if depth > MAX_DEPTH:
        raise bad_request(f"{path or 'body'}: nested more than {MAX_DEPTH} levels deep", path or "body")
    if isinstance(value, float) and not math.isfinite(value):
        raise bad_request(f"{path or 'body'}: numbers must be finite, got {value}", path or "body")
    if isinstance(value, str):
        _check_text(value, path)
    elif isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            _check_text(key, where)
            check_json(item, where, depth + 1)
    elif isinstance(value, list):
        for k, item in enumerate(value):
            check_json(item, f"{path}.{k}" if path else str(k), depth + 1)


def _check_text(text: str, path: str) -> None:
    if "\x00" in text:
        raise bad_request(f"{path or 'body'}: NUL characters (\\u0000) are not accepted", path or "body")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"{path or 'body'}: a lone UTF-16 surrogate is not text (not UTF-8)", path or "body") from None


def check_id(value: str | None, column: str, field: str) -> str | None:
    """``value`` (None passes) when the store's column ``column`` holds it, else a 400 naming ``field``."""
    if value is None:
        return None
    try:
        return check_length(value, column, field)
    except ValueOutOfBounds as err:
        raise bad_request(str(err), field) from None

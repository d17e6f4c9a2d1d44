"""Reading the official benchmark JSON (and JSON-lines) files and checking their fields.

Invariant: a missing file, a file (or a line of a JSON-lines file) that is not JSON, or a record without a
field (or with a field of the wrong type) raises one ``EnvError`` that names the file, the record (index
or line, and id) and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envs.errors import EnvError

_TYPE_NAMES = {str: "a string", list: "a list", dict: "an object", int: "an integer"}


def require_file(path: str | Path) -> Path:
    """``path`` as a Path; raises EnvError when no file is there."""
    path = Path(path)
    if not path.is_file():
        raise EnvError(f"{path}: no such file")
    return path


def read_json(path: str | Path) -> Any:
    path = require_file(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise EnvError(f"{path}: not valid JSON ({err})") from None
    if not text.strip():
        raise EnvError(f"{path}: the file is empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        cut = " (the file ends early: truncated?)" if err.pos >= len(text.rstrip()) else ""
        raise EnvError(f"{path}: not valid JSON ({err}){cut}") from None


def where(path: Path, index: int | str, record: Any, id_field: str) -> str:
    """The prefix of an error about one record: file, index and (when readable) id."""
    rid = record.get(id_field) if isinstance(record, dict) else None
    return f"{path}: record {index}" + (f" ({id_field} {rid!r})" if rid is not None else "")


def where_line(path: Path, number: int, record: Any, id_field: str, unit: str = "line") -> str:
    """The prefix of an error about one line of a JSON-lines file (or, with ``unit`` "record", one record of a
    JSON array): file, line or record number and (when readable) id."""
    rid = record.get(id_field) if isinstance(record, dict) else None
    return f"{path}: {unit} {number}" + (f" ({id_field} {rid!r})" if rid is not None else "")


def need_list(value: Any, place: str) -> list:
    if not isinstance(value, list):
        raise EnvError(f"{place}: expected a list, got {type(value).__name__}")
    return value


def field(record: Any, key: str, kind: type | tuple[type, ...], place: str) -> Any:
    """``record[key]``, checked to be of ``kind``; ``place`` says which file and record."""
    if not isinstance(record, dict):
        raise EnvError(f"{place}: expected an object, got {type(record).__name__}")
    if key not in record:
        raise EnvError(f"{place}: missing field {key!r}")
    value = record[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and int in kinds and bool not in kinds):
        wanted = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise EnvError(f"{place}: field {key!r} must be {wanted}, got {type(value).__name__}")
    return value


def answer_text(value: Any, key: str, place: str) -> str:
    """A gold answer as text: numbers (LongMemEval, LoCoMo store a few) become strings; blank is an error."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise EnvError(f"{place}: field {key!r} must be a string or number, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        raise EnvError(f"{place}: field {key!r} is empty")
    return text


def read_records(path: str | Path) -> tuple[str, list[tuple[int, Any]]]:
    """The records of a JSON-lines file (numbered by line, from 1) or of a file holding one JSON array
    (numbered by index, from 0), with the unit that numbers them: ``("line" | "record", [(number, record)])``."""
    path = require_file(path)
    with path.open("rb") as f:
        head = f.read(4096).lstrip()
    if head.startswith(b"["):
        data = read_json(path)
        if isinstance(data, list):
            return "record", list(enumerate(data))
    return "line", read_jsonl(path)


def read_jsonl(path: str | Path) -> list[tuple[int, Any]]:
    """``(line number, record)`` of each non-blank line of a JSON-lines file, numbered from 1."""
    path = require_file(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise EnvError(f"{path}: not valid JSON ({err})") from None
    if not any(line.strip() for line in lines):
        raise EnvError(f"{path}: the file is empty")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except json.JSONDecodeError as err:
            raise EnvError(f"{path}: not valid JSON on line {number} ({err})") from None
    return records

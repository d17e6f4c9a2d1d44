"""Which benchmark a data file looks like: a hint for the error raised when a reader is given another
benchmark's file (``envs.registry.load_env``). Only called after a reader has failed; never raises.

The guess comes from the fields of the file's first record, which each official release has:

| benchmark | shape | fields of the first record |
|---|---|---|
| squad | object | ``data``, ``version`` (top level) |
| hotpotqa | list | ``supporting_facts``, ``context``, ``type``/``level`` |
| 2wikimultihopqa | list | ``supporting_facts``, ``context``, ``evidences`` |
| locomo | list | ``sample_id``, ``conversation``, ``qa`` |
| longmemeval | list | ``question_id``, ``haystack_sessions`` |
| musique | JSON lines | ``paragraphs``, ``question_decomposition`` |
| quality | JSON lines | ``article``, ``questions`` (QuALITY) or ``input``, ``instructions``, ``outputs`` (L-Eval) |
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_RULES: tuple[tuple[str, frozenset[str]], ...] = (
    ("2wikimultihopqa", frozenset({"supporting_facts", "context", "evidences"})),
    ("hotpotqa", frozenset({"supporting_facts", "context"})),
    ("locomo", frozenset({"sample_id", "conversation", "qa"})),
    ("longmemeval", frozenset({"question_id", "haystack_sessions"})),
    ("musique", frozenset({"paragraphs", "question_decomposition"})),
    ("quality", frozenset({"article", "questions"})),
    ("quality", frozenset({"input", "instructions", "outputs"})),
)


def _first_record(path: Path) -> Any:
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        line = next((ln for ln in text.splitlines() if ln.strip()), "")
        try:
            return json.loads(line)  # JSON lines: the first record
        except json.JSONDecodeError:
            return None
    if isinstance(data, dict) and {"data", "version"} <= set(data):
        return {"__squad__": True}
    return data[0] if isinstance(data, list) and data else data


def guess_benchmark(path: str | Path) -> str | None:
    """The environment whose official file ``path`` looks like, or None when it cannot tell."""
    try:
        record = _first_record(Path(path))
    except OSError:
        return None
    if not isinstance(record, dict):
        return None
    if record.get("__squad__"):
        return "squad"
    keys = set(record)
    for name, needed in _RULES:
        if needed <= keys:
            return name
    return None

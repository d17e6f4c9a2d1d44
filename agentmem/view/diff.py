"""Word-level diff of two memories (difflib over whitespace-separated words).

Words are compared without their spacing; each part keeps the spacing that followed its words in the text
it came from (the memory after for kept and inserted words, the memory before for deleted ones), so the
rendered diff keeps the memory's line breaks.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Literal

Op = Literal["equal", "insert", "delete"]
_WORD = re.compile(r"(\S+)(\s*)")


@dataclass(frozen=True)
class DiffPart:
    op: Op
    words: tuple[str, ...]
    text: str  # the words with the spacing that followed each


def _words(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in _WORD.finditer(text)]


def _part(op: Op, items: list[tuple[str, str]]) -> DiffPart:
    return DiffPart(op, tuple(w for w, _ in items), "".join(w + s for w, s in items))


def word_diff(before: str, after: str) -> list[DiffPart]:
    """The parts that turn ``before`` into ``after``, in order; a replaced run of words is a delete then an
    insert."""
    a, b = _words(before), _words(after)
    matcher = difflib.SequenceMatcher(a=[w for w, _ in a], b=[w for w, _ in b], autojunk=False)
    parts: list[DiffPart] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            parts.append(_part("equal", b[j1:j2]))
            continue
        if i2 > i1:
            parts.append(_part("delete", a[i1:i2]))
        if j2 > j1:
            parts.append(_part("insert", b[j1:j2]))
    return parts

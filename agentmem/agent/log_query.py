"""The query language of the ``log`` memory policy (PRO-LONG): a strict parser and a search over the log.

A search call's output is one query, on one line (surrounding whitespace is ignored)::

    query    := "DONE" | search
    search   := "SEARCH" mode [ "LIMIT" n ]
    mode     := "regex" "/" pattern "/" [ "i" ]
              | "keywords" word { word }
    word     := letters, digits or "_" (Python's \\w+), not the word LIMIT; at most 16 words
    n        := an integer from 1 to 20; without LIMIT, 3

Tokens are separated by spaces. ``DONE`` ends the searches: the agent answers next. Inside a pattern,
``\\/`` stands for a slash; every other character, backslashes included, is Python ``re`` syntax as
written. The flag ``i`` makes the pattern ignore case. A pattern is at most 200 characters; it runs under
Python ``re`` with no time limit, so a pathological pattern (nested repeats) over a long log can be slow.

Examples::

    SEARCH regex /works for \\w+/ LIMIT 2
    SEARCH regex /zantek/i
    SEARCH keywords Bob mentor LIMIT 5
    DONE

Search semantics (``search``; deterministic, a pure function of the entries and the query):
- ``regex``: the entries where the pattern matches anywhere in the text (``re.search``), in log order;
- ``keywords``: the entries that contain at least one keyword as a whole word, case-insensitively,
  ranked by the number of distinct keywords they contain (most first), ties in log order;
- then the first ``n`` of them.

A malformed query raises ``ParseError``: its message names what was expected, what was found and the
1-based column, e.g. ``column 8: expected regex or keywords, got 'regexp'``. A regular expression that
``re`` rejects is a ``ParseError`` at the column of the fault inside the pattern.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from agentmem.errors import AgentError

DEFAULT_LIMIT = 3
MAX_LIMIT = 20
MAX_KEYWORDS = 16
MAX_PATTERN = 200
_WORD = re.compile(r"\w+")


class ParseError(AgentError):
    """A malformed query. ``column`` is 1-based; ``str(err)`` is ``column C: <what was wrong>``."""

    def __init__(self, column: int, message: str):
        super().__init__(f"column {column}: {message}")
        self.column = column


@dataclass(frozen=True)
class Entry:
    """One log entry: its position in the log (``seq``), what it is (``chunk`` or ``note``) and its text."""

    seq: int
    source: str
    text: str


@dataclass(frozen=True)
class Query:
    """A parsed ``SEARCH``: ``pattern`` (and ``ignore_case``) for regex, ``keywords`` for keywords."""

    mode: Literal["regex", "keywords"]
    limit: int = DEFAULT_LIMIT
    pattern: str = ""
    ignore_case: bool = False
    keywords: tuple[str, ...] = ()


@dataclass(frozen=True)
class Done:
    """``DONE``: no more searches."""


class _Scanner:
    """Space-separated tokens of one line, with their 1-based columns."""

    def __init__(self, text: str):
        self.text, self.pos = text, 0

    @property
    def column(self) -> int:
        return self.pos + 1

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def skip_spaces(self) -> None:
        while not self.at_end() and self.text[self.pos] == " ":
            self.pos += 1

    def peek(self) -> str | None:
        """The next token without consuming it (None at the end)."""
        end = self.text.find(" ", self.pos)
        end = len(self.text) if end < 0 else end
        return None if self.at_end() else self.text[self.pos : end]

    def token(self) -> str | None:
        tok = self.peek()
        if tok is not None:
            self.pos += len(tok)
            self.skip_spaces()
        return tok

    def fail(self, expected: str, got: str | None = None, column: int | None = None) -> ParseError:
        found = "end of query" if got is None else repr(got)
        return ParseError(self.column if column is None else column, f"expected {expected}, got {found}")


def parse_query(text: str) -> Query | Done:
    """The query in ``text`` (one search call's output); ``ParseError`` when it is malformed."""
    text = text.strip()
    for bad in ("\n", "\r", "\t"):
        if bad in text:
            what = "a tab" if bad == "\t" else "a line break"
            raise ParseError(text.index(bad) + 1, f"a query is one line of space-separated tokens; found {what}")
    sc = _Scanner(text)
    col, head = sc.column, sc.token()
    if head == "DONE":
        if not sc.at_end():
            raise sc.fail("end of query after DONE", sc.peek())
        return Done()
    if head != "SEARCH":
        raise sc.fail("SEARCH or DONE", head, col)
    col, mode = sc.column, sc.token()
    if mode == "regex":
        query = _regex(sc)
    elif mode == "keywords":
        query = _keywords(sc)
    else:
        raise sc.fail("regex or keywords", mode, col)
    limit = _limit(sc)
    if not sc.at_end():
        raise sc.fail("end of query", sc.peek())
    return Query(query.mode, limit, query.pattern, query.ignore_case, query.keywords)


def _regex(sc: _Scanner) -> Query:
    if sc.at_end() or sc.text[sc.pos] != "/":
        raise sc.fail("'/' to open the pattern", sc.peek())
    opened = sc.column
    sc.pos += 1
    start, body = sc.pos, []
    while True:
        if sc.at_end():
            raise ParseError(opened, "unterminated pattern: expected a closing '/' for the '/' opened here")
        ch = sc.text[sc.pos]
        if ch == "/":
            break
        if ch == "\\" and sc.pos + 1 < len(sc.text):
            nxt = sc.text[sc.pos + 1]
            body.append("/" if nxt == "/" else ch + nxt)
            sc.pos += 2
            continue
        body.append(ch)
        sc.pos += 1
    pattern = "".join(body)
    if not pattern:
        raise ParseError(start + 1, "expected a pattern between the slashes, got an empty one")
    if len(pattern) > MAX_PATTERN:
        raise ParseError(start + 1, f"a pattern is at most {MAX_PATTERN} characters, got {len(pattern)}")
    sc.pos += 1  # the closing slash
    ignore_case = False
    if not sc.at_end() and sc.text[sc.pos] != " ":
        flag = sc.peek()
        if flag != "i":
            raise sc.fail("the flag 'i', a space or end of query after the closing '/'", flag)
        ignore_case = True
        sc.pos += 1
    sc.skip_spaces()
    try:
        re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        # re reports positions in the unescaped pattern; map back through any "\/" before it
        raw = sc.text[start : start + _raw_offset(sc.text[start:], exc.pos or 0)]
        raise ParseError(start + 1 + len(raw), f"invalid regular expression: {exc.msg}") from None
    return Query("regex", pattern=pattern, ignore_case=ignore_case)


def _raw_offset(raw: str, pos: int) -> int:
    """The offset in the written pattern ``raw`` of position ``pos`` of the unescaped pattern."""
    i = j = 0
    while j < pos and i < len(raw):
        step = 2 if raw[i] == "\\" and i + 1 < len(raw) else 1
        j += 1 if raw[i : i + 2] == "\\/" else step
        i += step
    return i


def _keywords(sc: _Scanner) -> Query:
    words: list[str] = []
    while (tok := sc.peek()) is not None and tok != "LIMIT":
        if not _WORD.fullmatch(tok):
            raise sc.fail("a keyword (letters, digits or _)", tok)
        if len(words) == MAX_KEYWORDS:
            raise ParseError(sc.column, f"at most {MAX_KEYWORDS} keywords; this one is keyword {len(words) + 1}")
        words.append(tok)
        sc.token()
    if not words:
        raise sc.fail("at least one keyword", sc.peek())
    return Query("keywords", keywords=tuple(words))


def _limit(sc: _Scanner) -> int:
    if sc.at_end():
        return DEFAULT_LIMIT
    col, tok = sc.column, sc.token()
    if tok != "LIMIT":
        raise sc.fail("LIMIT or end of query", tok, col)
    col, tok = sc.column, sc.token()
    if tok is None or not tok.isdigit() or not 1 <= int(tok) <= MAX_LIMIT:
        raise sc.fail(f"a number from 1 to {MAX_LIMIT} after LIMIT", tok, col)
    return int(tok)


def search(entries: Sequence[Entry], query: Query) -> list[Entry]:
    """The entries ``query`` finds, best first, at most ``query.limit`` (module docstring)."""
    ordered = sorted(entries, key=lambda e: e.seq)
    if query.mode == "regex":
        rx = re.compile(query.pattern, re.IGNORECASE if query.ignore_case else 0)
        return [e for e in ordered if rx.search(e.text)][: query.limit]
    wanted = {w.lower() for w in query.keywords}
    scored = []
    for e in ordered:
        hits = len(wanted & set(_WORD.findall(e.text.lower())))
        if hits:
            scored.append((-hits, e.seq, e))
    return [e for _, _, e in sorted(scored, key=lambda t: t[:2])][: query.limit]


def keyword_words(text: str) -> list[str]:
    """The distinct words of ``text`` (case-insensitive, first occurrence kept, not ``LIMIT``), at most
    ``MAX_KEYWORDS``: an entry holding ``text`` contains every one, so a query for them ranks it first."""
    seen: dict[str, str] = {}
    for word in _WORD.findall(text):
        seen.setdefault(word.lower(), word)
    return [w for w in seen.values() if w != "LIMIT"][:MAX_KEYWORDS]


def keyword_query(words: Sequence[str], limit: int) -> str:
    """The query text ``SEARCH keywords <words> LIMIT <limit>``."""
    return f"SEARCH keywords {' '.join(words)} LIMIT {limit}"

"""Packing a context's units (sentences, paragraphs, dialogue turns) into chunks of a token budget.

Invariants:
- every chunk satisfies ``count_tokens(chunk.text) <= budget``, counted on the exact text the agent will
  read, header included; tokenisers are not additive, so joined text is counted, never a sum of parts;
- units keep their order and are filled greedily; a unit goes whole into one chunk unless it alone is
  over the budget, and then it is split on words (a word over the budget on characters);
- ``Chunk.units`` lists the indices of the units the chunk holds whole or in part, so callers can map
  evidence units to chunk indices;
- no chunk is empty; blank units are skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from envs.errors import EnvError


@dataclass(frozen=True)
class Unit:
    """A piece of context that is kept whole when it fits; ``sep`` joins it to the unit before it."""

    text: str
    sep: str = " "


@dataclass(frozen=True)
class Chunk:
    text: str
    units: tuple[int, ...]


def pack(
    units: Sequence[Unit], count_tokens: Callable[[str], int], budget: int, *, header: str = ""
) -> list[Chunk]:
    """Greedily fill chunks of at most ``budget`` tokens; each chunk starts with ``header`` (if any)."""
    packer = _Packer(count_tokens, budget, header)
    for index, unit in enumerate(units):
        packer.add(index, unit)
    return packer.finish()


def chunk_indices(chunks: Sequence[Chunk], unit_ids: set[int]) -> list[int]:
    """Sorted indices of the chunks holding any of ``unit_ids``."""
    return [i for i, chunk in enumerate(chunks) if unit_ids.intersection(chunk.units)]


def last_chunk_of(chunks: Sequence[Chunk], unit_id: int) -> int:
    """Index of the last chunk holding (part of) unit ``unit_id``: where a reader has read all of it."""
    found = [i for i, chunk in enumerate(chunks) if unit_id in chunk.units]
    if not found:
        raise EnvError(f"unit {unit_id} is in no chunk (a blank unit?)")
    return found[-1]


class _Packer:
    def __init__(self, count_tokens: Callable[[str], int], budget: int, header: str) -> None:
        self._count = count_tokens
        self._budget = budget
        self._header = header
        self._parts: list[tuple[str, str]] = []  # (separator, text) of the chunk being filled
        self._ids: list[int] = []
        self._done: list[Chunk] = []

    def _render(self, parts: Sequence[tuple[str, str]]) -> str:
        body = parts[0][1] + "".join(sep + text for sep, text in parts[1:])
        return f"{self._header}\n{body}" if self._header else body

    def _fits(self, parts: Sequence[tuple[str, str]]) -> bool:
        return self._count(self._render(parts)) <= self._budget

    def _fits_text(self, text: str) -> bool:
        return self._fits([("", text)])

    def _flush(self) -> None:
        if self._parts:
            self._done.append(Chunk(self._render(self._parts), tuple(self._ids)))
        self._parts, self._ids = [], []

    def add(self, index: int, unit: Unit) -> None:
        text = unit.text.strip()
        if not text:
            return
        candidate = [*self._parts, (unit.sep, text)]
        if self._fits(candidate):
            self._parts, self._ids = candidate, [*self._ids, index]
            return
        self._flush()
        if self._fits_text(text):
            self._parts, self._ids = [("", text)], [index]
            return
        pieces = self._split_words(text)
        for piece in pieces[:-1]:
            self._done.append(Chunk(self._render([("", piece)]), (index,)))
        self._parts, self._ids = [("", pieces[-1])], [index]

    def finish(self) -> list[Chunk]:
        self._flush()
        return self._done

    def _split_words(self, text: str) -> list[str]:
        words = text.split()
        pieces: list[str] = []
        start = 0
        while start < len(words):
            if not self._fits_text(words[start]):
                pieces.extend(self._split_chars(words[start]))
                start += 1
                continue
            take = self._longest_fitting(len(words) - start, lambda k, s=start: " ".join(words[s : s + k]))
            pieces.append(" ".join(words[start : start + take]))
            start += take
        return pieces

    def _split_chars(self, word: str) -> list[str]:
        pieces: list[str] = []
        start = 0
        while start < len(word):
            if not self._fits_text(word[start]):
                raise EnvError(
                    f"chunk_tokens={self._budget} leaves no room for {word[start]!r} "
                    f"after the header {self._header!r}"
                )
            take = self._longest_fitting(len(word) - start, lambda k, s=start: word[s : s + k])
            pieces.append(word[start : start + take])
            start += take
        return pieces

    def _longest_fitting(self, limit: int, text_of: Callable[[int], str]) -> int:
        """Largest k in [1, limit] whose text fits, by bisection; k=1 is known to fit."""
        lo, hi = 1, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._fits_text(text_of(mid)):
                lo = mid
            else:
                hi = mid - 1
        return lo

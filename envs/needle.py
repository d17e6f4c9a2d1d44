"""Needles in a long text, in the style of BABILong: this project's own generator, not the benchmark.

BABILong (Kuratov et al., 2024) hides the sentences of bAbI tasks in PG-19 books. This module writes
bAbI-like stories from a seed, in the words of three bAbI tasks, and hides them in any long plain-text
file (``data_path``, the filler):

- ``qa1`` (single supporting fact): people move between rooms ("Mary moved to the bathroom."); "Where is
  Mary?" is answered by her last move;
- ``qa2`` (two supporting facts): someone picks up an object and then moves; "Where is the football?" is
  answered by the pick-up and the holder's last move;
- ``qa4`` (two-argument relations): "The kitchen is north of the garden."; "What is north of the
  garden?" (kitchen) or "What is the kitchen north of?" (garden).

The filler is the file's text cut into sentences (at ., ! or ? before white space); a task reads them in
order from a seeded starting sentence, cycling to the file's start when it runs out, until the story
and filler together reach ``context_tokens`` (4K to 1M); the story's sentences go, in story order, into
seeded gaps between filler sentences. Sizes are sums of per-sentence counts (each filler sentence is
counted once per environment), so a long context is cheap to size.

Invariants: ``task`` is ``qa1``, ``qa2`` or ``qa4`` and ``num_tasks`` tasks exist; task ``i`` is a pure
function of (seed, ``i``, knobs, filler); its total size is at most ``context_tokens`` (unless the story
alone is over it) and within one filler sentence of it; every story sentence is in the context, in story
order; the question has one right answer, a single word; ``evidence`` and ``facts`` are the supporting
facts in story order (``facts`` with the last chunk holding each), ``evidence_chunks`` their chunks;
``category`` is the task name. A filler file with no sentence is an ``EnvError``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from agentmem.records import Fact, Task
from envs.base import TaskSource, TokensOnce
from envs.chunking import Unit, chunk_indices, last_chunk_of, pack
from envs.errors import EnvError, check_int
from envs.selection import task_rng
from envs.types import CountTokens

TASKS = ("qa1", "qa2", "qa4")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_PEOPLE = ("Mary", "John", "Sandra", "Daniel")
_PLACES = ("bathroom", "hallway", "garden", "office", "kitchen", "bedroom")
_OBJECTS = ("football", "apple", "milk")
_MOVES = ("moved to", "went to", "journeyed to", "travelled to", "went back to")
_TAKES = ("picked up", "got", "grabbed", "took")
_DIRECTIONS = ("north", "south", "east", "west")

# a story: its sentences, the indices of the supporting ones, the question and its one-word answer
Story = tuple[list[str], list[int], str, str]


def _pick(rng: np.random.Generator, items: tuple[str, ...] | list[str]) -> str:
    return items[int(rng.integers(len(items)))]


def _moves(rng: np.random.Generator, people: list[str], count: int) -> list[tuple[str, str, str]]:
    """``count`` random moves (person, place, sentence), nobody moving to where they already are."""
    where: dict[str, str] = {}
    out = []
    for _ in range(count):
        person = _pick(rng, people)
        place = _pick(rng, [p for p in _PLACES if p != where.get(person)])
        where[person] = place
        out.append((person, place, f"{person} {_pick(rng, _MOVES)} the {place}."))
    return out


def qa1(rng: np.random.Generator) -> Story:
    people = [str(p) for p in rng.permutation(_PEOPLE)[: int(rng.integers(2, 5))]]
    moves = _moves(rng, people, int(rng.integers(3, 7)))
    person = moves[int(rng.integers(len(moves)))][0]
    last = max(i for i, (who, _, _) in enumerate(moves) if who == person)
    return [s for _, _, s in moves], [last], f"Where is {person}?", moves[last][1]


def qa2(rng: np.random.Generator) -> Story:
    people = [str(p) for p in rng.permutation(_PEOPLE)[: int(rng.integers(2, 5))]]
    holder, others = people[0], people[1:]
    thing = _pick(rng, _OBJECTS)
    before = [s for _, _, s in _moves(rng, people, int(rng.integers(1, 3)))]
    after = _moves(rng, others, int(rng.integers(0, 3))) + _moves(rng, [holder], int(rng.integers(1, 3)))
    after = [after[j] for j in rng.permutation(len(after))]
    sentences = [*before, f"{holder} {_pick(rng, _TAKES)} the {thing}.", *(s for _, _, s in after)]
    last = max(i for i, (who, _, _) in enumerate(after) if who == holder)
    return sentences, [len(before), len(before) + 1 + last], f"Where is the {thing}?", after[last][1]


def qa4(rng: np.random.Generator) -> Story:
    a, b, c = (str(p) for p in rng.choice(_PLACES, size=3, replace=False))
    relations = [(a, _pick(rng, _DIRECTIONS), b), (c, _pick(rng, _DIRECTIONS), a)]  # each "of the" differs
    if rng.integers(2):
        relations.reverse()
    asked = int(rng.integers(2))
    subject, direction, reference = relations[asked]
    if rng.integers(2):
        question, answer = f"What is {direction} of the {reference}?", subject
    else:
        question, answer = f"What is the {subject} {direction} of?", reference
    return [f"The {s} is {d} of the {r}." for s, d, r in relations], [asked], question, answer


_GENERATORS: dict[str, Callable[[np.random.Generator], Story]] = {"qa1": qa1, "qa2": qa2, "qa4": qa4}


class NeedleEnv(TaskSource):
    name = "needle"

    def __init__(
        self,
        *,
        data_path: str | Path,
        count_tokens: CountTokens,
        chunk_tokens: int,
        seed: int,
        task: str = "qa1",
        context_tokens: int = 4096,
        num_tasks: int = 100,
    ) -> None:
        if task not in TASKS:
            raise EnvError(f"{self.name}: knob task must be one of {', '.join(TASKS)}, got {task!r}")
        check_int(f"{self.name}: knob context_tokens", context_tokens, 1)
        check_int(f"{self.name}: knob num_tasks", num_tasks, 1)
        super().__init__(count_tokens=count_tokens, chunk_tokens=chunk_tokens, seed=seed)
        self._task = task
        self._context_tokens = context_tokens
        self._num_tasks = num_tasks
        self._filler = _read_filler(Path(data_path))
        # at least 1 a sentence: the fill loop ends
        self._tokens = TokensOnce(lambda text: max(1, count_tokens(text)), lambda j: self._filler[j])

    def _size(self) -> int:
        return self._num_tasks

    def _build(self, index: int) -> Task:
        rng = task_rng(self._seed, index)
        story, support, question, answer = _GENERATORS[self._task](rng)
        start = int(rng.integers(len(self._filler)))
        filler: list[int] = []
        total = sum(self._count(s) for s in story)
        while total + self._tokens((start + len(filler)) % len(self._filler)) <= self._context_tokens:
            total += self._tokens((start + len(filler)) % len(self._filler))
            filler.append((start + len(filler)) % len(self._filler))
        gaps = np.sort(rng.integers(0, len(filler) + 1, size=len(story))).tolist()
        units: list[Unit] = []
        unit_of: list[int] = []  # story sentence -> unit index
        for gap in range(len(filler) + 1):
            for k in (k for k, g in enumerate(gaps) if g == gap):
                unit_of.append(len(units))
                units.append(Unit(story[k]))
            if gap < len(filler):
                units.append(Unit(self._filler[filler[gap]]))
        chunks = pack(units, self._count, self._chunk_tokens)
        return Task(
            task_id=f"{self._task}-{index}",
            env=self.name,
            question=question,
            chunks=[c.text for c in chunks],
            answers=[answer],
            evidence=[story[k] for k in support],
            evidence_chunks=chunk_indices(chunks, {unit_of[k] for k in support}),
            facts=[Fact(text=story[k], chunk=last_chunk_of(chunks, unit_of[k])) for k in support],
            category=self._task,
            metadata={"story": story, "gaps": gaps, "filler_start": start, "filler_sentences": len(filler)},
        )


def _read_filler(path: Path) -> list[str]:
    if not path.is_file():
        raise EnvError(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise EnvError(f"{path}: not UTF-8 text ({err})") from None
    sentences = [s for s in _SENTENCE_END.split(" ".join(text.split())) if s]
    if not sentences:
        raise EnvError(f"{path}: no filler sentences (the file is empty)")
    return sentences

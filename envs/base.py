"""The shell the built-in environments share: the three arguments every one takes, the seeded task
order, the default score and a token count kept per item.

An environment subclasses ``TaskSource``, sets ``name``, passes ``count_tokens``, ``chunk_tokens`` and
``seed`` to ``super().__init__`` (its own keyword arguments stay in its signature: they are its knobs,
``envs.registry``), and defines ``_build(index)``, the task at ``index`` of its source. ``tasks(n)``
builds the first ``n`` of the seeded order over ``_size()`` items (``envs.selection``: ``tasks(k)`` is a
prefix of ``tasks(n)``); ``_size`` is ``len(self._questions)`` unless the environment generates its
tasks. ``score`` is HotpotQA's answer F1 / EM / substring EM, best over the gold answers, unless the
environment scores its own way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from agentmem.records import Task
from envs.metrics import Scores, score_answer
from envs.selection import take
from envs.types import CountTokens


class TaskSource(ABC):
    name: str
    _questions: Sequence[Any]

    def __init__(self, *, count_tokens: CountTokens, chunk_tokens: int, seed: int) -> None:
        self._count = count_tokens
        self._chunk_tokens = chunk_tokens
        self._seed = seed

    def tasks(self, n: int | None = None) -> list[Task]:
        return [self._build(i) for i in take(self._size(), n, self._seed)]

    def score(self, prediction: str, task: Task) -> Scores:
        return score_answer(prediction, task.answers)

    def _size(self) -> int:
        """How many tasks the source holds (the seeded order is a permutation of their indices)."""
        return len(self._questions)

    @abstractmethod
    def _build(self, index: int) -> Task:
        """Task ``index`` of the source: a pure function of the index, the seed and the knobs."""


class TokensOnce:
    """``count(text_of(key))``, counted on the first call for each ``key`` (contexts are sized from many
    per-item counts, and an item is drawn into many tasks)."""

    def __init__(self, count: CountTokens, text_of: Callable[[int], str]) -> None:
        self._count = count
        self._text_of = text_of
        self._known: dict[int, int] = {}

    def __call__(self, key: int) -> int:
        if key not in self._known:
            self._known[key] = self._count(self._text_of(key))
        return self._known[key]

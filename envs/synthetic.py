"""The built-in environment: seeded, deterministic long-context multi-hop questions, no data file.

Each task invents entities (people, companies, cities, countries) with short made-up names, states a
chain of ``hops`` facts leading from the question's subject to the answer, adds ``distractors`` other
chains of the same length about other entities, and scatters all fact sentences at random positions
through entity-free filler sentences until the context reaches about ``context_tokens`` tokens.

Invariants:
- task ``i`` is a pure function of (seed, i, knobs, count_tokens, chunk_tokens);
- entity names are distinct within a task, so the answer is unambiguous; filler names no entity;
- ``evidence`` holds the chain's fact sentences in chain order, ``metadata["evidence_sentences"]`` their
  sentence positions in the context, and ``evidence_chunks`` the chunks that hold them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentmem.records import Task
from envs.chunking import Unit, chunk_indices, pack
from envs.errors import EnvError, check_int
from envs.metrics import Scores, score_answer
from envs.selection import take, task_rng
from envs.types import CountTokens

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_SUFFIXES = {
    "person": ("",),
    "company": ("tek", "corp", "dyne", "soft"),
    "city": ("ton", "burg", "port", "ville"),
    "country": ("land", "stan", "ia"),
}


@dataclass(frozen=True)
class _Template:
    kinds: tuple[str, ...]  # entity kinds along the chain: subject, then one per hop
    facts: tuple[str, ...]  # fact i links entity i and entity i+1: {0} and {1}
    questions: tuple[str, ...]  # question for 1, 2, 3 hops, about the subject {0}


_TEMPLATES = (
    _Template(
        kinds=("person", "company", "city", "country"),
        facts=("{0} works for {1}.", "{0} is headquartered in {1}.", "{0} is a city in {1}."),
        questions=(
            "Which company does {0} work for?",
            "In which city is the company that {0} works for headquartered?",
            "In which country is the city where the company that {0} works for is headquartered?",
        ),
    ),
    _Template(
        kinds=("person", "person", "city", "country"),
        facts=("{1} is the mentor of {0}.", "{0} was born in {1}.", "{0} is a city in {1}."),
        questions=(
            "Who is the mentor of {0}?",
            "In which city was the mentor of {0} born?",
            "In which country was the mentor of {0} born?",
        ),
    ),
)

_FILLER = (
    ("The", "A quiet", "An old", "The small", "The busy"),
    ("market", "river", "library", "garden", "bridge", "festival", "train", "museum", "bakery"),
    ("opened", "grew", "stayed calm", "was repaired", "drew visitors", "closed early", "was busy"),
    ("in the morning", "last spring", "after the rain", "during the week", "at dusk", "every summer"),
)


class SyntheticEnv:
    name = "synthetic"

    def __init__(
        self,
        *,
        count_tokens: CountTokens,
        chunk_tokens: int,
        seed: int,
        context_tokens: int = 1024,
        hops: int = 2,
        distractors: int = 4,
        num_tasks: int = 1000,
    ) -> None:
        for knob, value, low in (
            ("context_tokens", context_tokens, 1),
            ("distractors", distractors, 0),
            ("num_tasks", num_tasks, 1),
        ):
            check_int(f"synthetic: knob {knob}", value, low)
        if hops not in (1, 2, 3) or isinstance(hops, bool):
            raise EnvError(f"synthetic: knob hops must be 1, 2 or 3, got {hops!r}")
        self._count = count_tokens
        self._chunk_tokens = chunk_tokens
        self._seed = seed
        self._context_tokens = context_tokens
        self._hops = hops
        self._distractors = distractors
        self._num_tasks = num_tasks

    def tasks(self, n: int | None = None) -> list[Task]:
        return [self._build(i) for i in take(self._num_tasks, n, self._seed)]

    def score(self, prediction: str, task: Task) -> Scores:
        return score_answer(prediction, task.answers)

    def _build(self, index: int) -> Task:
        rng = task_rng(self._seed, index)
        used: set[str] = set()
        template = _TEMPLATES[int(rng.integers(len(_TEMPLATES)))]
        chain = _chain(rng, template, self._hops, used)
        evidence = [template.facts[h].format(chain[h], chain[h + 1]) for h in range(self._hops)]
        distractor_facts = []
        for _ in range(self._distractors):
            other = _TEMPLATES[int(rng.integers(len(_TEMPLATES)))]
            names = _chain(rng, other, self._hops, used)
            distractor_facts += [other.facts[h].format(names[h], names[h + 1]) for h in range(self._hops)]
        sentences, positions = self._scatter(rng, evidence + distractor_facts)
        chunks = pack([Unit(s) for s in sentences], self._count, self._chunk_tokens)
        evidence_positions = positions[: self._hops]
        return Task(
            task_id=f"synthetic-{self._seed}-{index}",
            env=self.name,
            question=template.questions[self._hops - 1].format(chain[0]),
            chunks=[c.text for c in chunks],
            answers=[chain[self._hops]],
            evidence=evidence,
            evidence_chunks=chunk_indices(chunks, set(evidence_positions)),
            category=f"{self._hops}-hop",
            metadata={"evidence_sentences": evidence_positions, "seed": self._seed, "index": index},
        )

    def _scatter(self, rng: np.random.Generator, facts: list[str]) -> tuple[list[str], list[int]]:
        """Filler up to the token target with ``facts`` at random positions; returns each fact's position."""
        budget = self._context_tokens - sum(self._count(f) for f in facts)
        filler: list[str] = []
        while budget > 0:
            sentence = " ".join(str(rng.choice(words)) for words in _FILLER) + "."
            filler.append(sentence)
            budget -= self._count(sentence)
        total = len(filler) + len(facts)
        slots = rng.choice(total, size=len(facts), replace=False)
        sentences: list[str | None] = [None] * total
        for fact, slot in zip(facts, slots, strict=True):
            sentences[int(slot)] = fact
        rest = iter(filler)
        filled = [s if s is not None else next(rest) for s in sentences]
        return filled, [int(s) for s in slots]


def _chain(rng: np.random.Generator, template: _Template, hops: int, used: set[str]) -> list[str]:
    return [_new_name(rng, kind, used) for kind in template.kinds[: hops + 1]]


def _new_name(rng: np.random.Generator, kind: str, used: set[str]) -> str:
    while True:
        stem = "".join(str(rng.choice(list(alphabet))) for alphabet in (_CONSONANTS, _VOWELS) * 2)
        name = (stem + str(rng.choice(_SUFFIXES[kind]))).capitalize()
        if name not in used:
            used.add(name)
            return name

"""The built-in environment: seeded, deterministic long-context multi-hop questions, no data file.

Each task invents entities (people, companies, cities, countries) with short made-up names, states a
chain of ``hops`` facts leading from the question's subject to the answer, adds ``distractors`` other
chains of the same length about other entities, and scatters all fact sentences at random positions
through entity-free filler sentences until the context reaches about ``context_tokens`` tokens.

Invariants:
- task ``i`` is a pure function of (seed, i, knobs, count_tokens, chunk_tokens);
- entity names are distinct within a task, so the answer is unambiguous; filler names no entity;
- ``evidence`` holds the chain's fact sentences in chain order, ``metadata["evidence_sentences"]`` their
  sentence positions in the context, and ``evidence_chunks`` the chunks that hold them; ``facts`` the same
  sentences in reading order, each with the chunk where it ends.

Name splits: ``names=train`` keeps only names whose stem (the four letters before the kind's suffix) falls
in one half of a fixed hash of stems (``name_split``), ``names=heldout`` only the other half, so a held-out
set shares no name, not even a stem, with any training set, whatever the seeds (``names=any``, the default,
keeps every name). Both halves draw from the same letters: an earlier split by first letter (b-m against
n-z) was a shift of its own, since a model fine-tuned on one set of initials wrote `(empty)` after evidence
on 0.93 of its held-out level-2 updates against 0.31 on the same tasks with training-letter names. A
benchmark that trains on ``train`` and evaluates on ``heldout`` can never score a memorised name.

Question forms (``forms``): ``entity`` (the default) asks for the chain's last entity. ``yesno`` asks
whether the chain ends at a named entity (the true one, or a name of the same kind that no fact states: answers
``yes``/``no``); ``number`` ends the chain with a fact that states a number about its last entity and asks for
it (distractor chains end with numbers of their own); ``mixed`` draws one of the three per task. Real text asks
yes/no and number questions; the default keeps every existing seed's tasks as they were.

The task ladder: ``level`` (0..4, ``LEVELS``) names a difficulty, from one fact in one short chunk (level
0) to three hops among many distractors over a long context (level 4). A level sets ``context_tokens``,
``hops`` and ``distractors``; a knob given explicitly beside it wins. The chunk counts in ``LEVELS`` are
those at 128-token chunks (``--chunk-tokens 128``), the ladder's reference set-up.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from agentmem.records import Fact, Task
from envs.base import TaskSource
from envs.chunking import Unit, chunk_indices, last_chunk_of, pack
from envs.errors import EnvError, check_int
from envs.selection import task_rng
from envs.types import CountTokens

_CONSONANTS = "bdfgklmnprstvz"
NAME_SPLITS = ("any", "train", "heldout")


def name_split(stem: str) -> str:
    """``train`` or ``heldout``: the half a name's stem belongs to (a stable hash, the same on every machine)."""
    return ("train", "heldout")[zlib.crc32(stem.lower().encode()) % 2]
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

# yes/no questions per template and hop count: is {x} where the chain ends?
_YESNO = (
    ("Does {0} work for {x}?", "Is the company that {0} works for headquartered in {x}?",
     "Is the city where the company that {0} works for is headquartered in {x}?"),
    ("Is {x} the mentor of {0}?", "Was the mentor of {0} born in {x}?", "Was the mentor of {0} born in a city in {x}?"),
)
# number chains per hop count: the entity kinds, the facts (the last states {n} about entity hops - 1) and the question
_NUMBER = {
    1: (("person",), ("{0} is {n} years old.",), "How old is {0}?"),
    2: (("person", "company"), ("{0} works for {1}.", "{0} has {n} employees."),
        "How many employees does the company that {0} works for have?"),
    3: (("person", "company", "city"), ("{0} works for {1}.", "{0} is headquartered in {1}.", "{0} has {n} bridges."),
        "How many bridges does the city where the company that {0} works for is headquartered have?"),
}
FORMS = ("entity", "yesno", "number", "mixed")

_FILLER = (
    ("The", "A quiet", "An old", "The small", "The busy"),
    ("market", "river", "library", "garden", "bridge", "festival", "train", "museum", "bakery"),
    ("opened", "grew", "stayed calm", "was repaired", "drew visitors", "closed early", "was busy"),
    ("in the morning", "last spring", "after the rain", "during the week", "at dusk", "every summer"),
)


@dataclass(frozen=True)
class Level:
    context_tokens: int
    hops: int
    distractors: int
    about: str  # one line for the docs


LEVELS: dict[int, Level] = {
    0: Level(1, 1, 0, "one fact alone in one short chunk: no filler, no distractor"),
    1: Level(160, 1, 1, "one fact, one distractor fact, 2 chunks"),
    2: Level(384, 1, 3, "one fact among 3 distractor facts, about 4 chunks"),
    3: Level(640, 2, 3, "two hops, 3 distractor chains, about 6 chunks"),
    4: Level(1024, 3, 4, "three hops, 4 distractor chains, about 9 chunks"),
}
_DEFAULT = Level(1024, 2, 4, "the default without a level")


class SyntheticEnv(TaskSource):
    name = "synthetic"

    def __init__(
        self,
        *,
        count_tokens: CountTokens,
        chunk_tokens: int,
        seed: int,
        level: int | None = None,
        context_tokens: int | None = None,
        hops: int | None = None,
        distractors: int | None = None,
        num_tasks: int = 1000,
        names: str = "any",
        forms: str = "entity",
    ) -> None:
        if level is not None and (isinstance(level, bool) or level not in LEVELS):
            raise EnvError(f"synthetic: knob level must be one of {', '.join(map(str, LEVELS))}, got {level!r}")
        base = LEVELS[level] if level is not None else _DEFAULT
        context_tokens = base.context_tokens if context_tokens is None else context_tokens
        hops = base.hops if hops is None else hops
        distractors = base.distractors if distractors is None else distractors
        for knob, value, low in (
            ("context_tokens", context_tokens, 1),
            ("distractors", distractors, 0),
            ("num_tasks", num_tasks, 1),
        ):
            check_int(f"synthetic: knob {knob}", value, low)
        if names not in NAME_SPLITS:
            raise EnvError(f"synthetic: knob names must be one of {', '.join(NAME_SPLITS)}, got {names!r}")
        self._names = names
        if forms not in FORMS:
            raise EnvError(f"synthetic: knob forms must be one of {', '.join(FORMS)}, got {forms!r}")
        self._forms = forms
        if hops not in (1, 2, 3) or isinstance(hops, bool):
            raise EnvError(f"synthetic: knob hops must be 1, 2 or 3, got {hops!r}")
        super().__init__(count_tokens=count_tokens, chunk_tokens=chunk_tokens, seed=seed)
        self._context_tokens = context_tokens
        self._hops = hops
        self._distractors = distractors
        self._num_tasks = num_tasks

    def _size(self) -> int:
        return self._num_tasks

    def _build(self, index: int) -> Task:
        rng = task_rng(self._seed, index)
        used: set[str] = set()
        form = self._forms if self._forms != "mixed" else ("entity", "yesno", "number")[int(rng.integers(3))]
        if form == "number":
            chain, evidence, question, answer = self._number_chain(rng, used)
            distractor_facts = [f for _ in range(self._distractors) for f in self._number_chain(rng, used)[1]]
        else:
            pick = int(rng.integers(len(_TEMPLATES)))
            template = _TEMPLATES[pick]
            chain = _chain(rng, template, self._hops, used, self._names)
            evidence = [template.facts[h].format(chain[h], chain[h + 1]) for h in range(self._hops)]
            question, answer = template.questions[self._hops - 1].format(chain[0]), chain[self._hops]
            if form == "yesno":  # the true end of the chain, or a name of its kind that no fact states
                yes = bool(rng.integers(2))
                named = chain[self._hops] if yes else _new_name(rng, template.kinds[self._hops], used, self._names)
                question = _YESNO[pick][self._hops - 1].format(chain[0], x=named)
                answer = "yes" if yes else "no"
            distractor_facts = []
            for _ in range(self._distractors):
                other = _TEMPLATES[int(rng.integers(len(_TEMPLATES)))]
                names = _chain(rng, other, self._hops, used, self._names)
                distractor_facts += [other.facts[h].format(names[h], names[h + 1]) for h in range(self._hops)]
        sentences, positions = self._scatter(rng, evidence + distractor_facts)
        chunks = pack([Unit(s) for s in sentences], self._count, self._chunk_tokens)
        evidence_positions = positions[: self._hops]
        facts = sorted((last_chunk_of(chunks, p), p, sentences[p]) for p in evidence_positions)
        return Task(
            task_id=f"synthetic-{self._seed}-{index}",
            env=self.name,
            question=question,
            chunks=[c.text for c in chunks],
            answers=[answer],
            evidence=evidence,
            evidence_chunks=chunk_indices(chunks, set(evidence_positions)),
            facts=[Fact(text=text, chunk=chunk) for chunk, _, text in facts],
            category=f"{self._hops}-hop" if form == "entity" else f"{self._hops}-hop {form}",
            metadata={"evidence_sentences": evidence_positions, "seed": self._seed, "index": index},
        )

    def _number_chain(self, rng: np.random.Generator, used: set[str]) -> tuple[list[str], list[str], str, str]:
        """A chain that ends in a number: its names, its facts, the question about its subject and the number."""
        kinds, facts, question = _NUMBER[self._hops]
        names = [_new_name(rng, kind, used, self._names) for kind in kinds]
        n = str(int(rng.integers(12, 100)))
        evidence = [f.format(*names[h : h + 2]) for h, f in enumerate(facts[:-1])]
        evidence.append(facts[-1].format(names[-1], n=n))
        return names, evidence, question.format(names[0]), n

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


def _chain(rng: np.random.Generator, template: _Template, hops: int, used: set[str],
           names: str = "any") -> list[str]:
    return [_new_name(rng, kind, used, names) for kind in template.kinds[: hops + 1]]


def _new_name(rng: np.random.Generator, kind: str, used: set[str], names: str = "any") -> str:
    while True:
        stem = "".join(str(rng.choice(list(alphabet))) for alphabet in (_CONSONANTS, _VOWELS, _CONSONANTS, _VOWELS))
        name = (stem + str(rng.choice(_SUFFIXES[kind]))).capitalize()
        if names != "any" and name_split(stem) != names:
            continue
        if name not in used:
            used.add(name)
            return name

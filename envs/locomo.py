"""LoCoMo (the official ``locomo10.json`` layout: a list of ``{sample_id, conversation, qa, ...}``).

A conversation's sessions, in session-number order (which is date order), become the chunks: one session
per chunk, split on turns when it is over the budget, each chunk starting with the session's number and
date. A turn reads ``speaker: text`` plus ``[shares <caption>]`` when it shared an image. Every question
of a conversation reads the same chunks.

Invariants: the file is fully checked when the environment is built; ``category`` is ``str(category)``;
category 5 (adversarial) has the gold answer "Not mentioned in the conversation" whatever the file
stores (its ``answer`` or ``adversarial_answer`` is kept in ``metadata``); ``evidence`` holds the dia ids
as the file has them and ``evidence_chunks`` the chunks holding the turns they name (ids that name no
turn are kept in ``evidence`` but map to no chunk); ``facts`` those turns as the chunks render them, in
reading order, each with the last chunk holding it. Dia ids are compared by number, so ``D30:05`` names
turn ``D30:5``. ``score`` uses LoCoMo's rules for the question's
category for F1, with the official Porter stemming by default (knob ``stem=False``: the unstemmed
variant; see ``envs.metrics``), and for category 5 all three scores are 1 exactly when the prediction
says the answer is not mentioned.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmem.records import Fact, Task
from envs.base import TaskSource
from envs.chunking import Chunk, Unit, pack
from envs.errors import EnvError
from envs.files import answer_text, field, need_list, read_json, where
from envs.metrics import (
    LOCOMO_NOT_MENTIONED,
    Scores,
    exact_match,
    locomo_f1,
    locomo_gold,
    locomo_says_not_mentioned,
    porter_stem,
    substring_match,
)
from envs.types import CountTokens

_SESSION = re.compile(r"session_(\d+)")
_DIA_ID = re.compile(r"D(\d+):(\d+)")


@dataclass(frozen=True)
class _Session:
    number: int
    date: str
    turns: tuple[tuple[str, str], ...]  # (dia_id, rendered text)


@dataclass(frozen=True)
class _Turn:
    order: int  # position in the conversation's reading order
    text: str  # as the chunk renders it
    chunks: tuple[int, ...]  # the chunks holding it (more than one when it was split)


DiaKey = tuple[int, int] | str


def _dia_key(dia_id: str) -> DiaKey:
    """A turn's id by number (``D30:05`` and ``D30:5`` are one turn); an id of another shape as it is."""
    match = _DIA_ID.fullmatch(dia_id.strip())
    return (int(match.group(1)), int(match.group(2))) if match else dia_id


@dataclass(frozen=True)
class _Question:
    conversation: int
    index: int
    question: str
    answer: str
    category: str
    evidence: tuple[str, ...]
    raw: dict[str, Any]


class LocomoEnv(TaskSource):
    name = "locomo"

    def __init__(
        self,
        *,
        data_path: str | Path,
        count_tokens: CountTokens,
        chunk_tokens: int,
        seed: int,
        categories: Iterable[int | str] | None = None,
        stem: bool = True,
    ) -> None:
        if not isinstance(stem, bool):
            raise EnvError(f"{self.name}: knob stem must be true or false, got {stem!r}")
        self._stem = porter_stem if stem else None
        super().__init__(count_tokens=count_tokens, chunk_tokens=chunk_tokens, seed=seed)
        self._sample_ids: list[str] = []
        self._sessions: list[list[_Session]] = []
        questions = self._read(Path(data_path))
        if categories is not None:
            if isinstance(categories, (str, int)):
                categories = [categories]
            wanted = {str(c) for c in categories}
            questions = [q for q in questions if q.category in wanted]
        self._questions = questions
        self._chunks: dict[int, tuple[list[Chunk], dict[DiaKey, _Turn]]] = {}

    def score(self, prediction: str, task: Task) -> Scores:
        category = task.category or ""
        if category == "5":
            hit = float(locomo_says_not_mentioned(prediction))
            return Scores(f1=hit, em=hit, sub_em=hit)
        gold = locomo_gold(task.answers[0], category)
        return Scores(
            f1=locomo_f1(prediction, gold, category, self._stem),
            em=exact_match(prediction, gold),
            sub_em=substring_match(prediction, gold),
        )

    def _read(self, path: Path) -> list[_Question]:
        questions = []
        for c, record in enumerate(need_list(read_json(path), f"{path}: top level")):
            place = where(path, c, record, "sample_id")
            self._sample_ids.append(field(record, "sample_id", str, place))
            self._sessions.append(_read_sessions(field(record, "conversation", dict, place), place))
            for k, qa in enumerate(field(record, "qa", list, place)):
                questions.append(_read_question(qa, c, k, f"{place} qa[{k}]"))
        return questions

    def _conversation(self, c: int) -> tuple[list[Chunk], dict[DiaKey, _Turn]]:
        """The conversation's chunks and its turns by dia id (the first turn of an id that repeats)."""
        if c not in self._chunks:
            chunks: list[Chunk] = []
            held: dict[tuple[int, int], list[int]] = {}  # (session, turn) -> chunk indices
            for s, session in enumerate(self._sessions[c]):
                header = f"Session {session.number}, {session.date}:"
                units = [Unit(text, sep="\n") for _, text in session.turns]
                for chunk in pack(units, self._count, self._chunk_tokens, header=header):
                    for u in chunk.units:
                        held.setdefault((s, u), []).append(len(chunks))
                    chunks.append(chunk)
            turns: dict[DiaKey, _Turn] = {}
            for order, ((s, u), where) in enumerate(sorted(held.items())):
                dia_id, text = self._sessions[c][s].turns[u]
                turns.setdefault(_dia_key(dia_id), _Turn(order, text.strip(), tuple(where)))
            self._chunks[c] = (chunks, turns)
        return self._chunks[c]

    def _build(self, index: int) -> Task:
        q = self._questions[index]
        chunks, turns = self._conversation(q.conversation)
        keys = ((int(a), int(b)) for ev in q.evidence for a, b in _DIA_ID.findall(ev))
        named = sorted({turns[k].order: turns[k] for k in keys if k in turns}.items())
        return Task(
            task_id=f"{self._sample_ids[q.conversation]}/qa{q.index}",
            env=self.name,
            question=q.question,
            chunks=[chunk.text for chunk in chunks],
            answers=[q.answer],
            evidence=list(q.evidence),
            evidence_chunks=sorted({i for _, turn in named for i in turn.chunks}),
            facts=[Fact(text=turn.text, chunk=turn.chunks[-1]) for _, turn in named],
            category=q.category,
            metadata={"sample_id": self._sample_ids[q.conversation], **q.raw},
        )


def _read_sessions(conversation: dict[str, Any], place: str) -> list[_Session]:
    sessions = []
    for key, turns in conversation.items():
        match = _SESSION.fullmatch(key)
        if not match:
            continue
        s_place = f"{place} conversation.{key}"
        date = field(conversation, f"{key}_date_time", str, f"{place} conversation")
        rendered = []
        for t, turn in enumerate(need_list(turns, s_place)):
            t_place = f"{s_place}[{t}]"
            text = f"{field(turn, 'speaker', str, t_place)}: {field(turn, 'text', str, t_place)}"
            if isinstance(turn.get("blip_caption"), str):
                text += f" [shares {turn['blip_caption']}]"
            rendered.append((field(turn, "dia_id", str, t_place), text))
        sessions.append(_Session(int(match.group(1)), date, tuple(rendered)))
    if not sessions:
        raise EnvError(f"{place}: field 'conversation' has no session_N lists")
    return sorted(sessions, key=lambda s: s.number)


def _read_question(qa: Any, conversation: int, index: int, place: str) -> _Question:
    category = field(qa, "category", (int, str), place)
    evidence = field(qa, "evidence", list, place)
    if not all(isinstance(e, str) for e in evidence):
        raise EnvError(f"{place}: field 'evidence' must be a list of dia id strings")
    raw = {k: qa[k] for k in ("answer", "adversarial_answer") if k in qa}
    if str(category) == "5":
        answer = LOCOMO_NOT_MENTIONED
    else:
        if "answer" not in qa:
            raise EnvError(f"{place}: missing field 'answer'")
        answer = answer_text(qa["answer"], "answer", place)
    return _Question(
        conversation=conversation,
        index=index,
        question=field(qa, "question", str, place),
        answer=answer,
        category=str(category),
        evidence=tuple(evidence),
        raw=raw,
    )

"""LongMemEval (official JSON: a list of ``{question_id, question_type, question, answer, question_date,
haystack_dates, haystack_session_ids, haystack_sessions, answer_session_ids}``).

A task's sessions, sorted by date, become the chunks: one session per chunk, split on turns when over
the budget, each chunk starting with the session's date; a turn reads ``role: content``. With the knob
``context_tokens``, filler sessions drawn (seeded) from other questions' haystacks, dated no later than
the question, are added until the next one would take the total past that many tokens; then everything is
sorted by date. Session ids are never shown to the agent (they can spell "answer").

Invariants: the file is fully checked when the environment is built; answers that are numbers become
strings; the question carries its date ("... (asked on <date>)") because temporal questions need it;
``category`` is the question type; ``evidence`` is ``answer_session_ids`` and ``evidence_chunks`` the
chunks holding the answer sessions' ``has_answer`` turns (all of a session's chunks when it marks none);
``facts`` those turns as the chunks render them, in reading order, each with the last chunk holding it
(none for a session that marks none).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from agentmem.records import Fact, Task
from envs.base import TaskSource, TokensOnce
from envs.chunking import Unit, chunk_indices, last_chunk_of, pack
from envs.errors import EnvError, check_int
from envs.files import answer_text, field, need_list, read_json, where
from envs.selection import task_rng
from envs.types import CountTokens

_DATE_FORMAT = "%Y/%m/%d (%a) %H:%M"


@dataclass(frozen=True)
class _Session:
    session_id: str
    date: str
    when: datetime
    turns: tuple[tuple[str, bool], ...]  # (rendered text, has_answer)


@dataclass(frozen=True)
class _Question:
    qid: str
    qtype: str
    question: str
    answer: str
    date: str
    when: datetime
    sessions: tuple[int, ...]  # indices into the session corpus
    answer_sessions: tuple[str, ...]


class LongMemEvalEnv(TaskSource):
    name = "longmemeval"

    def __init__(
        self,
        *,
        data_path: str | Path,
        count_tokens: CountTokens,
        chunk_tokens: int,
        seed: int,
        context_tokens: int | None = None,
    ) -> None:
        check_int("longmemeval: knob context_tokens", context_tokens, 1, optional=True)
        super().__init__(count_tokens=count_tokens, chunk_tokens=chunk_tokens, seed=seed)
        self._context_tokens = context_tokens
        self._sessions: list[_Session] = []
        self._questions = self._read(Path(data_path))
        self._session_tokens = TokensOnce(count_tokens, lambda s: "\n".join(text for text, _ in self._sessions[s].turns))

    def _read(self, path: Path) -> list[_Question]:
        questions = []
        for index, record in enumerate(need_list(read_json(path), f"{path}: top level")):
            place = where(path, index, record, "question_id")
            dates = field(record, "haystack_dates", list, place)
            ids = field(record, "haystack_session_ids", list, place)
            sessions = field(record, "haystack_sessions", list, place)
            if not len(dates) == len(ids) == len(sessions):
                raise EnvError(
                    f"{place}: fields 'haystack_dates', 'haystack_session_ids' and 'haystack_sessions' "
                    f"differ in length ({len(dates)}, {len(ids)}, {len(sessions)})"
                )
            first = len(self._sessions)
            for j, (date, sid, turns) in enumerate(zip(dates, ids, sessions, strict=True)):
                self._sessions.append(_read_session(date, sid, turns, f"{place} haystack_sessions[{j}]"))
            date = field(record, "question_date", str, place)
            answer_ids = field(record, "answer_session_ids", list, place)
            questions.append(
                _Question(
                    qid=field(record, "question_id", str, place),
                    qtype=field(record, "question_type", str, place),
                    question=field(record, "question", str, place),
                    answer=answer_text(field(record, "answer", object, place), "answer", place),
                    date=date,
                    when=_parse_date(date, "question_date", place),
                    sessions=tuple(range(first, len(self._sessions))),
                    answer_sessions=tuple(str(a) for a in answer_ids),
                )
            )
        return questions

    def _with_filler(self, index: int, q: _Question) -> list[int]:
        chosen = list(q.sessions)
        if self._context_tokens is None:
            return chosen
        present = {self._sessions[s].session_id for s in chosen}
        total = sum(self._session_tokens(s) for s in chosen)
        own = set(chosen)
        for s in task_rng(self._seed, index).permutation(len(self._sessions)).tolist():
            session = self._sessions[s]
            if s in own or session.session_id in present or session.when > q.when:
                continue
            if total + self._session_tokens(s) > self._context_tokens:
                break
            total += self._session_tokens(s)
            chosen.append(s)
            present.add(session.session_id)
        return chosen

    def _build(self, index: int) -> Task:
        q = self._questions[index]
        chosen = sorted(self._with_filler(index, q), key=lambda s: self._sessions[s].when)
        chunks, evidence_chunks, facts = [], set(), []
        for s in chosen:
            session = self._sessions[s]
            packed = pack(
                [Unit(text, sep="\n") for text, _ in session.turns],
                self._count,
                self._chunk_tokens,
                header=f"Chat session on {session.date}:",
            )
            if session.session_id in q.answer_sessions:
                marked = {u for u, (_, has_answer) in enumerate(session.turns) if has_answer}
                local = chunk_indices(packed, marked) if marked else range(len(packed))
                evidence_chunks.update(len(chunks) + i for i in local)
                facts += [Fact(text=session.turns[u][0].strip(), chunk=len(chunks) + last_chunk_of(packed, u))
                          for u in sorted(marked)]
            chunks.extend(c.text for c in packed)
        return Task(
            task_id=q.qid,
            env=self.name,
            question=f"{q.question} (asked on {q.date})",
            chunks=chunks,
            answers=[q.answer],
            evidence=list(q.answer_sessions),
            evidence_chunks=sorted(evidence_chunks),
            facts=facts,
            category=q.qtype,
            metadata={
                "question": q.question,
                "question_date": q.date,
                "abstention": q.qid.endswith("_abs"),
                "sessions": [self._sessions[s].session_id for s in chosen],
            },
        )


def _parse_date(value: str, key: str, place: str) -> datetime:
    try:
        return datetime.strptime(value, _DATE_FORMAT)
    except ValueError:
        raise EnvError(
            f"{place}: field {key!r} is not a date like '2023/05/20 (Sat) 02:21': {value!r}"
        ) from None


def _read_session(date: Any, session_id: Any, turns: Any, place: str) -> _Session:
    if not isinstance(date, str) or not isinstance(session_id, str):
        raise EnvError(f"{place}: its haystack date and session id must be strings")
    rendered = []
    for t, turn in enumerate(need_list(turns, place)):
        t_place = f"{place}[{t}]"
        text = f"{field(turn, 'role', str, t_place)}: {field(turn, 'content', str, t_place)}"
        rendered.append((text, bool(turn.get("has_answer", False))))
    return _Session(session_id, date, _parse_date(date, "haystack_dates", place), tuple(rendered))

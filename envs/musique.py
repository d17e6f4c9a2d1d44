"""MuSiQue (official JSON lines, ``musique_ans_v1.0_dev.jsonl`` / ``musique_full_v1.0_dev.jsonl``: ``id,
question, answer, answer_aliases, paragraphs [{idx, title, paragraph_text, is_supporting}],
question_decomposition, answerable``).

A task's long context is the question's own paragraphs (twenty in the official files, already shuffled
there) in the file's order, each one unit ``"<title>: <paragraph_text>"``, so a chunk breaks inside a
paragraph only when it alone is over the budget. The seed orders the tasks only. By default only the
answerable questions are tasks (knob ``answerable_only``; MuSiQue's ``evaluate_v1.0.py`` scores answers
on answerable questions only; with ``answerable_only=False`` an unanswerable question is a task whose
gold is still its file ``answer``, marked ``metadata["answerable"] = False``).

Invariants: the file is fully checked when the environment is built (every line, answerable or not);
``answers`` are ``answer`` then ``answer_aliases``, without repeats; ``evidence`` holds the supporting
paragraphs (as rendered), ``evidence_chunks`` the chunks holding them, and ``facts`` the same paragraphs
in reading order, each with the last chunk holding it; ``category`` is the hop type that prefixes the id
(``2hop``, ``3hop1``, ``4hop3``, ...); ``score`` is MuSiQue's ``metrics/answer.py``: answer F1 and EM of
SQuAD 2.0 (``envs.metrics.squad2_f1``/``squad2_exact``), each the maximum over the answer and its
aliases; ``sub_em`` (not a MuSiQue metric) is substring EM, maximised the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmem.records import Fact, Task
from envs.base import TaskSource
from envs.chunking import Unit, chunk_indices, last_chunk_of, pack
from envs.errors import EnvError
from envs.files import answer_text, field, read_records, where_line
from envs.metrics import Scores, best_scores, squad2_exact, squad2_f1, substring_match
from envs.types import CountTokens


@dataclass(frozen=True)
class _Question:
    qid: str
    question: str
    answers: tuple[str, ...]
    paragraphs: tuple[tuple[str, bool], ...]  # (rendered text, is_supporting)
    answerable: bool
    decomposition: list[Any]


class MusiqueEnv(TaskSource):
    name = "musique"

    def __init__(
        self,
        *,
        data_path: str | Path,
        count_tokens: CountTokens,
        chunk_tokens: int,
        seed: int,
        answerable_only: bool = True,
    ) -> None:
        if not isinstance(answerable_only, bool):
            raise EnvError(f"{self.name}: knob answerable_only must be true or false, got {answerable_only!r}")
        super().__init__(count_tokens=count_tokens, chunk_tokens=chunk_tokens, seed=seed)
        path = Path(data_path)
        unit, records = read_records(path)  # the official JSON lines, or the same records as one JSON array
        questions = [_read(path, number, record, unit) for number, record in records]
        self._questions = [q for q in questions if q.answerable or not answerable_only]

    def score(self, prediction: str, task: Task) -> Scores:
        return best_scores(prediction, task.answers, squad2_f1, squad2_exact, substring_match)

    def _build(self, index: int) -> Task:
        q = self._questions[index]
        chunks = pack([Unit(text, sep="\n") for text, _ in q.paragraphs], self._count, self._chunk_tokens)
        support = [u for u, (text, supporting) in enumerate(q.paragraphs) if supporting and text.strip()]
        return Task(
            task_id=q.qid,
            env=self.name,
            question=q.question,
            chunks=[c.text for c in chunks],
            answers=list(q.answers),
            evidence=[q.paragraphs[u][0].strip() for u in support],
            evidence_chunks=chunk_indices(chunks, set(support)),
            facts=[Fact(text=q.paragraphs[u][0].strip(), chunk=last_chunk_of(chunks, u)) for u in support],
            category=q.qid.split("__")[0] if "__" in q.qid else None,
            metadata={"answerable": q.answerable, "question_decomposition": q.decomposition},
        )


def _read(path: Path, number: int, record: Any, unit: str = "line") -> _Question:
    place = where_line(path, number, record, "id", unit)
    aliases = field(record, "answer_aliases", list, place)
    golds = [answer_text(field(record, "answer", str, place), "answer", place)]
    for j, alias in enumerate(aliases):
        if not isinstance(alias, str):
            raise EnvError(f"{place}: field 'answer_aliases'[{j}] must be a string, got {type(alias).__name__}")
        if alias.strip():
            golds.append(alias.strip())
    paragraphs = []
    for j, paragraph in enumerate(field(record, "paragraphs", list, place)):
        p_place = f"{place} paragraphs[{j}]"
        title = field(paragraph, "title", str, p_place)
        text = field(paragraph, "paragraph_text", str, p_place)
        paragraphs.append((f"{title}: {text}", field(paragraph, "is_supporting", bool, p_place)))
    if not any(text.strip() for text, _ in paragraphs):
        raise EnvError(f"{place}: field 'paragraphs' has no text")
    return _Question(
        qid=field(record, "id", str, place),
        question=field(record, "question", str, place),
        answers=tuple(dict.fromkeys(golds)),
        paragraphs=tuple(paragraphs),
        answerable=field(record, "answerable", bool, place),
        decomposition=field(record, "question_decomposition", list, place),
    )

"""The readers on the real benchmark files in ../shared/data (skipped when that folder is absent)."""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime

from fixtures_envs import words

from envs import Scores, load_env

HOTPOT = "hotpotqa/hotpot_dev_distractor_v1_first103.json"
SQUAD = "squad/dev-v1.1.json"
LOCOMO = "locomo/locomo_dev6.json"
LONGMEMEVAL = "longmemeval/longmemeval_oracle_dev60.json"


def chars(text: str) -> int:
    """A second, non-additive-looking counter: about four characters a token."""
    return len(text) // 4 + 1


def check_tasks(tasks, count, budget):
    assert tasks and len({t.task_id for t in tasks}) == len(tasks)
    for task in tasks:
        assert task.question.strip() and task.answers and all(a.strip() for a in task.answers)
        assert all(count(c) <= budget for c in task.chunks)
        assert task.evidence_chunks == sorted(set(task.evidence_chunks))
        assert all(0 <= i < len(task.chunks) for i in task.evidence_chunks)


def test_hotpotqa_real(shared_data):
    env = load_env("hotpotqa", data_path=shared_data / HOTPOT, count_tokens=words, chunk_tokens=200, seed=0)
    tasks = env.tasks()
    assert len(tasks) == 103
    check_tasks(tasks, words, 200)
    first = next(t for t in tasks if t.task_id == "5a8b57f25542995d1e6f1371")
    assert first.answers == ["yes"] and first.category == "comparison"
    assert first.evidence[0].startswith("Scott Derrickson (born July 16, 1966) is an American director")
    for task in tasks:
        titles = task.metadata["titles"]
        assert len(titles) == 20 and len(set(titles)) == 20
        assert {title for title, _ in task.metadata["supporting_facts"]} <= set(titles)
        assert task.evidence and task.evidence_chunks
        for sentence in task.evidence:
            assert any(sentence in task.chunks[i] for i in task.evidence_chunks)
    assert env.score("Yes", first) == Scores(f1=1.0, em=1.0, sub_em=1.0)


def test_hotpotqa_real_to_a_token_target(shared_data):
    env = load_env(
        "hotpotqa",
        data_path=shared_data / HOTPOT,
        count_tokens=chars,
        chunk_tokens=128,
        seed=5,
        context_tokens=4000,
    )
    tasks = env.tasks(20)
    check_tasks(tasks, chars, 128)
    for task in tasks:
        assert 3000 < sum(chars(c) for c in task.chunks) < 4400


def test_squad_real(shared_data):
    env = load_env("squad", data_path=shared_data / SQUAD, count_tokens=words, chunk_tokens=256, seed=0)
    tasks = env.tasks(150)
    check_tasks(tasks, words, 256)
    for task in tasks:
        assert len(task.metadata["paragraphs"]) == 10
        evidence = " ".join(task.chunks[i] for i in task.evidence_chunks)
        assert any(a in evidence for a in task.answers)
        assert env.score(task.answers[0], task).em == 1.0


def test_locomo_real(shared_data):
    env = load_env("locomo", data_path=shared_data / LOCOMO, count_tokens=words, chunk_tokens=512, seed=0)
    tasks = env.tasks()
    assert Counter(t.category for t in tasks) == {"1": 172, "2": 180, "3": 53, "4": 480, "5": 272}
    check_tasks(tasks[:100], words, 512)
    conversations = {t.metadata["sample_id"]: t.chunks for t in tasks}  # every question of one reads the same
    assert len(conversations) == 6
    for chunks in conversations.values():
        assert all(words(c) <= 512 for c in chunks)
        numbers = [int(re.match(r"Session (\d+), ", c).group(1)) for c in chunks]
        assert numbers == sorted(numbers)
    assert all(t.answers == ["Not mentioned in the conversation"] for t in tasks if t.category == "5")
    assert sum(bool(t.evidence_chunks) for t in tasks) / len(tasks) > 0.95
    first = next(t for t in tasks if t.task_id == "conv-26/qa0")
    assert first.evidence == ["D1:3"] and first.answers == ["7 May 2023"]
    assert first.chunks[first.evidence_chunks[0]].startswith(f"Session {1}, 1:56 pm on 8 May, 2023:\n")
    assert "LGBTQ support group" in first.chunks[first.evidence_chunks[0]]
    assert {
        t.category
        for t in load_env(
            "locomo",
            data_path=shared_data / LOCOMO,
            count_tokens=words,
            chunk_tokens=512,
            seed=0,
            categories=[1, 2],
        ).tasks()
    } == {"1", "2"}


def _session_dates(task):
    return [
        datetime.strptime(c.split("\n")[0][len("Chat session on ") : -1], "%Y/%m/%d (%a) %H:%M")
        for c in task.chunks
    ]


def test_longmemeval_real(shared_data):
    path = shared_data / LONGMEMEVAL
    env = load_env("longmemeval", data_path=path, count_tokens=words, chunk_tokens=512, seed=0)
    tasks = env.tasks()
    assert len(tasks) == 60
    check_tasks(tasks, words, 512)
    for task in tasks:
        assert _session_dates(task) == sorted(_session_dates(task))
        assert task.evidence and task.evidence_chunks  # the oracle split holds only evidence sessions
    assert sum(t.answers[0].isdigit() for t in tasks) >= 4  # the file's integer answers, as text
    filled = load_env(
        "longmemeval", data_path=path, count_tokens=words, chunk_tokens=512, seed=0, context_tokens=8000
    ).tasks(10)
    by_id = {t.task_id: t for t in tasks}
    for task in filled:
        dates = _session_dates(task)
        assert dates == sorted(dates) and len(task.chunks) >= len(by_id[task.task_id].chunks)
        asked = datetime.strptime(task.metadata["question_date"], "%Y/%m/%d (%a) %H:%M")
        late = [d for d in _session_dates(by_id[task.task_id]) if d > asked]
        assert [d for d in dates if d > asked] == late  # filler is never dated after the question
    assert sum(len(t.metadata["sessions"]) for t in filled) > sum(
        len(by_id[t.task_id].metadata["sessions"]) for t in filled
    )

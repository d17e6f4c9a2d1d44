"""Needles (BABILong-style, the project's own generator): every story is solved independently from its
sentences and must agree with the task's answer and supporting facts; the filler is read in order and
cycles; the context size is exact for an additive counter; seeded determinism; knob and file errors."""

from __future__ import annotations

import re

import pytest
from fixtures_envs import filler_text, words

from envs import EnvError, Scores, load_env

MOVE = re.compile(r"(\w+) (?:moved to|went to|journeyed to|travelled to|went back to) the (\w+)\.")
TAKE = re.compile(r"(\w+) (?:picked up|got|grabbed|took) the (\w+)\.")
RELATION = re.compile(r"The (\w+) is (north|south|east|west) of the (\w+)\.")


@pytest.fixture
def filler(tmp_path):
    path = tmp_path / "filler.txt"
    path.write_text(filler_text(), encoding="utf-8")  # 400 sentences of 7 words: "Line 12 speaks of a red stone."
    return path


def needle(path, task="qa1", context_tokens=300, seed=0, chunk_tokens=40, num_tasks=30):
    return load_env("needle", data_path=path, count_tokens=words, chunk_tokens=chunk_tokens, seed=seed, task=task,
                    context_tokens=context_tokens, num_tasks=num_tasks)


def solve(task) -> tuple[str, list[str]]:
    """(answer, supporting sentences) worked out from the story alone."""
    story, question = task.metadata["story"], task.question
    if task.category == "qa1":
        person = re.fullmatch(r"Where is (\w+)\?", question).group(1)
        last = [s for s in story if (m := MOVE.fullmatch(s)) and m.group(1) == person][-1]
        return MOVE.fullmatch(last).group(2), [last]
    if task.category == "qa2":
        thing = re.fullmatch(r"Where is the (\w+)\?", question).group(1)
        (take,) = [s for s in story if (m := TAKE.fullmatch(s)) and m.group(2) == thing]
        holder = TAKE.fullmatch(take).group(1)
        after = story[story.index(take) + 1 :]
        last = [s for s in after if (m := MOVE.fullmatch(s)) and m.group(1) == holder][-1]
        return MOVE.fullmatch(last).group(2), [take, last]
    relations = [RELATION.fullmatch(s).groups() for s in story]
    if m := re.fullmatch(r"What is (\w+) of the (\w+)\?", question):
        (hit,) = [r for r in relations if (r[1], r[2]) == m.groups()]
        return hit[0], [f"The {hit[0]} is {hit[1]} of the {hit[2]}."]
    m = re.fullmatch(r"What is the (\w+) (\w+) of\?", question)
    (hit,) = [r for r in relations if (r[0], r[1]) == m.groups()]
    return hit[2], [f"The {hit[0]} is {hit[1]} of the {hit[2]}."]


@pytest.mark.parametrize("kind", ["qa1", "qa2", "qa4"])
def test_each_story_has_one_answer_and_its_supporting_facts(filler, kind):
    tasks = needle(filler, task=kind).tasks()
    assert len(tasks) == 30 and {t.category for t in tasks} == {kind}
    for task in tasks:
        answer, support = solve(task)
        assert task.answers == [answer] and len(answer.split()) == 1
        assert task.evidence == support and [f.text for f in task.facts] == support
        text, at = " ".join(task.chunks), 0
        for sentence in task.metadata["story"]:  # in story order (a sentence may occur twice)
            at = text.index(sentence, at) + len(sentence)
        for fact in task.facts:
            assert fact.text in task.chunks[fact.chunk] and fact.chunk in task.evidence_chunks
        assert needle(filler, task=kind).score(answer, task) == Scores(1.0, 1.0, 1.0)


def test_story_words_and_forms(filler):
    qa1 = needle(filler, task="qa1").tasks(1)[0]
    assert re.fullmatch(r"Where is (Mary|John|Sandra|Daniel)\?", qa1.question)
    assert all(MOVE.fullmatch(s) for s in qa1.metadata["story"])
    qa2 = needle(filler, task="qa2").tasks(1)[0]
    assert sum(bool(TAKE.fullmatch(s)) for s in qa2.metadata["story"]) == 1
    qa4 = needle(filler, task="qa4").tasks()
    assert all(len(t.metadata["story"]) == 2 for t in qa4)
    forms = {t.question.startswith("What is the ") for t in qa4}
    assert forms == {True, False}, "both question forms occur"


@pytest.mark.parametrize("context_tokens", [100, 300, 4096])
def test_context_size_is_within_one_filler_sentence_of_the_target(filler, context_tokens):
    for task in needle(filler, context_tokens=context_tokens, chunk_tokens=512, num_tasks=5).tasks():
        total = words(" ".join(task.chunks))
        assert context_tokens - 7 < total <= context_tokens  # filler sentences are 7 words each
        assert all(words(c) <= 512 for c in task.chunks)


def test_filler_is_read_in_order_from_a_seeded_start_and_cycles(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("S0 is here. S1 is here!\nS2 is here? S3 is here. S4 is here.", encoding="utf-8")
    tasks = needle(path, context_tokens=120, chunk_tokens=30).tasks()
    assert len({t.metadata["filler_start"] for t in tasks}) > 1
    for task in tasks:
        story = task.metadata["story"]
        sentences = re.split(r"(?<=[.!?])\s+", " ".join(task.chunks))
        filler = [s for s in sentences if s not in story]
        start = task.metadata["filler_start"]
        assert filler == [f"S{(start + j) % 5} is here{'.!?..'[(start + j) % 5]}" for j in range(len(filler))]
        assert len(filler) == task.metadata["filler_sentences"] > 5  # cycled at least once
        assert 120 - 3 < words(" ".join(task.chunks)) <= 120


def test_seeded_determinism(filler):
    for kind in ("qa1", "qa2", "qa4"):
        first = needle(filler, task=kind).tasks()
        assert first == needle(filler, task=kind).tasks()
        assert first != needle(filler, task=kind, seed=1).tasks()
        assert needle(filler, task=kind).tasks(4) == first[:4]
        # a task depends on its index, not on how many tasks there are
        more = {t.task_id: t for t in needle(filler, task=kind, num_tasks=60).tasks()}
        assert all(more[t.task_id] == t for t in first)


def test_knob_and_file_errors(filler, tmp_path):
    with pytest.raises(EnvError, match="knob task must be one of qa1, qa2, qa4, got 'qa3'"):
        needle(filler, task="qa3")
    with pytest.raises(EnvError, match="knob context_tokens must be an integer >= 1"):
        needle(filler, context_tokens=0)
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n\n", encoding="utf-8")
    with pytest.raises(EnvError, match=f"{empty}: no filler sentences"):
        needle(empty)
    with pytest.raises(EnvError, match="needs a data file"):
        load_env("needle", count_tokens=words, chunk_tokens=8, seed=0)


def test_real_squad_contexts_as_filler(shared_data, tmp_path):
    import json

    squad = json.loads((shared_data / "squad/dev-v1.1.json").read_text(encoding="utf-8"))
    path = tmp_path / "squad.txt"
    path.write_text("\n".join(p["context"] for a in squad["data"] for p in a["paragraphs"]), encoding="utf-8")
    for kind in ("qa1", "qa2", "qa4"):
        for task in needle(path, task=kind, context_tokens=8192, chunk_tokens=1024, num_tasks=3).tasks():
            assert 8192 - 200 < words(" ".join(task.chunks)) <= 8192
            assert all(words(c) <= 1024 for c in task.chunks)
            assert solve(task) == (task.answers[0], task.evidence)
            assert all(s in " ".join(task.chunks) for s in task.metadata["story"])

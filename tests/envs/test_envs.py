"""Environments: one contract check run over every environment, then each reader's specifics and errors."""

from __future__ import annotations

import json

import pytest
from fixtures_envs import (
    hotpotqa_records,
    locomo_records,
    longmemeval_records,
    make,
    squad_records,
    words,
    write_fixture,
    write_json,
)

from agentmem.records import Task
from envs import ENV_NAMES, EnvError, Scores, knobs_of, load_env
from envs.chunking import Unit, pack


@pytest.mark.parametrize("name", ENV_NAMES)
def test_check_env(name, tmp_path):
    env = make(name, tmp_path)
    tasks = env.tasks()
    assert env.name == name and tasks
    assert tasks == make(name, tmp_path).tasks(), "same seed, same tasks"
    assert tasks != make(name, tmp_path, seed=1).tasks(), "another seed, other tasks"
    assert env.tasks(2) == tasks[:2] and env.tasks(0) == [] and len(env.tasks(10_000)) == len(tasks)
    assert len({t.task_id for t in tasks}) == len(tasks)
    for task in tasks:
        assert isinstance(task, Task) and task.env == name
        assert task.question.strip() and task.chunks and task.answers
        assert all(isinstance(a, str) and a.strip() for a in task.answers)
        assert all(c.strip() and words(c) <= 16 for c in task.chunks)
        assert task.evidence_chunks == sorted(set(task.evidence_chunks))
        assert all(0 <= i < len(task.chunks) for i in task.evidence_chunks)
        gold = env.score(task.answers[0], task)
        assert isinstance(gold, Scores) and gold.sub_em == 1.0
        assert env.score("zzz qqq", task) == Scores(f1=0.0, em=0.0, sub_em=0.0)


@pytest.mark.parametrize("name", ENV_NAMES)
def test_every_env_rejects_unknown_knobs_and_bad_budgets(name, tmp_path):
    path = write_fixture(name, tmp_path)
    with pytest.raises(EnvError, match="unknown knob"):
        load_env(name, data_path=path, count_tokens=words, chunk_tokens=16, seed=0, chunk_size=3)
    with pytest.raises(EnvError, match="chunk_tokens"):
        load_env(name, data_path=path, count_tokens=words, chunk_tokens=0, seed=0)
    with pytest.raises(EnvError, match="seed"):
        load_env(name, data_path=path, count_tokens=words, chunk_tokens=16, seed=-1)
    with pytest.raises(EnvError, match="n must be"):
        load_env(name, data_path=path, count_tokens=words, chunk_tokens=16, seed=0).tasks(-1)


def test_names_and_knobs():
    assert ENV_NAMES == ("synthetic", "hotpotqa", "squad", "locomo", "longmemeval", "ruler_hotpotqa", "needle",
                         "musique", "2wikimultihopqa", "quality")
    assert knobs_of("synthetic") == {"level": None, "context_tokens": None, "hops": None, "distractors": None,
                                     "num_tasks": 1000, "names": "any", "forms": "entity"}
    assert knobs_of("hotpotqa") == {"docs": 20, "context_tokens": None}
    assert knobs_of("squad") == {"docs": 10, "context_tokens": None}
    assert knobs_of("locomo") == {"categories": None, "stem": True}
    assert knobs_of("longmemeval") == {"context_tokens": None}
    assert knobs_of("ruler_hotpotqa") == {"docs": 50}
    assert knobs_of("needle") == {"task": "qa1", "context_tokens": 4096, "num_tasks": 100}
    assert knobs_of("musique") == {"answerable_only": True}
    assert knobs_of("2wikimultihopqa") == {} and knobs_of("quality") == {}
    with pytest.raises(EnvError, match="unknown environment 'nope'"):
        load_env("nope", count_tokens=words, chunk_tokens=8, seed=0)
    assert issubclass(EnvError, ValueError)


@pytest.mark.parametrize("name", [n for n in ENV_NAMES if n != "synthetic"])
def test_data_envs_need_an_existing_valid_file(name, tmp_path):
    with pytest.raises(EnvError, match="needs a data file"):
        load_env(name, count_tokens=words, chunk_tokens=8, seed=0)
    missing = tmp_path / "missing.json"
    with pytest.raises(EnvError, match=f"{missing}: no such file"):
        load_env(name, data_path=missing, count_tokens=words, chunk_tokens=8, seed=0)
    if name == "needle":  # its file is plain text: any text with a sentence is a filler
        return
    broken = tmp_path / "broken.json"
    broken.write_text('[{"a": ', encoding="utf-8")
    with pytest.raises(EnvError, match=f"{broken}: not valid JSON"):
        load_env(name, data_path=str(broken), count_tokens=words, chunk_tokens=8, seed=0)


@pytest.mark.parametrize(("name", "wants"), [
    ("needle", "give --data FILE (any plain-text file: the filler the bAbI stories are hidden in)"),
    ("hotpotqa", "give --data FILE (HotpotQA's official JSON, e.g. hotpot_dev_distractor_v1.json)"),
    ("musique", "give --data FILE (MuSiQue's JSON lines (or one JSON array), e.g. musique_ans_v1.0_dev.jsonl)"),
])
def test_missing_data_names_the_flag_and_the_file_it_wants(name, wants):
    with pytest.raises(EnvError) as err:
        load_env(name, count_tokens=words, chunk_tokens=100, seed=0)
    assert str(err.value) == f"{name}: needs a data file: {wants}"
    assert "data_path" not in str(err.value) and ("JSON" not in str(err.value) or name != "needle")


def test_synthetic_takes_no_file(tmp_path):
    with pytest.raises(EnvError, match="takes no data file"):
        load_env("synthetic", data_path=tmp_path / "x.json", count_tokens=words, chunk_tokens=8, seed=0)


def _broken(records, mutate):
    mutate(records)
    return records


BAD_FILES = [
    (
        "hotpotqa",
        lambda: _broken(hotpotqa_records(), lambda r: r[1].pop("answer")),
        r"record 1 \(_id 'hp2'\): missing field 'answer'",
    ),
    (
        "hotpotqa",
        lambda: _broken(hotpotqa_records(), lambda r: r[2]["context"].append(["T", "not a list"])),
        r"record 2 \(_id 'hp3'\): field 'context'\[3\] must be \[title, \[sentences\]\]",
    ),
    (
        "hotpotqa",
        lambda: _broken(hotpotqa_records(), lambda r: r[0].update(supporting_facts=[["Velo", "0"]])),
        r"record 0 \(_id 'hp1'\): field 'supporting_facts'\[0\] must be \[title, sentence index\]",
    ),
    ("hotpotqa", lambda: {"data": []}, r"top level: expected a list, got dict"),
    (
        "squad",
        lambda: _broken(squad_records(), lambda d: d["data"][1]["paragraphs"][0]["qas"][0].pop("question")),
        r"record data\[1\] paragraphs\[0\] qas\[0\] \(id 'sq4'\): missing field 'question'",
    ),
    (
        "squad",
        lambda: _broken(
            squad_records(), lambda d: d["data"][0]["paragraphs"][1]["qas"][0].update(answers=[])
        ),
        r"qas\[0\] \(id 'sq3'\): field 'answers' is empty",
    ),
    (
        "squad",
        lambda: _broken(squad_records(), lambda d: d["data"][0].update(paragraphs={})),
        r"record data\[0\] \(title 'Super_Bowl'\): field 'paragraphs' must be a list, got dict",
    ),
    (
        "locomo",
        lambda: _broken(locomo_records(), lambda r: r[0]["qa"][0].pop("answer")),
        r"record 0 \(sample_id 'conv-a'\) qa\[0\]: missing field 'answer'",
    ),
    (
        "locomo",
        lambda: _broken(locomo_records(), lambda r: r[1]["conversation"].pop("session_1_date_time")),
        r"record 1 \(sample_id 'conv-b'\) conversation: missing field 'session_1_date_time'",
    ),
    (
        "locomo",
        lambda: _broken(locomo_records(), lambda r: r[0]["conversation"]["session_2"][1].pop("text")),
        r"record 0 \(sample_id 'conv-a'\) conversation.session_2\[1\]: missing field 'text'",
    ),
    (
        "longmemeval",
        lambda: _broken(longmemeval_records(), lambda r: r[2].pop("answer")),
        r"record 2 \(question_id 'lm3_abs'\): missing field 'answer'",
    ),
    (
        "longmemeval",
        lambda: _broken(longmemeval_records(), lambda r: r[0]["haystack_dates"].pop()),
        r"record 0 \(question_id 'lm1'\): fields 'haystack_dates', .* differ in length \(1, 2, 2\)",
    ),
    (
        "longmemeval",
        lambda: _broken(longmemeval_records(), lambda r: r[1].update(question_date="yesterday")),
        r"record 1 \(question_id 'lm2'\): field 'question_date' is not a date",
    ),
    (
        "longmemeval",
        lambda: _broken(longmemeval_records(), lambda r: r[1].update(answer=None)),
        r"record 1 \(question_id 'lm2'\): field 'answer' must be a string or number, got NoneType",
    ),
]


@pytest.mark.parametrize(("name", "data", "message"), BAD_FILES)
def test_bad_file_is_one_error_naming_file_record_and_field(name, data, message, tmp_path):
    path = write_json(tmp_path / "bad.json", data())
    with pytest.raises(EnvError, match=message) as err:
        load_env(name, data_path=path, count_tokens=words, chunk_tokens=16, seed=0)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


# --- chunking -------------------------------------------------------------------------------------


def test_pack_fills_greedily_and_records_units():
    chunks = pack([Unit("a b"), Unit("c d e"), Unit("f"), Unit("  "), Unit("g h i j")], words, 5)
    assert [(c.text, c.units) for c in chunks] == [("a b c d e", (0, 1)), ("f g h i j", (2, 4))]


def test_pack_splits_long_units_on_words_then_characters():
    chunks = pack([Unit("x"), Unit("one two three four five six seven"), Unit("y", sep="\n")], words, 3)
    assert [(c.text, c.units) for c in chunks] == [
        ("x", (0,)),
        ("one two three", (1,)),
        ("four five six", (1,)),
        ("seven\ny", (1, 2)),
    ]

    def chars(s: str) -> int:
        return len(s)

    assert [c.text for c in pack([Unit("abcdefg hi")], chars, 3)] == ["abc", "def", "g", "hi"]


def test_pack_counts_the_header_and_refuses_a_budget_it_fills():
    chunks = pack([Unit("a b c d")], words, 4, header="Day 1:")
    assert [c.text for c in chunks] == ["Day 1:\na b", "Day 1:\nc d"]
    with pytest.raises(EnvError, match="chunk_tokens=2 leaves no room"):
        pack([Unit("a")], words, 2, header="Day 1:")


# --- synthetic ------------------------------------------------------------------------------------


def synthetic(**knobs):
    return load_env("synthetic", count_tokens=words, chunk_tokens=40, seed=7, **knobs)


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_synthetic_chains_facts_over_hops(hops):
    for task in synthetic(hops=hops, distractors=3, context_tokens=300).tasks(5):
        text = " ".join(task.chunks)
        assert len(task.evidence) == hops and task.category == f"{hops}-hop"
        assert all(sentence in text for sentence in task.evidence)
        assert task.answers[0] in task.evidence[-1] and len(task.answers[0].split()) == 1
        positions = task.metadata["evidence_sentences"]
        assert len(set(positions)) == hops
        for sentence in task.evidence:
            assert any(sentence in task.chunks[i] for i in task.evidence_chunks)
        assert 300 <= words(text) <= 300 + 12
        facts = [s for s in text.split(". ") if " works for " in s or " is the mentor of " in s]
        assert len(facts) == 4  # the chain's first fact plus one per distractor chain


def test_synthetic_knobs_are_checked():
    for knobs, message in [
        ({"hops": 4}, "hops must be 1, 2 or 3"),
        ({"distractors": -1}, "distractors must be an integer >= 0"),
        ({"context_tokens": 0}, "context_tokens must be an integer >= 1"),
    ]:
        with pytest.raises(EnvError, match=message):
            synthetic(**knobs)


def test_synthetic_default_is_short_and_answerable():
    task = load_env("synthetic", count_tokens=words, chunk_tokens=256, seed=0).tasks(1)[0]
    assert 1024 <= words(" ".join(task.chunks)) < 1100 and len(task.chunks) >= 4
    assert task.question.endswith("?") and len(task.answers[0]) <= 12


# --- hotpotqa -------------------------------------------------------------------------------------


def hotpot(tmp_path, **knobs):
    path = write_json(tmp_path / "hotpot.json", hotpotqa_records())
    return load_env("hotpotqa", data_path=path, count_tokens=words, chunk_tokens=30, seed=0, **knobs)


def test_hotpotqa_context_evidence_and_documents(tmp_path):
    tasks = {t.task_id: t for t in hotpot(tmp_path).tasks()}
    hp1 = tasks["hp1"]
    assert hp1.answers == ["Rasten"] and hp1.category == "bridge" and hp1.metadata["level"] == "easy"
    assert hp1.evidence == ["Velo is a country whose capital is Rasten.", "Rasten lies on a river."]
    for sentence in hp1.evidence:
        assert any(sentence in hp1.chunks[i] for i in hp1.evidence_chunks)
    # all 7 distinct documents of the file fit under the default docs=20
    assert sorted(hp1.metadata["titles"]) == [
        "Anna Tol",
        "Bo Rik",
        "Kilmar",
        "Lamar",
        "Mordo",
        "Rasten",
        "Sendo",
        "Tiro",
        "Velo",
    ]
    assert any(c.startswith("Velo: Velo is a country") or "\nVelo: Velo is" in c for c in hp1.chunks)


def test_hotpotqa_docs_and_context_tokens_knobs(tmp_path):
    for task in hotpot(tmp_path, docs=3).tasks():
        titles = task.metadata["titles"]
        assert len(titles) == 3 and len(set(titles)) == 3
        gold = {title for title, _ in task.metadata["supporting_facts"]}
        assert gold <= set(titles)
    for task in hotpot(tmp_path, context_tokens=40).tasks():
        text = " ".join(task.chunks)
        assert words(text) <= 40 + 2  # + the titles' "Title:" prefixes counted per document, not per chunk
    assert hotpot(tmp_path, docs=3).tasks() != hotpot(tmp_path, docs=4).tasks()
    with pytest.raises(EnvError, match="docs must be an integer >= 1"):
        hotpot(tmp_path, docs=0)


def test_hotpotqa_scores_yes_no_by_the_official_rule(tmp_path):
    env = hotpot(tmp_path)
    hp2 = next(t for t in env.tasks() if t.task_id == "hp2")
    assert env.score("Yes.", hp2) == Scores(f1=1.0, em=1.0, sub_em=1.0)
    assert env.score("yes they were", hp2) == Scores(f1=0.0, em=0.0, sub_em=1.0)


# --- squad ----------------------------------------------------------------------------------------


def squad(tmp_path, chunk_tokens=40, **knobs):
    path = write_json(tmp_path / "squad.json", squad_records())
    return load_env("squad", data_path=path, count_tokens=words, chunk_tokens=chunk_tokens, seed=3, **knobs)


def test_squad_answers_context_and_evidence(tmp_path):
    tasks = {t.task_id: t for t in squad(tmp_path).tasks()}
    assert sorted(tasks) == ["sq1", "sq2", "sq3", "sq4"]
    sq1 = tasks["sq1"]
    assert sq1.answers == ["Denver Broncos", "The Denver Broncos"]
    assert sq1.evidence == ["The Denver Broncos won the game. It was played in Santa Clara."]
    assert sq1.metadata["title"] == "Super Bowl" and len(sq1.metadata["paragraphs"]) == 4  # all, docs=10
    assert all("Denver Broncos" in sq1.chunks[i] for i in sq1.evidence_chunks)
    env = squad(tmp_path)
    assert env.score("the denver broncos!", sq1) == Scores(f1=1.0, em=1.0, sub_em=1.0)


def test_squad_splits_a_long_paragraph_and_points_at_the_answer_piece(tmp_path):
    sq4 = next(t for t in squad(tmp_path, chunk_tokens=8, docs=1).tasks() if t.task_id == "sq4")
    assert len(sq4.chunks) == 3 and sq4.chunks[0].startswith("Rivers: The Rhine")
    assert sq4.evidence_chunks == [i for i, c in enumerate(sq4.chunks) if "six" in c]


# --- locomo ---------------------------------------------------------------------------------------


def locomo(tmp_path, chunk_tokens=40, **knobs):
    path = write_json(tmp_path / "locomo.json", locomo_records())
    return load_env("locomo", data_path=path, count_tokens=words, chunk_tokens=chunk_tokens, seed=0, **knobs)


def locomo_header(number: int, date: str) -> str:
    """The line a LoCoMo chunk starts with: its session's number and date."""
    return f"Session {number}, {date}:\n"


def test_locomo_sessions_in_order_with_dates_and_categories(tmp_path):
    env = locomo(tmp_path)
    tasks = {t.task_id: t for t in env.tasks()}
    assert sorted(tasks) == [
        "conv-a/qa0",
        "conv-a/qa1",
        "conv-a/qa2",
        "conv-a/qa3",
        "conv-a/qa4",
        "conv-b/qa0",
    ]
    dog = tasks["conv-a/qa0"]
    assert dog.chunks == [
        locomo_header(1, "1:56 pm on 8 May, 2023") + "Ana: Hi Ben! I started painting.\nBen: Great, what do you paint?",
        locomo_header(2, "2:00 pm on 9 May, 2023") + "Ana: I adopted a dog named Rex.\nBen: Lovely! What breed?\n"
        "Ana: A beagle. [shares a photo of a beagle]",
    ]
    assert (
        dog.category == "4"
        and dog.answers == ["Rex"]
        and dog.evidence == ["D2:1"]
        and dog.evidence_chunks == [1]
    )
    assert tasks["conv-a/qa2"].evidence_chunks == [0, 1]  # "D1:1; D2:1" names two turns
    assert tasks["conv-a/qa4"].answers == ["1"] and tasks["conv-a/qa4"].evidence_chunks == [
        1
    ]  # D9:9: no turn
    adversarial = tasks["conv-a/qa3"]
    assert adversarial.category == "5" and adversarial.answers == ["Not mentioned in the conversation"]
    assert adversarial.metadata["adversarial_answer"] == "Rex"


def test_locomo_splits_a_long_session_on_turns_each_chunk_dated(tmp_path):
    task = next(t for t in locomo(tmp_path, chunk_tokens=16).tasks() if t.task_id == "conv-b/qa0")
    assert len(task.chunks) == 4 and all(
        c.startswith(locomo_header(1, "9:00 am on 1 March, 2022")) for c in task.chunks
    )
    assert task.evidence_chunks == [0]


def test_locomo_categories_knob_and_scoring(tmp_path):
    assert {t.category for t in locomo(tmp_path, categories=[5, "4"]).tasks()} == {"4", "5"}
    assert [t.category for t in locomo(tmp_path, categories=5).tasks()] == ["5"]
    env = locomo(tmp_path)
    tasks = {t.task_id: t for t in env.tasks()}
    assert env.score("That is not mentioned anywhere.", tasks["conv-a/qa3"]) == Scores(1.0, 1.0, 1.0)
    assert env.score("Rex", tasks["conv-a/qa3"]) == Scores(0.0, 0.0, 0.0)
    # category 3: the gold is cut at ';' -> "9 May 2023"
    assert env.score("9 May 2023", tasks["conv-a/qa1"]) == Scores(1.0, 1.0, 1.0)
    # category 1: mean over gold parts of the best part of the prediction: (1 + 0) / 2
    assert env.score("painting", tasks["conv-a/qa2"]).f1 == 0.5


# --- longmemeval ----------------------------------------------------------------------------------


def longmemeval(tmp_path, chunk_tokens=40, **knobs):
    path = write_json(tmp_path / "lme.json", longmemeval_records())
    return load_env(
        "longmemeval", data_path=path, count_tokens=words, chunk_tokens=chunk_tokens, seed=0, **knobs
    )


def test_longmemeval_sessions_by_date_evidence_and_answers(tmp_path):
    tasks = {t.task_id: t for t in longmemeval(tmp_path).tasks()}
    lm1 = tasks["lm1"]
    assert lm1.chunks == [
        "Chat session on 2023/04/11 (Tue) 07:47:\nuser: Any tips for baking bread?\n"
        "assistant: Use a hot oven and good flour.",
        "Chat session on 2023/09/30 (Sat) 08:34:\nuser: I earned $420 at the market today.\nassistant: Well done!",
    ]
    assert lm1.question == "How much did I earn at the market? (asked on 2023/10/02 (Mon) 04:40)"
    assert lm1.evidence == ["answer_1"] and lm1.evidence_chunks == [1] and lm1.category == "knowledge-update"
    assert all("answer_1" not in c for c in lm1.chunks)
    assert tasks["lm2"].answers == ["3"] and tasks["lm2"].evidence_chunks == [0]
    assert tasks["lm3_abs"].metadata["abstention"] is True


def test_longmemeval_marks_the_has_answer_piece_of_a_split_session(tmp_path):
    lm1 = next(t for t in longmemeval(tmp_path, chunk_tokens=14).tasks() if t.task_id == "lm1")
    assert lm1.evidence_chunks == [i for i, c in enumerate(lm1.chunks) if "$420" in c]
    assert len(lm1.evidence_chunks) == 1 and len(lm1.chunks) == 4


def test_longmemeval_filler_sessions_from_other_questions_no_later_than_the_question(tmp_path):
    tasks = {t.task_id: t for t in longmemeval(tmp_path, context_tokens=1000).tasks()}
    assert tasks["lm1"].metadata["sessions"] == ["answer_2", "s3a", "s3b", "other_1", "answer_1"]
    assert tasks["lm2"].metadata["sessions"] == ["answer_2"]  # every other session is dated later
    assert tasks["lm3_abs"].metadata["sessions"] == ["answer_2", "s3a", "s3b"]
    small = {t.task_id: t for t in longmemeval(tmp_path, context_tokens=30).tasks()}
    assert len(small["lm1"].metadata["sessions"]) < 5


def test_fixture_files_are_plain_official_json(tmp_path):
    for name in ENV_NAMES[1:]:
        path = write_fixture(name, tmp_path)
        if path.suffix == ".jsonl":
            assert all(json.loads(line) for line in path.read_text().splitlines())
        elif name != "needle":  # a plain-text filler
            assert json.loads(path.read_text())


def test_synthetic_name_splits_share_no_name():
    """``names=train`` and ``names=heldout`` keep disjoint halves of the name stems, so no held-out task
    shares a name (or a stem) with any training task, whatever the seeds; both halves use the same letters
    (no shift of initials); ``names=any`` is the default's exact tasks."""
    import re

    from envs.synthetic import _CONSONANTS, _SUFFIXES, name_split

    suffixes = sorted({x for xs in _SUFFIXES.values() for x in xs if x}, key=len, reverse=True)

    def stem(name: str) -> str:
        low = name.lower()
        return next((low[: -len(x)] for x in suffixes if low.endswith(x) and len(low) - len(x) == 4), low)

    def names(split: str, seed: int) -> set[str]:
        env = load_env("synthetic", count_tokens=lambda t: len(t.split()), chunk_tokens=64, seed=seed, level=3,
                       names=split)
        found = set()
        for t in env.tasks(20):
            found |= set(re.findall(r"\b[A-Z][a-z]{3,}\b", " ".join(t.chunks) + " " + t.question))
        return {n for n in found if stem(n) != n.lower() or len(n) == 4} - {"Which", "What", "Where", "When"}

    train = names("train", 0) | names("train", 1)
    held = names("heldout", 1000)
    assert len(train) > 100 and len(held) > 50
    assert not ({stem(n) for n in train} & {stem(n) for n in held})
    assert {name_split(stem(n)) for n in train} == {"train"}
    assert {name_split(stem(n)) for n in held} == {"heldout"}
    # the same initials on both sides (the old split by first letter was a distribution shift of its own)
    assert {n[0].lower() for n in train} == {n[0].lower() for n in held} == set(_CONSONANTS)
    kw = dict(count_tokens=lambda t: len(t.split()), chunk_tokens=64, seed=3, level=2)
    assert load_env("synthetic", **kw).tasks(5) == load_env("synthetic", names="any", **kw).tasks(5)
    with pytest.raises(EnvError, match="knob names must be one of any, train, heldout"):
        load_env("synthetic", names="test", **kw)

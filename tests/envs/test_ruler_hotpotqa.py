"""RULER-HotpotQA (MemAgent's construction): document counts, the exact rendering, seeded determinism,
gold paragraphs always present, length growing with ``docs``, the ``docs`` errors, facts and MemAgent's
three metrics (the real file when ../shared/data is present)."""

from __future__ import annotations

import pytest
from fixtures_envs import hotpotqa_records, ruler_hotpotqa_records, words, write_json

from envs import EnvError, Scores, load_env


def ruler(path, docs=50, seed=0, chunk_tokens=10_000):
    return load_env("ruler_hotpotqa", data_path=path, count_tokens=words, chunk_tokens=chunk_tokens, seed=seed,
                    docs=docs)


@pytest.fixture
def big(tmp_path):
    return write_json(tmp_path / "hotpot.json", ruler_hotpotqa_records())  # 17 questions, 51 distinct titles


def gold_titles(task):
    return {title for title, _ in task.metadata["supporting_facts"]}


def test_rendering_is_memagents_document_blocks(tmp_path):
    records = [
        {"_id": "q1", "question": "Where is Oda?", "answer": "Pell", "type": "bridge", "level": "easy",
         "supporting_facts": [["Oda", 1]],
         "context": [["Oda", ["Oda is a town.", " It lies in Pell."]], ["Umo", ["Umo is a hill."]]]},
        {"_id": "q2", "question": "What is Rin?", "answer": "a lake", "type": "bridge", "level": "easy",
         "supporting_facts": [["Rin", 0]], "context": [["Rin", ["Rin is a lake."]]]},
    ]
    path = write_json(tmp_path / "h.json", records)
    sentences = {title: "".join(text) for r in records for title, text in r["context"]}
    for task in ruler(path, docs=3).tasks():
        titles = task.metadata["titles"]
        assert sorted(titles) == ["Oda", "Rin", "Umo"] and task.metadata["docs"] == 3
        # "Document {i}:\n{title}\n{''.join(sentences)}", blocks joined by a blank line; one chunk holds all
        assert task.chunks == ["\n\n".join(f"Document {i + 1}:\n{t}\n{sentences[t]}" for i, t in enumerate(titles))]
    q1 = next(t for t in ruler(path, docs=3).tasks() if t.task_id == "q1")
    assert "Oda\nOda is a town. It lies in Pell." in q1.chunks[0]
    assert [f.text for f in q1.facts] == ["It lies in Pell."] and q1.evidence == ["It lies in Pell."]


@pytest.mark.parametrize("docs", [2, 3, 5, 9, 20, 51])
def test_exactly_docs_documents_with_distinct_titles_and_the_gold_ones(big, docs):
    tasks = ruler(big, docs=docs).tasks()
    assert len(tasks) == 17
    for task in tasks:
        titles = task.metadata["titles"]
        assert len(titles) == docs and len(set(titles)) == docs
        assert gold_titles(task) <= set(titles)
        text = "\n\n".join(task.chunks)
        assert [f"Document {i}:" in text for i in range(1, docs + 2)] == [True] * docs + [False]


def test_own_distractors_come_before_other_questions_paragraphs(big):
    # hp1 has 4 paragraphs (2 gold); with docs=4 all four are its own, as in MemAgent (own context first)
    hp1 = next(t for t in ruler(big, docs=4).tasks() if t.task_id == "hp1")
    assert sorted(hp1.metadata["titles"]) == ["Kilmar", "Mordo", "Rasten", "Velo"]


def test_seeded_determinism(big):
    first = ruler(big, docs=9).tasks()
    assert first == ruler(big, docs=9).tasks()
    other = ruler(big, docs=9, seed=1).tasks()
    assert {t.task_id for t in first} == {t.task_id for t in other}
    assert [t.task_id for t in first] != [t.task_id for t in other]
    by_id = {t.task_id: t for t in other}
    assert any(t.metadata["titles"] != by_id[t.task_id].metadata["titles"] for t in first)
    assert ruler(big, docs=9).tasks(3) == first[:3]


def test_length_grows_with_docs_and_smaller_contexts_are_subsets(big):
    sizes = [3, 6, 12, 25, 51]
    runs = [{t.task_id: t for t in ruler(big, docs=n).tasks()} for n in sizes]
    for task_id in runs[0]:
        lengths = [words("\n".join(run[task_id].chunks)) for run in runs]
        assert lengths == sorted(set(lengths)), lengths  # strictly increasing
        titles = [set(run[task_id].metadata["titles"]) for run in runs]
        assert all(a < b for a, b in zip(titles, titles[1:], strict=False))


def test_docs_errors_name_the_file_and_the_numbers(big):
    with pytest.raises(EnvError, match=r"docs=52 is more than the 51 distinct paragraphs \(by title\)") as err:
        ruler(big, docs=52)
    assert str(err.value).startswith(f"{big}: ")
    with pytest.raises(EnvError, match=r"record 0 \(_id 'hp1'\): knob docs=1 is fewer than its 2 supporting "
                                       r"paragraphs") as err:
        ruler(big, docs=1)
    assert str(err.value).startswith(f"{big}: record 0")
    with pytest.raises(EnvError, match="docs must be an integer >= 1"):
        ruler(big, docs=0)


def test_facts_are_the_supporting_sentences_with_their_chunks(tmp_path):
    path = write_json(tmp_path / "h.json", hotpotqa_records())
    tasks = {t.task_id: t for t in ruler(path, docs=9, chunk_tokens=12).tasks()}
    hp1 = tasks["hp1"]
    # ["Rasten", 9] points past the paragraph: skipped
    assert sorted(f.text for f in hp1.facts) == ["Rasten lies on a river.", "Velo is a country whose capital is Rasten."]
    assert [f.chunk for f in hp1.facts] == sorted(f.chunk for f in hp1.facts)
    for task in tasks.values():
        assert all(words(c) <= 12 for c in task.chunks)
        for fact in task.facts:
            assert fact.text.split()[-1] in task.chunks[fact.chunk]
            assert fact.chunk in task.evidence_chunks
    assert [f.text for f in tasks["hp3"].facts] == ["Sendo fact 2 is stated here."]


def test_scores_are_memagents_f1_em_and_two_way_sub_em(tmp_path):
    env = ruler(write_json(tmp_path / "h.json", hotpotqa_records()), docs=9)
    tasks = {t.task_id: t for t in env.tasks()}
    vey, rasten, yes = tasks["hp3"], tasks["hp1"], tasks["hp2"]  # golds "the Vey", "Rasten", "yes"
    assert env.score("The Vey.", vey) == Scores(f1=1.0, em=1.0, sub_em=1.0)
    # "vey river" vs "vey": P = 1/2, R = 1, F1 = 2/3; the gold is inside the prediction
    assert env.score("Vey river", vey) == Scores(f1=2 / 3, em=0.0, sub_em=1.0)
    # MemAgent's sub-EM also counts a prediction inside the gold; token F1 does not
    assert env.score("Rast", rasten) == Scores(f1=0.0, em=0.0, sub_em=1.0)
    assert env.score("", rasten) == Scores(f1=0.0, em=0.0, sub_em=0.0)
    assert env.score("Yes", yes) == Scores(f1=1.0, em=1.0, sub_em=1.0)
    assert env.score("yes they were", yes) == Scores(f1=0.0, em=0.0, sub_em=1.0)  # HotpotQA's yes/no rule


# --- the real file (skipped when ../shared/data is absent) -----------------------------------------


def chars(text: str) -> int:
    return len(text) // 4 + 1  # about four characters a token


def test_real_lengths_grow_and_50_docs_is_about_7k_tokens(shared_data):
    path = shared_data / "hotpotqa/hotpot_dev_distractor_v1_first103.json"
    runs = {n: ruler(path, docs=n, chunk_tokens=512, seed=3).tasks(4) for n in (50, 100, 200)}
    for tasks in zip(*runs.values(), strict=True):
        assert len({t.task_id for t in tasks}) == 1
        assert [len(t.metadata["titles"]) for t in tasks] == [50, 100, 200]
        assert all(gold_titles(t) <= set(t.metadata["titles"]) for t in tasks)
        sizes = [sum(chars(c) for c in t.chunks) for t in tasks]
        assert sizes == sorted(sizes)
        assert 5_000 < sizes[0] < 9_500  # MemAgent: about 7K tokens at 50 documents
        assert all(t.facts for t in tasks)
    with pytest.raises(EnvError, match="docs=1022 is more than the 1021 distinct paragraphs"):
        ruler(path, docs=1022)

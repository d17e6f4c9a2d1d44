"""``Task.facts`` of every environment: the evidence as text, in reading order, each with the chunk after
which it has been read whole (exact values on small inline fixtures; the real files when present)."""

from __future__ import annotations

import pytest
from fixtures_envs import locomo_records, longmemeval_records, make, squad_records, words, write_json

from agentmem.records import Fact
from envs import ENV_NAMES, load_env


def facts(task) -> list[tuple[int, str]]:
    return [(f.chunk, f.text) for f in task.facts]


def tasks_of(name, path, chunk_tokens, seed=0, **knobs):
    env = load_env(name, data_path=path, count_tokens=words, chunk_tokens=chunk_tokens, seed=seed, **knobs)
    return {t.task_id: t for t in env.tasks()}


@pytest.mark.parametrize("name", ENV_NAMES)
def test_facts_are_in_reading_order_and_point_at_chunks(name, tmp_path):
    for task in make(name, tmp_path).tasks():
        chunks = [f.chunk for f in task.facts]
        assert chunks == sorted(chunks) and all(0 <= c < len(task.chunks) for c in chunks)
        assert all(isinstance(f, Fact) and f.text == f.text.strip() and f.text for f in task.facts)
        read = "\n".join(task.chunks)
        assert all(f.text.split()[-1] in task.chunks[f.chunk] and f.text.split()[0] in read for f in task.facts)


def test_hotpotqa_facts_are_the_supporting_sentences(tmp_path):
    from fixtures_envs import hotpotqa_records

    tasks = tasks_of("hotpotqa", write_json(tmp_path / "h.json", hotpotqa_records()), 30)
    # ["Rasten", 9] points past the paragraph: no fact; a first sentence carries no title
    assert facts(tasks["hp1"]) == [(1, "Rasten lies on a river."), (2, "Velo is a country whose capital is Rasten.")]
    assert facts(tasks["hp2"]) == [(2, "Bo Rik was a painter too."), (3, "Anna Tol was a painter.")]
    assert facts(tasks["hp3"]) == [(0, "Sendo fact 2 is stated here.")]


def test_squad_fact_is_the_answer_sentence_where_it_ends(tmp_path):
    path = write_json(tmp_path / "s.json", squad_records())
    tasks = tasks_of("squad", path, 8, seed=0, docs=1)
    assert facts(tasks["sq1"]) == [(0, "The Denver Broncos won the game.")]
    assert facts(tasks["sq2"]) == [(1, "It was played in Santa Clara.")]
    # a sentence split over two chunks is read whole after the second
    assert tasks["sq3"].chunks == ["Super Bowl: The halftime show had Coldplay as", "the headliner."]
    assert facts(tasks["sq3"]) == [(1, "The halftime show had Coldplay as the headliner.")]
    assert facts(tasks["sq4"]) == [(0, "The Rhine flows through six countries.")]


def test_squad_fact_spans_an_abbreviation_and_needs_an_offset(tmp_path):
    context = "The bank was founded by John D. Rockefeller in 1890. It grew fast."
    data = {"version": "1.1", "data": [{"title": "Banks", "paragraphs": [{"context": context, "qas": [
        {"id": "a", "question": "Who founded it?",
         "answers": [{"text": "John D. Rockefeller", "answer_start": context.index("John")}]},
        {"id": "b", "question": "How did it grow?", "answers": [{"text": "fast", "answer_start": 61}]},
        {"id": "c", "question": "When?", "answers": [{"text": "1890"}]},  # no offset: no fact
        {"id": "d", "question": "When?", "answers": [{"text": "1890", "answer_start": 999}]},
    ]}]}]}
    tasks = tasks_of("squad", write_json(tmp_path / "s.json", data), 100)
    assert facts(tasks["a"]) == [(0, "The bank was founded by John D. Rockefeller in 1890.")]
    assert facts(tasks["b"]) == [(0, "It grew fast.")]
    assert tasks["c"].facts == [] and tasks["d"].facts == []


def test_locomo_facts_are_the_evidence_turns_as_rendered(tmp_path):
    tasks = tasks_of("locomo", write_json(tmp_path / "l.json", locomo_records()), 40)
    assert facts(tasks["conv-a/qa0"]) == [(1, "Ana: I adopted a dog named Rex.")]
    assert facts(tasks["conv-a/qa2"]) == [(0, "Ana: Hi Ben! I started painting."), (1, "Ana: I adopted a dog named Rex.")]
    assert facts(tasks["conv-a/qa4"]) == [(1, "Ana: I adopted a dog named Rex.")]  # D9:9 names no turn: no fact


def test_locomo_ids_with_leading_zeros_name_their_turn(tmp_path):
    records = locomo_records()
    conversation = records[0]["conversation"]
    conversation["session_1"][1]["dia_id"] = "D1:02"  # a zero in the file's own turn id
    qa = records[0]["qa"]
    qa[0]["evidence"] = ["D2:03"]
    qa[1]["evidence"] = ["D01:2", "D2:01"]
    qa[2]["evidence"] = ["D2:1; D2:01"]  # one turn named twice: one fact
    tasks = tasks_of("locomo", write_json(tmp_path / "l.json", records), 40)
    assert tasks["conv-a/qa0"].evidence == ["D2:03"] and tasks["conv-a/qa0"].evidence_chunks == [1]
    assert facts(tasks["conv-a/qa0"]) == [(1, "Ana: A beagle. [shares a photo of a beagle]")]
    assert tasks["conv-a/qa1"].evidence_chunks == [0, 1]
    assert facts(tasks["conv-a/qa1"]) == [(0, "Ben: Great, what do you paint?"), (1, "Ana: I adopted a dog named Rex.")]
    assert facts(tasks["conv-a/qa2"]) == [(1, "Ana: I adopted a dog named Rex.")]


def test_locomo_fact_of_a_split_session_is_in_its_own_chunk(tmp_path):
    tasks = tasks_of("locomo", write_json(tmp_path / "l.json", locomo_records()), 16)
    assert facts(tasks["conv-b/qa0"]) == [(0, "Cy: I moved to Oslo.")]


def test_longmemeval_facts_are_the_has_answer_turns(tmp_path):
    path = write_json(tmp_path / "m.json", longmemeval_records())
    tasks = tasks_of("longmemeval", path, 40)
    assert facts(tasks["lm1"]) == [(1, "user: I earned $420 at the market today.")]
    assert tasks["lm2"].facts == [] and tasks["lm3_abs"].facts == []  # no turn marked has_answer
    filled = tasks_of("longmemeval", path, 40, context_tokens=1000)
    assert facts(filled["lm1"]) == [(4, "user: I earned $420 at the market today.")]  # after 4 filler sessions
    split = tasks_of("longmemeval", path, 14)
    assert facts(split["lm1"]) == [(2, "user: I earned $420 at the market today.")]
    assert split["lm1"].evidence_chunks == [2]


# --- the real files (skipped when ../shared/data is absent) ----------------------------------------


def test_real_facts(shared_data):
    hotpot = tasks_of("hotpotqa", shared_data / "hotpotqa/hotpot_dev_distractor_v1_first103.json", 200)
    assert facts(hotpot["5a8b57f25542995d1e6f1371"]) == [
        (0, "Scott Derrickson (born July 16, 1966) is an American director, screenwriter and producer."),
        (2, "Edward Davis Wood Jr. (October 10, 1924 – December 10, 1978) was an American filmmaker, actor, "
            "writer, producer, and director."),
    ]
    assert all(t.facts for t in hotpot.values())
    locomo = tasks_of("locomo", shared_data / "locomo/locomo_dev6.json", 512)
    assert facts(locomo["conv-26/qa0"]) == [
        (0, "Caroline: I went to a LGBTQ support group yesterday and it was so powerful.")]
    assert [f.chunk for f in locomo["conv-26/qa37"].facts] == [10, 13]  # "D8:6; D9:17"
    assert locomo["conv-26/qa37"].facts[0].text.endswith("[shares a photo of a painting of a sunset with a palm tree]")
    lme = tasks_of("longmemeval", shared_data / "longmemeval/longmemeval_oracle_dev60.json", 512)
    assert [f.chunk for f in lme["0db4c65d"].facts] == [0, 7]
    assert all(t.facts for t in lme.values())
    squad = load_env("squad", data_path=shared_data / "squad/dev-v1.1.json", count_tokens=words, chunk_tokens=256,
                     seed=0).tasks(300)
    assert facts(squad[0]) == [(4, "30 US states have banned corporal punishment, the others (mostly in the South) "
                                   "have not.")]
    assert all(any(a in t.facts[0].text for a in t.answers) for t in squad)

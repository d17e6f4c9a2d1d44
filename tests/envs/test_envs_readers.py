"""Readers of official files: MuSiQue (JSON lines, or one JSON array), 2WikiMultihopQA (JSON) and QuALITY
(QuALITY's own JSON lines and L-Eval's), each on a tiny sample in the official schema written here: exact
chunks, answers, facts and scores, strict option parsing, and errors naming the file and line (or record)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from fixtures_envs import musique_records, quality_records, twowiki_records, words, write_json, write_jsonl

from agentmem.agent.memory import Call
from agentmem.agent.oracle import OracleWriter
from agentmem.agent.overwrite import UPDATE, OverwritePolicy
from agentmem.agent.prompts import EMPTY_MEMORY, Prompt
from agentmem.config import AgentConfig
from agentmem.jobs.eval import f1_by_category
from agentmem.records import Episode
from envs import EnvError, Scores, load_env
from envs.metrics import f1_score, squad2_exact, squad2_f1
from envs.quality import parse_choice


def env_of(name, path, chunk_tokens=100, seed=0, **knobs):
    return load_env(name, data_path=path, count_tokens=words, chunk_tokens=chunk_tokens, seed=seed, **knobs)


def by_id(env):
    return {t.task_id: t for t in env.tasks()}


def facts(task):
    return [(f.chunk, f.text) for f in task.facts]


# --- MuSiQue --------------------------------------------------------------------------------------


def test_musique_answerable_only_by_default(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", musique_records())
    assert sorted(by_id(env_of("musique", path))) == ["2hop__11_22", "3hop1__33_44_55"]
    every = by_id(env_of("musique", path, answerable_only=False))
    assert sorted(every) == ["2hop__11_22", "2hop__66_77", "3hop1__33_44_55"]
    assert every["2hop__66_77"].metadata["answerable"] is False and every["2hop__66_77"].facts == []
    with pytest.raises(EnvError, match="knob answerable_only must be true or false, got 'yes'"):
        env_of("musique", path, answerable_only="yes")


def test_musique_context_answers_categories_and_facts(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", musique_records())
    task = by_id(env_of("musique", path))["2hop__11_22"]
    assert task.chunks == [
        "Noma: Noma is a river in the north of the land of Velo.\nZeta phone: The Zeta phone is made by Krell.\n"
        "Krell: Krell was founded by Ola Berg in 1990."
    ]
    assert task.answers == ["Ola Berg", "Berg", "O. Berg"] and task.category == "2hop"
    assert task.metadata["question_decomposition"][0]["answer"] == "Krell"
    # 13, 9 and 9 words: a 14-word budget puts each paragraph in its own chunk
    small = by_id(env_of("musique", path, chunk_tokens=14))
    assert facts(small["2hop__11_22"]) == [
        (1, "Zeta phone: The Zeta phone is made by Krell."),
        (2, "Krell: Krell was founded by Ola Berg in 1990."),
    ]
    assert small["2hop__11_22"].evidence_chunks == [1, 2]
    assert small["3hop1__33_44_55"].category == "3hop1" and len(small["3hop1__33_44_55"].facts) == 3


def test_musique_scores_are_squad2_max_over_answer_and_aliases(tmp_path):
    env = env_of("musique", write_jsonl(tmp_path / "m.jsonl", musique_records()))
    task = by_id(env)["2hop__11_22"]
    assert env.score("Berg", task) == Scores(1.0, 1.0, 1.0)  # an alias
    # "founder ola berg" vs "ola berg": P = 2/3, R = 1, F1 = 0.8
    assert env.score("founder Ola Berg", task) == Scores(f1=0.8, em=0.0, sub_em=1.0)
    # "ola" vs "ola berg": P = 1, R = 1/2, F1 = 2/3; no gold is inside "ola"
    assert env.score("Ola", task) == Scores(f1=2 / 3, em=0.0, sub_em=0.0)
    # SQuAD 2.0 differs from HotpotQA's script: no yes/no rule, and two empty answers agree
    assert squad2_f1("no way", "no") == 2 / 3 and f1_score("no way", "no") == 0.0
    assert squad2_f1("the", "an") == 1.0 and squad2_f1("", "x") == 0.0 and squad2_exact("The X!", "x") == 1.0


def test_musique_errors_name_the_file_and_line(tmp_path):
    records = musique_records()
    del records[1]["paragraphs"][1]["is_supporting"]
    path = write_jsonl(tmp_path / "m.jsonl", records)
    with pytest.raises(EnvError) as err:
        env_of("musique", path)
    assert str(err.value) == f"{path}: line 2 (id '3hop1__33_44_55') paragraphs[1]: missing field 'is_supporting'"
    broken = tmp_path / "b.jsonl"
    broken.write_text(json.dumps(musique_records()[0]) + "\n\n{oops\n", encoding="utf-8")
    with pytest.raises(EnvError, match=f"{broken}: not valid JSON on line 3"):
        env_of("musique", broken)
    records = musique_records()
    records[0]["answer_aliases"] = ["Berg", 7]
    with pytest.raises(EnvError, match=r"line 1 \(id '2hop__11_22'\): field 'answer_aliases'\[1\] must be a string"):
        env_of("musique", write_jsonl(tmp_path / "a.jsonl", records))


# --- 2WikiMultihopQA ------------------------------------------------------------------------------


def test_twowiki_context_in_file_order_and_supporting_sentences(tmp_path):
    path = write_json(tmp_path / "w.json", twowiki_records())
    tasks = by_id(env_of("2wikimultihopqa", path))
    w1 = tasks["2w1"]
    assert w1.chunks == [
        "Polish Blood: Polish Blood is a 1934 film. It was directed by Karel Lamac.\n"
        "Karel Lamac: Karel Lamac was a Czech director. His mother was Maria Rom.\n"
        "Lake Ovo: Lake Ovo is a lake. It is deep."
    ]
    assert w1.answers == ["Maria Rom"] and w1.category == "compositional"
    assert facts(w1) == [(0, "It was directed by Karel Lamac."), (0, "His mother was Maria Rom.")]
    assert w1.metadata["evidences"] == [["Polish Blood", "director", "Karel Lamac"], ["Karel Lamac", "mother", "Maria Rom"]]
    # paragraphs of 6+5, 6+5, 7 and 7 words: an 11-word budget gives one chunk each
    small = by_id(env_of("2wikimultihopqa", path, chunk_tokens=11))
    assert small["2w3"].chunks[1] == "Beta: Beta is a 1950 film. Its director was Bo Kim."
    assert facts(small["2w3"]) == [(0, "Its director was Ann Lee."), (1, "Its director was Bo Kim."),
                                   (2, "Ann Lee was born in France."), (3, "Bo Kim was born in Korea.")]
    # the seed orders the tasks and changes nothing else
    assert by_id(env_of("2wikimultihopqa", path, seed=5)) == tasks


def test_twowiki_types_are_categories_for_eval(tmp_path):
    env = env_of("2wikimultihopqa", write_json(tmp_path / "w.json", twowiki_records()))
    tasks = env.tasks()
    assert {t.category for t in tasks} == {"compositional", "comparison", "bridge_comparison", "inference"}
    predictions = {"2w1": "Maria Rom", "2w2": "Beta", "2w3": "No.", "2w4": "Ed"}
    episodes = [
        Episode(run_id="r", env=env.name, task_id=t.task_id, question=t.question, category=t.category,
                f1=env.score(predictions[t.task_id], t).f1)
        for t in tasks
    ]
    # "ed" vs "ed dun": P = 1, R = 1/2, F1 = 2/3
    assert f1_by_category(episodes) == {"bridge_comparison": 1.0, "comparison": 0.0, "compositional": 1.0,
                                        "inference": 2 / 3}
    w3 = next(t for t in tasks if t.task_id == "2w3")
    assert env.score("no, they are not", w3) == Scores(f1=0.0, em=0.0, sub_em=1.0)  # the yes/no rule


def test_twowiki_errors(tmp_path):
    records = twowiki_records()
    del records[1]["type"]
    path = write_json(tmp_path / "w.json", records)
    with pytest.raises(EnvError) as err:
        env_of("2wikimultihopqa", path)
    assert str(err.value) == f"{path}: record 1 (_id '2w2'): missing field 'type'"


# --- QuALITY --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prediction", "letter"),
    [
        ("(B)", "B"), ("(B) In spring", "B"), ("B", "B"), ("B.", "B"), ("B)", "B"), ("B) In spring", "B"),
        ("Answer: B", "B"), ("answer: (C) Gold", "C"), ("  ANSWER:B ", "B"), ("\n(D)\n", "D"),
        ("b", None), ("(b)", None), ("The answer is B", None), ("In spring", None), ("", None),
        ("B is right", None), ("Answer - B", None), ("BC", None), ("B, C", None), ("Option B", None),
    ],
)
def test_option_letters_are_parsed_strictly(prediction, letter):
    assert parse_choice(prediction) == letter


def test_quality_both_layouts_prompts_answers_and_chunks(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", quality_records())
    tasks = by_id(env_of("quality", path))
    assert sorted(tasks) == ["51201_X_1", "51201_X_2", "line2/q0", "line2/q1"]
    q1 = tasks["51201_X_1"]
    assert q1.question == "What did Vera find in the sand?\n(A) A map\n(B) A metal box\n(C) A library\n(D) A ship"
    assert q1.answers == ["(B) A metal box"] and q1.metadata["gold"] == "B"
    assert q1.metadata["format"] == "quality" and q1.metadata["difficult"] == 0
    assert q1.chunks == [
        "The ship landed on the red planet at dawn. Captain Vera stepped out first.\n"
        "She found a small metal box buried in the sand. Inside was a map of the old city.\n"
        "The crew followed the map for three days. At the end they found a library."
    ]
    assert tasks["51201_X_2"].chunks == q1.chunks and tasks["51201_X_2"].answers == ["(C) Three days"]
    tree = tasks["line2/q0"]
    assert tree.question == "When did Tom plant the tree?\n(A) In winter\n(B) In spring\n(C) In summer\n(D) In autumn"
    assert tree.answers == ["(B) In spring"] and tree.metadata["format"] == "leval"
    assert tree.chunks == ["Tom planted a tree in spring. By summer it was tall.\nIn autumn its leaves turned gold."]
    leaves = tasks["line2/q1"]  # an option that mentions "(A)" and "(B)" itself
    assert leaves.metadata["options"] == ["Red", "Brown", "Gold", "Both (A) and (B)"]
    assert leaves.answers == ["(C) Gold"]
    assert all(t.facts == [] and t.evidence == [] and t.evidence_chunks == [] for t in tasks.values())
    # sentences are units: a 12-word budget breaks the article between sentences
    small = by_id(env_of("quality", path, chunk_tokens=12))["51201_X_1"]
    assert small.chunks[:3] == ["The ship landed on the red planet at dawn.", "Captain Vera stepped out first.",
                                "She found a small metal box buried in the sand."]


def test_quality_score_is_accuracy_in_every_field(tmp_path):
    env = env_of("quality", write_jsonl(tmp_path / "q.jsonl", quality_records()))
    tree = by_id(env)["line2/q0"]
    assert env.score("(B) In spring", tree) == Scores(1.0, 1.0, 1.0)
    assert env.score("Answer: B", tree) == Scores(1.0, 1.0, 1.0)
    assert env.score("In spring", tree) == Scores(0.0, 0.0, 0.0)  # the text without a letter is wrong
    assert env.score("(A) In spring", tree) == Scores(0.0, 0.0, 0.0)


def test_quality_oracle_writes_the_empty_memory_text_and_answers_gold(tmp_path):
    """QuALITY has no evidence: every update writes what the prompt shows for an empty memory (never a bare
    end-of-sequence), and the answer call the gold option."""
    env = env_of("quality", write_jsonl(tmp_path / "q.jsonl", quality_records()))
    task = by_id(env)["51201_X_1"]
    tokenizer = SimpleNamespace(eos_token_id=0, encode=lambda text, add_special_tokens=False: [ord(c) for c in text])
    # the overwrite policy's oracle_text
    oracle = OracleWriter(tokenizer, OverwritePolicy(tokenizer, AgentConfig(memory_tokens=64)))
    prompt = Prompt(ids=[1], text="p")
    update = Call(kind=UPDATE, prompt=prompt, max_new_tokens=64, chunk_text=task.chunks[0], chunk_index=0)
    assert oracle.text(update, task) == EMPTY_MEMORY == "(empty)"
    answer = oracle.text(Call(kind="answer", prompt=prompt, max_new_tokens=64, final=True), task)
    assert answer == "(B) A metal box" and env.score(answer, task) == Scores(1.0, 1.0, 1.0)


def test_quality_errors_name_the_file_and_line(tmp_path):
    records = quality_records()
    lines = [records[0], {"text": "a story", "question": "?"}, records[1]]
    path = write_jsonl(tmp_path / "q.jsonl", lines)
    with pytest.raises(EnvError) as err:
        env_of("quality", path)
    assert str(err.value) == (f"{path}: line 2 is neither a QuALITY record (article, questions) nor an L-Eval "
                              f"record (input, instructions, outputs)")
    records = quality_records()
    del records[0]["questions"][1]["gold_label"]
    with pytest.raises(EnvError) as err:
        env_of("quality", write_jsonl(tmp_path / "g.jsonl", records))
    assert str(err.value).endswith("line 1 (article_id '51201') questions[1]: missing field 'gold_label' "
                                   "(QuALITY's test split has no labels)")
    records = quality_records()
    records[1]["outputs"][0] = "In spring"
    with pytest.raises(EnvError, match=r"line 2 \(source 'quality'\) instructions\[0\]: output 'In spring' does "
                                       r"not start with one of its options' letters"):
        env_of("quality", write_jsonl(tmp_path / "o.jsonl", records))
    records = quality_records()
    records[1]["instructions"][1] = "What colour did the leaves turn?"
    with pytest.raises(EnvError, match=r"instructions\[1\]: the instruction must be a question then options"):
        env_of("quality", write_jsonl(tmp_path / "i.jsonl", records))
    records = quality_records()
    records[1]["outputs"].pop()
    with pytest.raises(EnvError, match=r"fields 'instructions' and 'outputs' differ in length \(2, 1\)"):
        env_of("quality", write_jsonl(tmp_path / "n.jsonl", records))
    records = quality_records()
    records[0]["questions"][0]["gold_label"] = 5
    with pytest.raises(EnvError, match=r"questions\[0\]: field 'gold_label' must be 1 to 4, got 5"):
        env_of("quality", write_jsonl(tmp_path / "l.jsonl", records))


def test_musique_reads_a_json_array_like_json_lines(tmp_path):
    lines = write_jsonl(tmp_path / "m.jsonl", musique_records())
    array = tmp_path / "m.json"
    array.write_text(json.dumps(musique_records(), indent=1))
    assert env_of("musique", array).tasks() == env_of("musique", lines).tasks()


def test_musique_array_errors_name_the_record(tmp_path):
    records = musique_records()
    del records[1]["paragraphs"]
    array = tmp_path / "m.json"
    array.write_text(json.dumps(records))
    with pytest.raises(EnvError, match=rf"m.json: record 1 \(id '{records[1]['id']}'\): missing field 'paragraphs'"):
        env_of("musique", array)

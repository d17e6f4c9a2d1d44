"""The synthetic ladder's question forms (``forms``: entity, yesno, number, mixed) and how the project's F1/EM
score yes/no and number answers."""

from __future__ import annotations

import pytest

from envs.errors import EnvError
from envs.metrics import score_answer
from envs.registry import load_env


def words(text: str) -> int:
    return len(text.split())


def env(level: int, forms: str | None = None, seed: int = 7):
    knobs = {} if forms is None else {"forms": forms}
    return load_env("synthetic", count_tokens=words, chunk_tokens=40, seed=seed, level=level, **knobs)


def test_the_default_form_is_the_entity_form_task_for_task():
    assert env(3).tasks(6) == env(3, "entity").tasks(6)


def test_yes_no_questions_name_the_true_end_or_a_name_no_fact_states():
    tasks = env(3, "yesno").tasks(3)
    assert [(t.question, t.answers) for t in tasks] == [
        ("Was the mentor of Nipa born in Binoton?", ["no"]),
        ("Was the mentor of Gubi born in Lomaport?", ["yes"]),
        ("Is the company that Furi works for headquartered in Povuton?", ["no"]),
    ]
    assert tasks[1].evidence == ["Nedu is the mentor of Gubi.", "Nedu was born in Lomaport."]
    assert all(t.category == "2-hop yesno" for t in tasks)
    text = " ".join(tasks[0].chunks)
    assert "Binoton" not in text  # a "no" names an entity that no sentence mentions


def test_number_questions_end_the_chain_with_a_number_and_distractors_state_numbers_too():
    (task,) = env(2, "number").tasks(1)
    assert (task.question, task.answers, task.evidence) == ("How old is Tino?", ["23"], ["Tino is 23 years old."])
    text = " ".join(task.chunks)
    assert "Tino is 23 years old." in text and text.count(" years old.") == 4  # the fact and 3 distractors
    (two,) = env(3, "number").tasks(1)
    assert two.evidence == ["Tino works for Duzadyne.", "Duzadyne has 93 employees."] and two.answers == ["93"]
    assert sorted(f.text for f in two.facts) == sorted(two.evidence)  # facts: in reading order


def test_mixed_draws_every_form():
    forms = [t.category.partition(" ")[2] or "entity" for t in env(1, "mixed").tasks(30)]
    assert set(forms) == {"entity", "yesno", "number"}


def test_an_unknown_form_is_refused():
    with pytest.raises(EnvError, match="knob forms must be one of entity, yesno, number, mixed"):
        env(1, "choice")


@pytest.mark.parametrize(("prediction", "gold", "f1", "em", "sub_em"), [
    ("Yes.", "yes", 1.0, 1.0, 1.0),
    ("no", "yes", 0.0, 0.0, 0.0),
    ("No, he does not.", "no", 0.0, 0.0, 1.0),  # HotpotQA F1: a yes/no gold takes nothing but the word
    ("yes", "Farecorp", 0.0, 0.0, 0.0),
    ("23", "23", 1.0, 1.0, 1.0),
    ("23.", "23", 1.0, 1.0, 1.0),
    ("23 years old", "23", 0.5, 0.0, 1.0),
    ("He is 23 years old.", "23", 1 / 3, 0.0, 1.0),
    ("32", "23", 0.0, 0.0, 0.0),
    ("123", "23", 0.0, 0.0, 1.0),  # substring EM counts characters: a number inside another matches
])
def test_yes_no_and_numbers_score_under_the_project_normalisation(prediction, gold, f1, em, sub_em):
    s = score_answer(prediction, [gold])
    assert (s.f1, s.em, s.sub_em) == (pytest.approx(f1), em, sub_em)

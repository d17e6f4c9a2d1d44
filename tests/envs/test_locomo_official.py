"""LoCoMo's official F1 (snap-research/locomo ``task_eval/evaluation.py``): every token Porter-stemmed,
articles removed with ``regex``; the LoCoMo environment scores it by default, ``stem=False`` gives the
unstemmed variant. Expected values are worked out by hand from the Porter stems in the comments."""

from __future__ import annotations

import string
import subprocess
import sys
from collections import Counter

import pytest
import regex
from fixtures_envs import locomo_records, words, write_json
from nltk.stem import PorterStemmer

from envs import EnvError, Scores, load_env
from envs.metrics import locomo_f1, locomo_normalize, locomo_token_f1, porter_stem


def test_porter_stems_used_below():
    assert [porter_stem(w) for w in ("studies", "studying", "running", "ran", "dogs", "dog", "paintings")] == [
        "studi", "studi", "run", "ran", "dog", "dog", "paint"]


def test_stemmed_and_unstemmed_scores_differ():
    # studies -> studi, studying -> studi: one shared token of one each, F1 1
    assert locomo_token_f1("studies", "studying", porter_stem) == 1.0
    assert locomo_token_f1("studies", "studying") == 0.0
    # [run, dog] vs [ran, dog]: one shared; P = R = 1/2, F1 = 1/2
    assert locomo_token_f1("running dogs", "ran dog", porter_stem) == 0.5
    assert locomo_token_f1("running dogs", "ran dog") == 0.0
    # category 1: gold parts "ran dog" (best part "running dogs": 1/2) and "cat" ("cats": 1): mean 3/4
    assert locomo_f1("running dogs, cats", "ran dog, cat", 1, porter_stem) == 0.75
    assert locomo_f1("running dogs, cats", "ran dog, cat", 1) == 0.0
    # category 3: the gold is cut at ';' before stemming
    assert locomo_f1("studying", "studies; at night", 3, porter_stem) == 1.0


def official_f1(prediction: str, gold: str) -> float:
    """The official ``normalize_answer`` and ``f1_score``, transcribed."""
    ps = PorterStemmer()

    def normalize(s: str) -> str:
        s = s.replace(",", "").lower()
        s = "".join(ch for ch in s if ch not in set(string.punctuation))
        return " ".join(regex.sub(r"\b(a|an|the|and)\b", " ", s).split())

    pred = [ps.stem(w) for w in normalize(prediction).split()]
    ref = [ps.stem(w) for w in normalize(gold).split()]
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0
    p, r = same / len(pred), same / len(ref)
    return 2 * p * r / (p + r)


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [
        ("She studies painting and pottery", "studying paintings, pottery"),
        ("The running dogs!", "ran dog"),
        ("Café and the bar", "the café"),
        ("7 May, 2023", "on 7 May 2023"),
        ("Generously", "generous"),
        ("", "anything"),
    ],
)
def test_agrees_with_the_official_script(prediction, gold):
    assert locomo_token_f1(prediction, gold, porter_stem) == official_f1(prediction, gold)


def test_normalisation_uses_the_regex_module_like_the_official_script():
    assert locomo_normalize("Café, and the BAR an apple") == "café bar apple"


def test_locomo_env_scores_the_official_stemmed_f1_by_default(tmp_path):
    records = locomo_records()
    records[0]["qa"][0]["answer"] = "studying paintings"  # category 4
    path = write_json(tmp_path / "l.json", records)

    def env(**knobs):
        return load_env("locomo", data_path=path, count_tokens=words, chunk_tokens=40, seed=0, **knobs)

    official, plain = env(), env(stem=False)
    task = next(t for t in official.tasks() if t.task_id == "conv-a/qa0")
    # [studi, paint] on both sides
    assert official.score("studies painting", task) == Scores(f1=1.0, em=0.0, sub_em=0.0)
    # unstemmed: "studies painting" vs "studying paintings" share nothing
    assert plain.score("studies painting", task) == Scores(f1=0.0, em=0.0, sub_em=0.0)
    multi = next(t for t in official.tasks() if t.task_id == "conv-a/qa2")  # category 1, "painting, adopting"
    # gold parts [paint] and [adopt]; prediction parts "paints" -> [paint], "adopted" -> [adopt]: mean 1
    assert official.score("paints, adopted", multi).f1 == 1.0
    assert plain.score("paints, adopted", multi).f1 == 0.0
    with pytest.raises(EnvError, match="knob stem must be true or false"):
        env(stem="yes")


def test_importing_envs_does_not_import_nltk():
    code = "import sys, envs; envs.load_env; print('nltk' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

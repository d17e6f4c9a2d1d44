"""Answer metrics against values worked out by hand (the working is in the comments)."""

from __future__ import annotations

import numpy as np
import pytest

from envs.metrics import (
    Scores,
    bootstrap_ci,
    exact_match,
    f1_score,
    locomo_f1,
    locomo_normalize,
    mean_interval,
    normalize_answer,
    score_answer,
    substring_match,
)


def test_normalize_answer_is_the_squad_hotpotqa_one():
    # lower -> drop punctuation (the hyphen too, joining the words) -> drop articles -> collapse spaces
    assert normalize_answer("The  Eiffel-Tower, in PARIS!") == "eiffeltower in paris"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("theatre anthem") == "theatre anthem"  # articles only as whole words
    assert normalize_answer("  \t ") == ""


def test_f1_by_hand():
    # "eiffel tower" vs "eiffel tower in paris": 2 shared; P = 2/2, R = 2/4; F1 = 2PR/(P+R) = 2/3
    assert f1_score("the Eiffel tower", "Eiffel Tower in Paris") == 2 * 1.0 * 0.5 / 1.5
    assert f1_score("the Eiffel tower", "Eiffel Tower in Paris") == pytest.approx(2 / 3, abs=1e-15)
    # shared tokens count with multiplicity: min(2,1) cat + min(1,2) dog = 2; P = R = 2/3
    assert f1_score("cat cat dog", "cat dog dog") == pytest.approx(2 / 3, abs=1e-15)
    assert f1_score("Paris", "Lyon") == 0.0
    assert f1_score("", "Lyon") == 0.0
    assert f1_score("A Paris.", "paris") == 1.0


def test_f1_yes_no_noanswer_rule():
    assert f1_score("yes", "no") == 0.0
    assert f1_score("yes it is", "yes") == 0.0  # gold is "yes", prediction differs: 0, not 2/4
    assert f1_score("no", "no answer") == 0.0  # prediction is "no", gold differs
    assert f1_score("Yes!", "yes") == 1.0
    assert f1_score("noanswer", "noanswer") == 1.0


def test_em_and_substring_em():
    assert exact_match("The Cat.", "cat") == 1.0
    assert exact_match("cats", "cat") == 0.0
    assert substring_match("I think it is the Eiffel Tower.", "Eiffel Tower") == 1.0
    assert substring_match("Eiffel", "Eiffel Tower") == 0.0


def test_score_answer_maximises_each_metric_over_golds_separately():
    # vs "red barn": F1 = 2*(2/3)*1/(5/3) = 0.8, substring 1; vs "big red barn house": P = 1, R = 3/4, F1 = 6/7
    scores = score_answer("the big red barn", ["red barn", "big red barn house"])
    assert scores.em == 0.0 and scores.sub_em == 1.0
    assert scores.f1 == pytest.approx(6 / 7, abs=1e-15)
    assert score_answer("Denver", ["Denver Broncos", "denver"]) == Scores(f1=1.0, em=1.0, sub_em=1.0)
    with pytest.raises(ValueError, match="at least one gold"):
        score_answer("x", [])


def test_locomo_normalisation_drops_commas_and_and():
    assert locomo_normalize("Pottery, painting and the beach!") == "pottery painting beach"


def test_locomo_f1_per_category_rules():
    # 1: golds [pottery, painting, camping], prediction parts [pottery, camping]: (1 + 0 + 1) / 3
    assert locomo_f1("pottery, camping", "Pottery, painting, camping", 1) == pytest.approx(2 / 3, abs=1e-15)
    # 2: [on, 7, may, 2023] vs [7, may, 2023]: P = 3/4, R = 1, F1 = 6/7
    assert locomo_f1("on 7 May 2023", "7 May 2023", "2") == pytest.approx(6 / 7, abs=1e-15)
    # 3: gold cut at ';' -> "Likely yes"; [yes] vs [likely, yes]: P = 1, R = 1/2, F1 = 2/3 (no yes/no rule)
    assert locomo_f1("yes", "Likely yes; she enjoys it", 3) == pytest.approx(2 / 3, abs=1e-15)
    # 4: "and" is dropped from the gold: [adoption, agencies] vs [adoption, agencies, counseling]: F1 = 0.8
    assert locomo_f1("Adoption agencies", "adoption agencies and counseling", 4) == pytest.approx(
        0.8, abs=1e-15
    )
    # 5: adversarial: does the prediction say the answer is absent?
    assert locomo_f1("That is not mentioned in the conversation.", "Not mentioned", 5) == 1.0
    assert locomo_f1("No information available", "x", "5") == 1.0
    assert locomo_f1("Rex", "Not mentioned in the conversation", 5) == 0.0
    with pytest.raises(ValueError, match="unknown LoCoMo category '6'"):
        locomo_f1("a", "b", 6)


def test_locomo_f1_takes_a_stemmer_like_the_official_porter_one():
    assert locomo_f1("dogs", "dog", 4) == 0.0
    assert locomo_f1("dogs", "dog", 4, stem=lambda w: w.removesuffix("s")) == 1.0


def test_mean_interval_is_one_function_of_the_scores_whatever_their_order():
    rng = np.random.default_rng(1)
    scores = list(rng.random(64))
    assert mean_interval(scores) == mean_interval(scores[::-1]) == mean_interval(sorted(scores))
    assert mean_interval(scores) == bootstrap_ci(sorted(scores))
    assert mean_interval([1.0, None, 0.5]) == bootstrap_ci([0.0, 0.5, 1.0])  # a failed episode counts 0


def test_bootstrap_ci():
    assert bootstrap_ci([0.25] * 7) == (0.25, 0.25)
    values = np.r_[np.zeros(50), np.ones(50)]
    lo, hi = bootstrap_ci(values, n=500, seed=3)
    assert 0.0 <= lo < 0.5 < hi <= 1.0 and (lo, hi) == bootstrap_ci(values, n=500, seed=3)
    # the 95% interval of a mean of 100 fair coin flips is about 0.5 +- 1.96 * 0.05
    assert lo == pytest.approx(0.40, abs=0.03) and hi == pytest.approx(0.60, abs=0.03)
    assert bootstrap_ci(np.ones(20_000) * 0.5, n=200) == (0.5, 0.5)  # large inputs are resampled in blocks
    with pytest.raises(ValueError, match="non-empty"):
        bootstrap_ci([])


def test_cluster_bootstrap_pairs_and_resamples_seeds_and_questions():
    from envs.metrics import cluster_bootstrap

    a = {"l1": np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]]), "l2": np.array([[0.5, 0.5], [0.5, 1.0]])}
    point, lo, hi = cluster_bootstrap(a, n=500)
    assert point == pytest.approx((1 + 0 + 1 + 0 + 0 + 1 + 0.5 + 0.5 + 0.5 + 1.0) / 10)  # every cell, equal weight
    assert lo <= point <= hi
    shifted = {k: v + 0.25 for k, v in a.items()}
    assert cluster_bootstrap(shifted, a, n=200) == pytest.approx((0.25, 0.25, 0.25))  # paired: a constant gap
    base = {"l1": np.array([0.0, 0.0, 1.0]), "l2": np.array([0.5, 0.5])}  # one row: broadcast to the seeds
    d, dlo, dhi = cluster_bootstrap(a, base, n=500)
    assert d == pytest.approx(point - (0 + 0 + 1 + 0.5 + 0.5) / 5)
    assert dlo <= d <= dhi
    with pytest.raises(ValueError):
        cluster_bootstrap(a, {"l1": base["l1"]})

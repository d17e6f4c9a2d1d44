"""Answer metrics: pure functions, no I/O.

Invariants:
- ``normalize_answer``, ``f1_score`` and ``exact_match`` reproduce HotpotQA's ``hotpot_evaluate_v1.py``
  (which shares SQuAD ``evaluate-v1.1.py``'s normalisation: lower-case, drop punctuation, drop the
  articles a/an/the, collapse white space), including HotpotQA's rule that a yes/no/noanswer prediction
  or gold that differs from the other side scores F1 0;
- ``score_answer`` takes each metric's maximum over the gold answers (SQuAD's
  ``metric_max_over_ground_truths``), each metric maximised on its own;
- the LoCoMo functions reproduce ``task_eval/evaluation.py`` of snap-research/locomo: its own
  normalisation (commas and the word "and" dropped too), category 1 split into comma-separated parts,
  category 3 gold cut at the first ';', category 5 scored 1 when the prediction says "not mentioned" or
  "no information available"; articles are removed with the ``regex`` module, as the official script
  does. The official token F1 stems every token with NLTK's ``PorterStemmer`` (``porter_stem``): pass
  ``stem=porter_stem`` for the official score, which the LoCoMo environment does by default; ``stem=None``
  (these functions' default) gives the unstemmed variant ("studies" vs "studying": 1.0 official, 0.0
  unstemmed);
- ``squad2_f1`` and ``squad2_exact`` reproduce SQuAD 2.0's ``compute_f1``/``compute_exact``, which
  MuSiQue's ``metrics/answer.py`` uses (no yes/no rule; two empty answers agree with F1 1);
- ``memagent_sub_em`` is MemAgent's substring EM (``sub_exact_match_score``): either normalised text
  inside the other, with a blank prediction scoring 0;
- every score is a float in [0, 1].
"""

from __future__ import annotations

import functools
import re
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import regex

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_LOCOMO_ARTICLES = regex.compile(r"\b(a|an|the|and)\b")
_YES_NO = ("yes", "no", "noanswer")
LOCOMO_NOT_MENTIONED = "Not mentioned in the conversation"


@dataclass(frozen=True)
class Scores:
    f1: float
    em: float
    sub_em: float


def _strip_punctuation(text: str) -> str:
    return "".join(ch for ch in text if ch not in _PUNCTUATION)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation, drop a/an/the, collapse white space (SQuAD/HotpotQA order)."""
    return " ".join(_ARTICLES.sub(" ", _strip_punctuation(text.lower())).split())


def _token_f1(pred_tokens: Sequence[str], gold_tokens: Sequence[str]) -> float:
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, gold: str) -> float:
    """HotpotQA token F1 of one prediction against one gold answer."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if (pred in _YES_NO or ref in _YES_NO) and pred != ref:
        return 0.0
    return _token_f1(pred.split(), ref.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def substring_match(prediction: str, gold: str) -> float:
    """1 when the normalised gold occurs (as characters) inside the normalised prediction."""
    return float(normalize_answer(gold) in normalize_answer(prediction))


def score_answer(prediction: str, answers: Sequence[str]) -> Scores:
    """F1, EM and substring EM, each the maximum over ``answers`` (which must not be empty)."""
    return best_scores(prediction, answers, f1_score, exact_match, substring_match)


def best_scores(
    prediction: str,
    answers: Sequence[str],
    f1: Callable[[str, str], float],
    em: Callable[[str, str], float],
    sub_em: Callable[[str, str], float],
) -> Scores:
    """Each of the three metrics (prediction, gold) -> score, the maximum over ``answers`` (which must not
    be empty)."""
    if not answers:
        raise ValueError("score_answer needs at least one gold answer")
    return Scores(
        f1=max(f1(prediction, a) for a in answers),
        em=max(em(prediction, a) for a in answers),
        sub_em=max(sub_em(prediction, a) for a in answers),
    )


def squad2_exact(prediction: str, gold: str) -> float:
    """SQuAD 2.0's ``compute_exact`` (MuSiQue's answer EM)."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def squad2_f1(prediction: str, gold: str) -> float:
    """SQuAD 2.0's ``compute_f1`` (MuSiQue's answer F1): when either side has no tokens, 1 if both have
    none, else 0; no yes/no rule."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    return _token_f1(pred, ref)


def memagent_sub_em(prediction: str, gold: str) -> float:
    """MemAgent's substring EM: 1 when the normalised gold is inside the normalised prediction or the
    other way round; a blank prediction scores 0 (MemAgent scores an empty extracted answer 0), while one
    that normalises to nothing ("The.") is inside every gold, as in MemAgent's script."""
    if not prediction.strip():
        return 0.0
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    return float(ref in pred or pred in ref)


@functools.cache
def _porter() -> Callable[[str], str]:
    from nltk.stem import PorterStemmer  # imported on first use: nltk takes most of a second to import

    return PorterStemmer().stem


def porter_stem(word: str) -> str:
    """NLTK's ``PorterStemmer().stem`` (its default mode), the stemmer of LoCoMo's official F1."""
    return _porter()(word)


def _identity(word: str) -> str:
    return word


def locomo_normalize(text: str) -> str:
    """LoCoMo's normalisation: drop commas, lower-case, drop punctuation, drop a/an/the/and."""
    text = text.replace(",", "")
    return " ".join(_LOCOMO_ARTICLES.sub(" ", _strip_punctuation(text.lower())).split())


def locomo_token_f1(prediction: str, gold: str, stem: Callable[[str], str] | None = None) -> float:
    """LoCoMo's ``f1_score``: token F1 of the normalised texts, each token passed through ``stem``."""
    stem = stem or _identity
    pred = [stem(w) for w in locomo_normalize(prediction).split()]
    ref = [stem(w) for w in locomo_normalize(gold).split()]
    return _token_f1(pred, ref)


def locomo_says_not_mentioned(prediction: str) -> bool:
    lowered = prediction.lower()
    return "no information available" in lowered or "not mentioned" in lowered


def locomo_gold(gold: str, category: str | int) -> str:
    """The gold text LoCoMo scores against: category 3 keeps the part before the first ';'."""
    return gold.split(";")[0].strip() if str(category) == "3" else gold


def locomo_f1(
    prediction: str, gold: str, category: str | int, stem: Callable[[str], str] | None = None
) -> float:
    """One question's score under LoCoMo's rules for its category (1-5; anything else is an error)."""
    category = str(category)
    if category == "5":
        return float(locomo_says_not_mentioned(prediction))
    if category in ("2", "3", "4"):
        return locomo_token_f1(prediction, locomo_gold(gold, category), stem)
    if category == "1":
        parts = [p.strip() for p in prediction.split(",")]
        golds = [g.strip() for g in gold.split(",")]
        return float(np.mean([max(locomo_token_f1(p, g, stem) for p in parts) for g in golds]))
    raise ValueError(f"unknown LoCoMo category {category!r} (expected 1-5)")


def bootstrap_ci(
    values: Sequence[float], n: int = 1000, seed: int = 0, alpha: float = 0.05
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean: ``n`` resamples with replacement, seeded."""
    data = np.asarray(values, dtype=np.float64)
    if data.ndim != 1 or data.size == 0:
        raise ValueError("bootstrap_ci needs a non-empty 1-D sequence of values")
    if n < 1 or not 0.0 < alpha < 1.0:
        raise ValueError(f"bootstrap_ci needs n >= 1 and 0 < alpha < 1, got n={n}, alpha={alpha}")
    rng = np.random.default_rng(seed)
    means = np.empty(n, dtype=np.float64)
    block = max(1, 2_000_000 // data.size)  # bound the index matrix to a few million entries
    for start in range(0, n, block):
        stop = min(n, start + block)
        means[start:stop] = data[rng.integers(0, data.size, size=(stop - start, data.size))].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def mean_interval(scores: Sequence[float | None]) -> tuple[float, float]:
    """The 95% interval of a run's mean score that every report shows (the CLI, ``eval_results``, the viewer):
    ``bootstrap_ci`` of the scores, a missing one (a failed episode) as 0, in sorted order, so the interval is a
    function of the scores alone, not of the order a job or a query read them in."""
    return bootstrap_ci(sorted(float(s or 0.0) for s in scores))


def cluster_bootstrap(
    a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray] | None = None, n: int = 2000, seed: int = 0,
    alpha: float = 0.05,
) -> tuple[float, float, float]:
    """Mean (of ``a``, or of ``a - b`` paired) over components, with a percentile interval that resamples
    whole questions and whole training seeds.

    Each component (a held-out set) maps to ``[S, Q]`` scores: S training seeds (rows) by Q questions
    (columns, the same questions in the same order for every seed and both arms); an arm with one row (the
    base model, trained by no seed) is broadcast to the other's seeds. A draw resamples the seeds once and
    the questions of each component with replacement, and takes the mean over every drawn (seed, question)
    cell of every component; ``b`` is drawn with the same indices, so the difference is paired. Returns
    (point estimate, lo, hi)."""
    names = sorted(a)
    if not names or (b is not None and sorted(b) != names):
        raise ValueError("cluster_bootstrap needs the same non-empty components in a and b")
    arr = {k: np.atleast_2d(np.asarray(a[k], dtype=np.float64)) for k in names}
    if b is not None:
        other = {k: np.atleast_2d(np.asarray(b[k], dtype=np.float64)) for k in names}
        seeds = max(max(v.shape[0] for v in arr.values()), max(v.shape[0] for v in other.values()))
        arr = {k: np.broadcast_to(arr[k], (seeds, arr[k].shape[1])) - np.broadcast_to(other[k], (seeds, other[k].shape[1]))
               for k in names}
    seeds = max(v.shape[0] for v in arr.values())
    arr = {k: np.broadcast_to(v, (seeds, v.shape[1])) for k, v in arr.items()}
    total = sum(v.shape[1] for v in arr.values())
    point = float(sum(v.mean(axis=0).sum() for v in arr.values()) / total)
    rng = np.random.default_rng(seed)
    means = np.empty(n)
    for i in range(n):
        rows = rng.integers(0, seeds, size=seeds)
        acc = 0.0
        for k in names:
            v = arr[k]
            cols = rng.integers(0, v.shape[1], size=v.shape[1])
            acc += v[np.ix_(rows, cols)].mean(axis=0).sum()
        means[i] = acc / total
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return point, float(lo), float(hi)

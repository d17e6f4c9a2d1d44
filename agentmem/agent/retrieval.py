"""BM25 retrieval over short texts (a task's chunks, a bank of memories), with ``bm25s`` (numpy only).

Pure functions of their arguments: the same query and texts give the same scores and the same ranking.
Text is tokenised by ``bm25s.tokenize`` (lower-cased words of two or more characters, English stop words
dropped, no stemming); BM25 is ``bm25s``'s default (Lucene variant, k1 = 1.5, b = 0.75). A query with no
indexable word scores every text 0. Ties are broken by the lower index, so ``top_k`` is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

import bm25s
import numpy as np


def _tokens(texts: Sequence[str]) -> list[list[str]]:
    return bm25s.tokenize(list(texts), stopwords="en", return_ids=False, show_progress=False)


def bm25_scores(query: str, texts: Sequence[str]) -> np.ndarray:
    """The BM25 score of every text for ``query`` (float32, one per text, in order)."""
    if not texts:
        return np.zeros(0, dtype=np.float32)
    index = bm25s.BM25()
    index.index(_tokens(texts), show_progress=False)
    query_tokens = _tokens([query])[0]
    if not query_tokens:
        return np.zeros(len(texts), dtype=np.float32)
    return np.asarray(index.get_scores(query_tokens), dtype=np.float32)


def top_k(query: str, texts: Sequence[str], k: int) -> list[int]:
    """The indices of the ``k`` best texts for ``query``, best first (ties: lower index first); fewer when
    there are fewer texts."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    scores = bm25_scores(query, texts)
    return sorted(range(len(texts)), key=lambda i: (-float(scores[i]), i))[:k]

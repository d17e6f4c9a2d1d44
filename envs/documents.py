"""Long contexts built from documents: the task's own documents plus distractors from the corpus.

Used by the HotpotQA and SQuAD readers, in the way long-context memory-agent work (MemAgent's
RULER-HotpotQA) builds its inputs.

Invariants:
- the required documents are always present; optional ones come next in the given preference order
  (the task's own optional documents first, then a seeded draw from the corpus), never repeating a key;
- the context stops at ``docs`` documents, or, when ``context_tokens`` is set, when the total is as
  near that target as the draw allows: a document that would take the total past it is skipped, and the
  search stops after ``MAX_MISSES`` such documents in a row (required documents are kept even when
  they alone pass the target);
- the chosen documents are then put in a seeded random order.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence

import numpy as np

from envs.errors import check_int

MAX_MISSES = 32


def check_size_knobs(env: str, docs: int, context_tokens: int | None) -> None:
    check_int(f"{env}: knob docs", docs, 1)
    check_int(f"{env}: knob context_tokens", context_tokens, 1, optional=True)


def choose_documents(
    rng: np.random.Generator,
    *,
    required: Sequence[int],
    own_optional: Sequence[int],
    corpus_size: int,
    key_of: Callable[[int], Hashable],
    tokens_of: Callable[[int], int],
    docs: int,
    context_tokens: int | None,
) -> list[int]:
    """Indices into the corpus of the documents of one context, in their (seeded) reading order."""
    chosen = list(required)
    keys = {key_of(i) for i in chosen}
    total = sum(tokens_of(i) for i in chosen) if context_tokens is not None else 0
    misses = 0
    for i in _candidates(rng, own_optional, corpus_size):
        if (context_tokens is None and len(chosen) >= docs) or misses >= MAX_MISSES:
            break
        if key_of(i) in keys:
            continue
        if context_tokens is not None:
            if total + tokens_of(i) > context_tokens:
                misses += 1
                continue
            total, misses = total + tokens_of(i), 0
        chosen.append(i)
        keys.add(key_of(i))
    return [chosen[j] for j in rng.permutation(len(chosen))]


def _candidates(rng: np.random.Generator, own_optional: Sequence[int], corpus_size: int) -> Iterator[int]:
    yield from (own_optional[j] for j in rng.permutation(len(own_optional)))
    yield from (int(i) for i in rng.permutation(corpus_size))

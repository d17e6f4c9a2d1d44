"""The text of single tokens, for heat maps: read from a ``tokenizer.json`` with the ``tokenizers`` library
(no torch, no model). Where no tokenizer is found, a token shows as its id.

A tokenizer is looked for, per call, in: the folder given to ``agentmem view --tokenizer``, else the folder
of the checkpoint that sampled the call (its policy version), else the run's ``model`` when that is a
folder. Each tokenizer is loaded once per process.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np


@functools.lru_cache(maxsize=8)
def _load(path: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def tokenizer_file(folder_or_file: str | None) -> str | None:
    """The ``tokenizer.json`` at or inside ``folder_or_file``, or None."""
    if not folder_or_file:
        return None
    p = Path(folder_or_file).expanduser()
    candidate = p / "tokenizer.json" if p.is_dir() else p
    return str(candidate) if candidate.name.endswith(".json") and candidate.is_file() else None


def pieces(ids: np.ndarray, tokenizer_path: str | None) -> list[str]:
    """The text of each token alone (a byte-level piece of a longer character shows as U+FFFD), or
    ``‹id›`` for each token when there is no tokenizer."""
    id_list: Sequence[int] = [int(i) for i in ids]
    if tokenizer_path is None:
        return [f"‹{i}›" for i in id_list]
    return _load(tokenizer_path).decode_batch([[i] for i in id_list], skip_special_tokens=False)

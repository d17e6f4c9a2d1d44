"""Building an environment by name: the one place that knows every environment.

The built-in environments are listed here; a package adds its own through the entry-point group
``agentmem.envs`` (entry name = ``--env`` name, object = the environment class, whose keyword arguments
beyond ``count_tokens``, ``chunk_tokens``, ``seed`` and ``data_path`` are its knobs), e.g.::

    [project.entry-points."agentmem.envs"]
    riddles = "my_package.riddles:RiddleEnv"

Entry points are listed on the first look-up and each loaded only when built (nothing at import).

Invariants: ``load_env`` checks the name, ``chunk_tokens``, ``seed``, ``data_path`` and knob names before
building anything, and every failure is an ``EnvError``; knobs are each environment's keyword arguments
(a misspelt knob is an error, never ignored); ``check_data`` runs every check of ``load_env`` without a
tokenizer; ``synthetic`` takes no data file, every other env needs one
(``needle``'s is any long plain-text file, its filler).
"""

from __future__ import annotations

import functools
import inspect
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from envs.errors import EnvError, check_int
from envs.hotpotqa import HotpotQAEnv
from envs.locomo import LocomoEnv
from envs.longmemeval import LongMemEvalEnv
from envs.musique import MusiqueEnv
from envs.needle import NeedleEnv
from envs.quality import QualityEnv
from envs.ruler_hotpotqa import RulerHotpotQAEnv
from envs.sniff import guess_benchmark
from envs.squad import SquadEnv
from envs.synthetic import SyntheticEnv
from envs.twowiki import TwoWikiEnv
from envs.types import CountTokens, Env

_ENVS: dict[str, Any] = {
    "synthetic": SyntheticEnv,
    "hotpotqa": HotpotQAEnv,
    "squad": SquadEnv,
    "locomo": LocomoEnv,
    "longmemeval": LongMemEvalEnv,
    "ruler_hotpotqa": RulerHotpotQAEnv,
    "needle": NeedleEnv,
    "musique": MusiqueEnv,
    "2wikimultihopqa": TwoWikiEnv,
    "quality": QualityEnv,
}
ENV_NAMES: tuple[str, ...] = tuple(_ENVS)  # the built-in ones; ``env_names()`` adds the entry points'
GROUP = "agentmem.envs"
# What --data is, per environment that needs one (the message of a missing --data).
DATA_HINTS: dict[str, str] = {
    "hotpotqa": "HotpotQA's official JSON, e.g. hotpot_dev_distractor_v1.json",
    "ruler_hotpotqa": "HotpotQA's official JSON, e.g. hotpot_dev_distractor_v1.json",
    "squad": "SQuAD v1.1's official JSON, e.g. dev-v1.1.json",
    "locomo": "LoCoMo's locomo10.json",
    "longmemeval": "LongMemEval's JSON, e.g. longmemeval_oracle.json",
    "needle": "any plain-text file: the filler the bAbI stories are hidden in",
    "musique": "MuSiQue's JSON lines (or one JSON array), e.g. musique_ans_v1.0_dev.jsonl",
    "2wikimultihopqa": "2WikiMultihopQA's dev.json",
    "quality": "QuALITY's jsonl or L-Eval's quality.jsonl",
}
_COMMON = ("data_path", "count_tokens", "chunk_tokens", "seed")


@functools.cache
def _plugins() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=GROUP) if ep.name not in _ENVS}


def env_names() -> tuple[str, ...]:
    """Every ``--env`` name: the built-in environments, then those of installed packages (entry points)."""
    return ENV_NAMES + tuple(sorted(_plugins()))


def env_class(name: str) -> Any:
    """The class of environment ``name`` (an entry point's is imported now)."""
    if name in _ENVS:
        return _ENVS[name]
    if name not in _plugins():
        raise EnvError(f"unknown environment {name!r}; known: {', '.join(env_names())}")
    return _plugins()[name].load()


def knobs_of(name: str) -> dict[str, Any]:
    """The knobs ``name`` accepts, with their defaults."""
    params = inspect.signature(env_class(name)).parameters
    return {k: p.default for k, p in params.items() if k not in _COMMON}


def check_env(name: str, data_path: str | Path | None, knobs: dict[str, Any]) -> None:
    """The checks of ``load_env`` that read no data: the name, the knob names and whether the environment
    takes a data file (an ``EnvError`` each); run by the CLI before any model loads."""
    allowed = knobs_of(name)
    unknown = sorted(set(knobs) - set(allowed))
    if unknown:
        raise EnvError(f"{name}: unknown knob(s) {', '.join(unknown)}; known: {', '.join(allowed) or 'none'}")
    if "data_path" in inspect.signature(env_class(name)).parameters:
        if data_path is None:
            raise EnvError(f"{name}: needs a data file: give --data FILE ({DATA_HINTS.get(name, 'the official release')})")
    elif data_path is not None:
        raise EnvError(f"{name}: takes no data file (--data), got {str(data_path)!r}")


def _words(text: str) -> int:
    return len(text.split())


def check_data(name: str, data_path: str | Path | None, knobs: dict[str, Any], *, chunk_tokens: int,
               seed: int) -> None:
    """Every check of ``load_env``, the data file's included: the environment is built (its file read, parsed
    and its records' shape checked, an ``EnvError`` naming the file and the record) with a word count standing in
    for the tokenizer, and no task is made. The CLI runs it before a run row or a database file is written."""
    load_env(name, data_path=data_path, count_tokens=_words, chunk_tokens=chunk_tokens, seed=seed, **knobs)


def load_env(
    name: str,
    *,
    data_path: str | Path | None = None,
    count_tokens: CountTokens,
    chunk_tokens: int,
    seed: int,
    **knobs: Any,
) -> Env:
    check_env(name, data_path, knobs)
    check_int(f"{name}: chunk_tokens", chunk_tokens, 1)
    check_int(f"{name}: seed", seed, 0)
    cls = env_class(name)
    common: dict[str, Any] = {"count_tokens": count_tokens, "chunk_tokens": chunk_tokens, "seed": seed}
    if data_path is not None:
        common["data_path"] = Path(data_path)
    try:
        return cls(**common, **knobs)
    except EnvError as err:
        guess = guess_benchmark(data_path) if data_path is not None else None
        if guess is None or guess == name or guess not in _ENVS:
            raise
        raise EnvError(f"{err} (the file looks like {guess} data: use --env {guess})") from None

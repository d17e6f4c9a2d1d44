"""Long-horizon question-answering environments and their answer metrics.

``load_env(name, ...)`` builds one of ``ENV_NAMES``; each environment keeps the contract in
``envs.types.Env``: seeded tasks whose chunks fit a token budget, and a ``score`` of a final answer.
This package imports only ``agentmem.records``, the standard library, numpy, ``regex`` and (on first use
of LoCoMo's official F1) NLTK's Porter stemmer.
"""

from envs.errors import EnvError
from envs.metrics import Scores
from envs.registry import ENV_NAMES, check_data, check_env, env_names, knobs_of, load_env
from envs.types import Env

__all__ = ["ENV_NAMES", "Env", "EnvError", "Scores", "check_data", "check_env", "env_names", "knobs_of", "load_env"]

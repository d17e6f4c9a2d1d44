"""One config tree for every job, and the Enums of every fixed choice; one module per job.

Each job takes exactly one of these configs; a run stores ``config.model_dump(mode="json")`` so that
``--resume RUN_ID`` needs nothing else. The tree composes instead of re-declaring:

- ``AgentConfig`` (``agent_config``): how the agent reads (memory budget, generation limits, sampling, memory
  policy);
- ``RolloutConfig`` (``rollout_config``): environment + model + an ``AgentConfig``; ``EvalConfig``: a
  ``RolloutConfig`` that is greedy with one sample per task (checked), with held-out defaults;
- ``ReplayConfig`` (``replay_config``): ReOPD's single-call samples branched from a stored teacher run;
- ``ScoreConfig`` (``score_config``): teacher scoring of stored calls;
- ``DistillConfig`` (``distill_config``): training from stored calls, in sections: the teacher, the loss terms,
  the RL term, the optimizer and the batching;
- ``SftConfig`` (``sft_config``): supervised fine-tuning on stored calls; ``WarmStartConfig``: the loop's;
- ``TrainConfig`` (``train_config``): the on-policy loop: a ``RolloutConfig`` and a ``DistillConfig`` per round;
- ``ServeConfig`` (``serve_config``): an OpenAI-compatible server that records every call;
- ``MemoriesConfig`` (``memories_config``): workflow memories written from a run's successful episodes.

Every fixed choice is an Enum (``choices``). Device and threads are not here: they describe the process, not
the job (``agentmem.runtime``).
"""

from agentmem.config import choices, distill_config
from agentmem.config.agent_config import AgentConfig
from agentmem.config.base import KIND_ALIASES, SERVE_KINDS, Frozen, kind_names
from agentmem.config.choices import *  # noqa: F403 (every Enum: the names of choices.__all__)
from agentmem.config.distill_config import *  # noqa: F403 (DistillConfig and its sections)
from agentmem.config.memories_config import MemoriesConfig
from agentmem.config.replay_config import ReplayConfig
from agentmem.config.rollout_config import HELD_OUT_SEED, EvalConfig, RolloutConfig
from agentmem.config.score_config import ScoreConfig
from agentmem.config.serve_config import ServeConfig, load_template
from agentmem.config.sft_config import LORA_TARGETS, SftConfig, WarmStartConfig
from agentmem.config.train_config import TrainConfig

__all__ = [
    *choices.__all__, *distill_config.__all__, "HELD_OUT_SEED", "KIND_ALIASES", "LORA_TARGETS", "SERVE_KINDS",
    "AgentConfig", "EvalConfig", "Frozen", "MemoriesConfig", "ReplayConfig", "RolloutConfig", "ScoreConfig",
    "ServeConfig", "SftConfig", "TrainConfig", "WarmStartConfig", "kind_names", "load_template",
]

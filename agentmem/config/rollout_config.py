"""A rollout's config, and an evaluation's (a greedy rollout on held-out seeds)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from agentmem.config.agent_config import AgentConfig
from agentmem.config.base import Frozen
from agentmem.config.choices import BackendKind, DType, PolicySource
from agentmem.records import SamplingContext

# Synthetic tasks are a pure function of (seed, index): a seed no rollout uses by default gives tasks the
# policy was never trained on. Data files are only reordered by the seed; hold out a split file for them.
HELD_OUT_SEED = 1000

class RolloutConfig(Frozen):
    """Everything a rollout depends on; stored with the run so ``--resume`` needs only the run id."""

    @classmethod
    def stored(cls, data: dict) -> RolloutConfig:
        """A config read back from a run row (see ``AgentConfig.stored`` for the one default that differs)."""
        data = dict(data)
        data["agent"] = AgentConfig.stored(data.get("agent") or {})
        return cls.model_validate(data)

    env: str = "synthetic"
    """Environment."""
    data: str | None = None
    """Data file in the benchmark's official JSON format."""
    env_knobs: dict[str, Any] = Field(default_factory=dict)
    """Environment knob KEY=VALUE, e.g. hops=3, context_tokens=4096, docs=20."""
    model: str = "default"
    """Model folder, checkpoint id, or 'default' (SmolLM2-135M-Instruct, prepared on first use)."""
    policy: PolicySource = PolicySource.model  # oracle: ``model`` gives only the tokenizer and chat template
    """Who writes the outputs: the model (sampled, with log-probs) or the oracle (scripted from the task's
    evidence and gold answer: no model, no log-probs; --model gives only the tokenizer and chat template)."""
    backend: BackendKind = BackendKind.transformers
    """Generation backend (openai: a client of an `agentmem serve` server at --base-url serving --model)."""
    base_url: list[str] | None = None  # backend openai: the servers' /v1 URLs (``agentmem serve``, ``vllm serve``)
    """With --backend openai: the server's URL, e.g. http://127.0.0.1:8000/v1; several servers of the same model
    share the calls, each episode staying on one (a server that fails mid-call is skipped: its calls go to
    the next)."""
    # fp32 by default: on CPU it is faster end to end for long prompts (prefill dominates), and the stored
    # sampler log-probs then match the fp32 training recompute (bf16 differs by ~0.03 on average).
    dtype: DType = DType.float32
    """Weights dtype for the transformers backend; auto (command line only): the faster of float32 and
    bfloat16 measured on this CPU (bfloat16 only where it has avx512_bf16/amx_bf16), printed and stored in the
    run config."""
    episodes: int = Field(8, ge=1)
    """Number of tasks."""
    group_size: int = Field(1, ge=1)
    """Episodes sampled per task (for group-normalised RL)."""
    seed: int = Field(0, ge=0)
    """Seed for task order and sampling."""
    chunk_tokens: int = Field(512, ge=16)
    """Tokens per chunk the agent reads per call."""
    agent: AgentConfig = Field(default_factory=AgentConfig)
    # privileged: every call is sampled with the episode's privileged message (gold answer, evidence) spliced
    # before its prompt, stored apart from the student-visible prompt (PSD's off-policy samples)
    context: SamplingContext = SamplingContext.aligned
    """Prompt the model samples from: aligned (the task prompt), privileged (the episode's gold answer and
    evidence as a system message before every prompt, stored apart: PSD's off-policy samples, `distill --psd
    off_policy`) or hint (each memory update's hint line before its prompt: a hint teacher's validation)."""

    @field_validator("base_url", mode="before")
    @classmethod
    def _one_url(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value  # a run stored with one URL, a file's one string

    @model_validator(mode="after")
    def _server(self) -> RolloutConfig:
        if (self.backend is BackendKind.openai) != bool(self.base_url):
            raise ValueError("--backend openai and --base-url URL go together")
        return self

    @model_validator(mode="after")
    def _oracle_reads_no_prompt(self) -> RolloutConfig:
        if self.context is not SamplingContext.aligned and self.policy is PolicySource.oracle:
            raise ValueError(f"the oracle reads no prompt: context {self.context.value} needs policy model")
        return self


def _greedy_agent() -> AgentConfig:
    return AgentConfig(temperature=0.0, seed=HELD_OUT_SEED)  # the memory budget is AgentConfig's own


class EvalConfig(RolloutConfig):
    """A rollout that is greedy (temperature 0) with one sample per task, on held-out seeds by default.
    Stored as a run of kind ``eval`` with this config."""

    episodes: int = Field(16, ge=1)
    """Number of tasks (one greedy episode each)."""
    seed: int = Field(HELD_OUT_SEED, ge=0)
    """Seed for task selection. The default differs from rollout's (0) so that synthetic tasks are ones
    training never saw; data files are only reordered by it."""
    agent: AgentConfig = Field(default_factory=_greedy_agent)

    @model_validator(mode="after")
    def _greedy_single_sample(self) -> EvalConfig:
        if self.group_size != 1:
            raise ValueError(f"an evaluation samples one episode per task: group_size must be 1, got {self.group_size}")
        if self.agent.temperature != 0:
            raise ValueError(f"an evaluation is greedy: agent.temperature must be 0, got {self.agent.temperature}")
        return self


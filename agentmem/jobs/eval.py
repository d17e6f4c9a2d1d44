"""Evaluation: the rollout machinery run greedily, summarised into one ``eval_results`` row.

An evaluation is a rollout with temperature 0 and one sample per task, stored as a run of kind ``eval``,
so every call it made can be inspected with SQL like a rollout's.

Invariants:
- every episode counts: a failed (or otherwise unscored) episode scores 0 on every metric;
- intervals are seeded percentile-bootstrap 95% intervals of the mean over episodes, so the same
  episodes always give the same row;
- ``metrics`` holds what the plots group by: ``base_model``, ``context_tokens`` (mean tokens of the
  chunks an episode read), ``env_knobs``, and ``f1_by_category`` when the tasks have categories (LoCoMo,
  LongMemEval), each category's mean F1 under the environment's own scoring rules.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from agentmem.agent.loop import AgentConfig, RoundStats
from agentmem.agent.rollout import RolloutConfig, run_rollout
from agentmem.policy.types import Backend
from agentmem.records import Checkpoint, Episode, EvalResult, InvocationKind, RunKind
from envs.metrics import bootstrap_ci
from store import repository as repo
from store.engine import Store

# Synthetic tasks are a pure function of (seed, index): a seed no rollout uses by default gives tasks the
# policy was never trained on. Data files are only reordered by the seed; hold out a split file for them.
HELD_OUT_SEED = 1000


class EvalConfig(BaseModel):
    """Everything an evaluation depends on. Sampling is always greedy and one sample per task."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    env: str = "synthetic"
    data: str | None = None
    env_knobs: dict[str, Any] = Field(default_factory=dict)
    model: str = "default"
    backend: Literal["transformers", "vllm"] = "transformers"
    # fp32 by default: on CPU it is faster end to end for long prompts (prefill dominates), and the stored
    # sampler log-probs then match the fp32 training recompute (bf16 differs by ~0.03 on average).
    dtype: Literal["bfloat16", "float32"] = "float32"
    episodes: int = Field(16, ge=1)
    seed: int = Field(HELD_OUT_SEED, ge=0)
    chunk_tokens: int = Field(512, ge=16)
    memory_tokens: int = Field(128, ge=1)
    answer_max_new_tokens: int = Field(32, ge=1)
    max_chunks: int | None = Field(None, ge=1)
    max_batch: int = Field(8, ge=1)

    def rollout_config(self) -> RolloutConfig:
        """The greedy, one-sample-per-task rollout this evaluation runs (and stores with its run)."""
        agent = AgentConfig(memory_tokens=self.memory_tokens, answer_max_new_tokens=self.answer_max_new_tokens,
                            max_chunks=self.max_chunks, temperature=0.0, max_batch=self.max_batch, seed=self.seed)
        return RolloutConfig(env=self.env, data=self.data, env_knobs=self.env_knobs, model=self.model,
                             backend=self.backend, dtype=self.dtype, episodes=self.episodes, group_size=1,
                             seed=self.seed, chunk_tokens=self.chunk_tokens, agent=agent)


def episode_scores(episodes: Sequence[Episode], metric: Literal["f1", "em", "sub_em"]) -> list[float]:
    """One score per episode; an episode without a score (failed) counts as 0."""
    return [float(getattr(e, metric) or 0.0) for e in episodes]


def f1_by_category(episodes: Sequence[Episode]) -> dict[str, float]:
    per: dict[str, list[float]] = defaultdict(list)
    for ep, f1 in zip(episodes, episode_scores(episodes, "f1"), strict=True):
        if ep.category is not None:
            per[ep.category].append(f1)
    return {c: float(np.mean(v)) for c, v in sorted(per.items())}


def summarize(
    episodes: Sequence[Episode], *, run_id: str, policy: Checkpoint, env: str, step: int | None,
    metrics: dict[str, Any],
) -> EvalResult:
    """The eval_results row for ``episodes``: means and bootstrap 95% intervals of F1, EM, substring EM."""
    if not episodes:
        raise ValueError("no episodes to evaluate")
    stats: dict[str, Any] = {}
    for name in ("f1", "em", "sub_em"):
        values = episode_scores(episodes, name)  # type: ignore[arg-type]
        stats[name], stats[f"{name}_ci"] = float(np.mean(values)), bootstrap_ci(values)
    by_status: dict[str, int] = defaultdict(int)
    for ep in episodes:
        by_status[ep.status.value] += 1
    extra: dict[str, Any] = {"episodes_by_status": dict(sorted(by_status.items())), **metrics}
    categories = f1_by_category(episodes)
    if categories:
        extra["f1_by_category"] = categories
    return EvalResult(run_id=run_id, checkpoint_id=policy.id, model=policy.path, env=env, step=step,
                      n_episodes=len(episodes), metrics=extra, **stats)


def _context_tokens(store: Store, run_id: str, episodes: Sequence[Episode], backend: Backend) -> float:
    """Mean over ``episodes`` of the tokens in the chunks each one read (as the environment counts them)."""
    tokens = {ep.id: 0 for ep in episodes}
    tok = backend.tokenizer
    with store.session() as s:
        for inv in repo.stream_invocations(s, run_ids=[run_id], kinds=[InvocationKind.memory_update]):
            tokens[inv.episode_id] += len(tok(inv.chunk_text or "", add_special_tokens=False)["input_ids"])
    return float(np.mean(list(tokens.values())))


def run_eval(
    store: Store,
    config: EvalConfig,
    backend: Backend,
    policy: Checkpoint,
    *,
    step: int | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_round: Callable[[RoundStats], None] | None = None,
) -> EvalResult:
    """Evaluate ``policy`` greedily on ``config.episodes`` tasks; store and return one eval_results row.

    ``step`` is the training step recorded with the result (default: ``policy.step``, 0 for a base model).
    The callbacks are those of ``run_rollout``.
    """
    result = run_rollout(store, config.rollout_config(), backend, policy, kind=RunKind.eval, on_start=on_start,
                         on_round=on_round)
    context_tokens = _context_tokens(store, result.run_id, result.episodes, backend)
    metrics = {"base_model": policy.base_model, "context_tokens": context_tokens, "env_knobs": config.env_knobs,
               "chunk_tokens": config.chunk_tokens, "memory_tokens": config.memory_tokens, "seed": config.seed}
    row = summarize(result.episodes, run_id=result.run_id, policy=policy, env=config.env,
                    step=policy.step if step is None else step, metrics=metrics)
    with store.session() as s:
        repo.insert_eval_result(s, row)
        s.commit()
    return row

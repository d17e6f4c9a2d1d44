"""The eval job: the rollout machinery run greedily, summarised into one ``eval_results`` row.

An evaluation is a rollout with temperature 0 and one sample per task (``EvalConfig``, a ``RolloutConfig``
that checks both), stored as a run of kind ``eval``, so every call it made can be inspected with SQL like a
rollout's.

Invariants:
- every episode counts: a failed (or otherwise unscored) episode scores 0 on every metric;
- intervals are seeded percentile-bootstrap 95% intervals of the mean over episodes, so the same
  episodes always give the same row;
- ``metrics`` holds ``empty_rate`` (the share of calls whose output is end-of-sequence only: a student or
  teacher that learned to stop at once), and per call kind ``empty_by_kind`` and ``out_len_by_kind`` (mean
  output tokens, end-of-sequence included), from the run's stored calls;
- ``metrics`` holds ``empty_after_evidence``: of the rewrite calls (of a policy's declared ``rewrite_kind``,
  whose output is the whole memory: overwrite's and teacher's ``memory_update``) made once a fact of the task
  was read (``oracle.evidence_read``), the share whose memory is empty (blank or ``(empty)``): a student that
  learned to write ``(empty)`` whatever it read. None when no call qualifies (no annotated facts);
- ``metrics`` holds ``empty_at_first_read``: of the rewrite calls that read a chunk while
  holding nothing, the share that write an empty memory, apart for ``evidence`` reads (a fact of the task is
  complete in that chunk) and ``other`` reads (none is). The two apart say whether a policy tells the kinds of
  read apart (writes the fact, skips the distractor) or only how often it skips (``first_read_skips``);
- ``metrics`` holds what the plots group by: ``base_model``, ``context_tokens`` (mean tokens of the input:
  the chunks a task gives, up to ``max_chunks``), ``env_knobs``, and ``f1_by_category`` when the tasks have categories (LoCoMo,
  LongMemEval), each category's mean F1 under the environment's own scoring rules.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import numpy as np

from agentmem import model_refs
from agentmem.agent.loop import RoundStats
from agentmem.agent.oracle import evidence_read
from agentmem.agent.registry import rewrite_kinds
from agentmem.backends.types import Backend
from agentmem.config import HELD_OUT_SEED, EvalConfig, PolicySource
from agentmem.errors import ConfigError, RunError
from agentmem.jobs.rollout import build_env, run_rollout
from agentmem.records import Checkpoint, Episode, EvalResult, Invocation, RunKind, Task, holds_nothing
from agentmem.runtime import CPU, Runtime
from agentmem.training.dynamics import output_stats
from envs import knobs_of
from envs.metrics import mean_interval
from store import repository as repo
from store.engine import Store

__all__ = ["HELD_OUT_SEED", "EvalConfig", "run_eval", "run_sweep", "sweep_configs", "summarize"]


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
    """The eval_results row for ``episodes``: means and bootstrap 95% intervals (``mean_interval``, the one every
    report shows) of F1, EM, substring EM."""
    if not episodes:
        raise RunError("no episodes to evaluate")
    stats: dict[str, Any] = {}
    for name in ("f1", "em", "sub_em"):
        values = episode_scores(episodes, name)  # type: ignore[arg-type]
        stats[name], stats[f"{name}_ci"] = float(np.mean(values)), mean_interval(values)
    by_status: dict[str, int] = defaultdict(int)
    for ep in episodes:
        by_status[ep.status.value] += 1
    extra: dict[str, Any] = {"episodes_by_status": dict(sorted(by_status.items())), **metrics}
    categories = f1_by_category(episodes)
    if categories:
        extra["f1_by_category"] = categories
    return EvalResult(run_id=run_id, checkpoint_id=policy.id, model=policy.path, env=env, step=step,
                      n_episodes=len(episodes), metrics=extra, **stats)


def call_stats(calls: Sequence[Invocation], eos_id: int | None) -> dict[str, Any]:
    """``empty_rate``, ``empty_by_kind`` and ``out_len_by_kind`` of a run's stored calls."""
    pairs = [(str(i.kind), i.output_ids) for i in calls]
    stats = output_stats(pairs, eos_id)
    kinds = sorted(k.split("/", 1)[1] for k in stats if k.startswith("empty/"))
    overall = output_stats([("all", ids) for _, ids in pairs], eos_id)
    return {"empty_rate": overall.get("empty/all", 0.0),
            "empty_by_kind": {k: stats[f"empty/{k}"] for k in kinds},
            "out_len_by_kind": {k: stats[f"out_len/{k}"] for k in kinds}}


def _rewrites(calls: Sequence[Invocation], task_of: dict[str, Task]) -> Iterator[tuple[Invocation, Task]]:
    """``calls``' rewrite calls (of their policy's ``rewrite_kind``: the output is the whole memory) with a
    chunk and a known task, each with that task."""
    kind_of = rewrite_kinds({c.memory_policy for c in calls})
    for c in calls:
        if kind_of.get(c.memory_policy) == c.kind and c.chunk_index is not None and c.episode_id in task_of:
            yield c, task_of[c.episode_id]


def empty_after_evidence(calls: Sequence[Invocation], task_of: dict[str, Task]) -> float | None:
    """Of ``calls``' rewrite calls made once a fact of their episode's task was read, the
    share whose memory after the call is empty (blank or ``EMPTY_MEMORY``). ``task_of`` maps an episode id to
    its task. None when no call qualifies."""
    flags = [holds_nothing(c.memory_after) for c, task in _rewrites(calls, task_of)
             if evidence_read(task.facts, c.chunk_index)]
    return float(np.mean(flags)) if flags else None


def first_read_skips(calls: Sequence[Invocation], task_of: dict[str, Task]) -> dict[str, float] | None:
    """Of ``calls``' rewrite calls made with an empty memory (blank or ``EMPTY_MEMORY``)
    on an episode whose task has facts, the share whose memory after the call is empty, per kind of read:
    ``evidence`` when some fact with text is complete in the call's chunk, ``other`` otherwise. A kind
    without calls is left out; None when no call qualifies."""
    flags: dict[str, list[bool]] = {"evidence": [], "other": []}
    for c, task in _rewrites(calls, task_of):
        if task.facts and holds_nothing(c.memory_before):
            kind = "evidence" if any(f.chunk == c.chunk_index and f.text.strip() for f in task.facts) else "other"
            flags[kind].append(holds_nothing(c.memory_after))
    out = {k: float(np.mean(v)) for k, v in flags.items() if v}
    return out or None


def _context_tokens(config: EvalConfig, episodes: Sequence[Episode], tokenizer, tasks: dict[str, Task]) -> float:
    """Mean over ``episodes`` of the tokens in the chunks each one could read (the first ``max_chunks``), as the
    environment counts them: the input length, whatever the memory policy made of it (overwrite reads every
    chunk in an update call; ``events`` with ``recorder=rules`` reads them with no call)."""
    limit = config.agent.max_chunks

    def tokens(task_id: str) -> int:
        chunks = tasks[task_id].chunks if task_id in tasks else []
        return sum(len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in chunks[:limit])

    return float(np.mean([tokens(ep.task_id) for ep in episodes]))


def run_eval(
    store: Store,
    config: EvalConfig,
    runtime: Runtime = CPU,
    *,
    backend: Backend | None = None,
    policy: Checkpoint | None = None,
    step: int | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_round: Callable[[RoundStats], None] | None = None,
) -> EvalResult:
    """Evaluate ``config.model`` greedily on ``config.episodes`` tasks; store and return one eval_results row.

    ``step`` is the training step recorded with the result (default: the checkpoint's step, 0 for a base
    model). ``backend``/``policy`` and the callbacks are those of ``run_rollout``.
    """
    result = run_rollout(store, config, runtime, kind=RunKind.eval, backend=backend, policy=policy,
                         on_start=on_start, on_round=on_round)
    policy = result.policy
    tokenizer = backend.tokenizer if backend is not None else model_refs.load_tokenizer(policy.path)
    tasks = {t.task_id: t for t in build_env(config, tokenizer).tasks(config.episodes)}
    task_of = {e.id: tasks[e.task_id] for e in result.episodes if e.task_id in tasks}
    with store.session() as s:  # one read of the run's calls serves every statistic
        calls = list(repo.stream_invocations(s, run_ids=[result.run_id]))
    context_tokens = _context_tokens(config, result.episodes, tokenizer, tasks)
    metrics = {"base_model": policy.base_model, "context_tokens": context_tokens, "env_knobs": config.env_knobs,
               "chunk_tokens": config.chunk_tokens, "memory_tokens": config.agent.memory_tokens,
               "seed": config.seed, **call_stats(calls, tokenizer.eos_token_id),
               "empty_after_evidence": empty_after_evidence(calls, task_of),
               "empty_at_first_read": first_read_skips(calls, task_of)}
    row = summarize(result.episodes, run_id=result.run_id, policy=policy, env=config.env,
                    step=policy.step if step is None else step, metrics=metrics)
    with store.session() as s:
        repo.insert_eval_result(s, row)
        s.commit()
    return row


def sweep_configs(config: EvalConfig, knob: str, values: Sequence[int]) -> list[EvalConfig]:
    """One validated config per value of the environment knob ``knob`` (a length sweep: ``docs`` of
    ruler_hotpotqa, ``context_tokens`` of synthetic or needle), in the order given. Raises ConfigError,
    before anything loads, for a knob the environment lacks, an empty or repeated list, or a knob also
    fixed in ``config.env_knobs`` to another value."""
    known = knobs_of(config.env)
    if knob not in known:
        raise ConfigError(f"environment {config.env!r} has no knob {knob!r} to sweep; its knobs: "
                          f"{', '.join(known) or 'none'}")
    if not values:
        raise ConfigError(f"a sweep of {knob} needs at least one value")
    if len(set(values)) != len(values):
        raise ConfigError(f"a sweep of {knob} repeats a value: {list(values)}")
    fixed = config.env_knobs.get(knob)
    if fixed is not None and list(values) != [fixed]:
        raise ConfigError(f"{knob} is swept ({list(values)}) and also set as a knob ({knob}={fixed}): give one")
    return [EvalConfig.model_validate({**config.model_dump(), "env_knobs": {**config.env_knobs, knob: v}})
            for v in values]


def run_sweep(
    store: Store,
    config: EvalConfig,
    knob: str,
    values: Sequence[int],
    runtime: Runtime = CPU,
    *,
    on_length: Callable[[int, int], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_round: Callable[[RoundStats], None] | None = None,
) -> list[EvalResult]:
    """Evaluate one model at each value of ``knob`` (MemAgent's length sweep): one eval run and one
    ``eval_results`` row per value, in order, each holding the knob in ``metrics["env_knobs"]`` and the
    mean tokens read in ``metrics["context_tokens"]``. The model loads once. ``on_length(index, value)``
    is called before each evaluation."""
    configs = sweep_configs(config, knob, values)
    backend = policy = None
    if config.policy is not PolicySource.oracle:
        policy, backend = model_refs.sampler(store, model_refs.resolve(store, config.model), config.backend,
                                         config.dtype, runtime)
    rows = []
    for i, (value, cfg) in enumerate(zip(values, configs, strict=True)):
        if on_length is not None:
            on_length(i, value)
        rows.append(run_eval(store, cfg, runtime, backend=backend, policy=policy, on_start=on_start,
                             on_round=on_round))
    return rows

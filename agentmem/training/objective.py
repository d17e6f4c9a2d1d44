"""One optimisation step of an ``Objective`` (``terms``) on packed student rows: token weights normalised
over the whole global step, then forward and backward one row at a time (gradients accumulate).

Token weights (``Weighting``) are computed from local counts divided by a normaliser summed over every
process of the step with ONE ``runtime.all_reduce_sum`` of a small vector, so a step's loss and its
gradient summed over processes do not depend on how its calls are packed or split between processes:

- ``token``:   ``w_i = 1 / N`` with ``N`` the step's action tokens over all processes;
- ``call``:    ``w_i = 1 / (C * n_c)`` with ``C`` the step's calls (with at least one action) over all
  processes and ``n_c`` the tokens of token ``i``'s call (a call is never split, so ``n_c`` is local);
- ``episode``: ``w_i = 1 / (E * n_e)`` with ``n_e`` the tokens of token ``i``'s episode over all processes
  and ``E`` the number of episodes with any token. An episode's calls may sit on different processes, so
  every process passes the step's episode ids in one agreed order (``step_episodes``; the trainer derives
  it from the step's full draw, which every process computes) and the reduced vector carries one token
  count per episode: ``[N, C, n_e1, n_e2, ...]``.

Each process's loss is its share of the step loss; the step gradient is the *sum* of the processes'
gradients (not their mean: DDP's averaging would need the loss scaled by the world size).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from agentmem.config import Weighting
from agentmem.errors import TrainingError
from agentmem.replay import Row
from agentmem.runtime import CPU, Runtime
from agentmem.training.collate import PackedBatch
from agentmem.training.forward import PackedModel
from agentmem.training.teachers import TeacherTargets
from agentmem.training.terms import MicroBatch, Objective, objective_from_config

__all__ = ["Objective", "StepInputs", "StepResult", "accumulate_step", "objective_from_config", "step_totals",
           "step_weights"]


@dataclass(frozen=True)
class StepInputs:
    """Per-invocation facts the objective needs besides the rows: its episode, the episode's advantage,
    the sampling temperature (> 0), and the teacher's targets (None when no term needs a teacher)."""

    episode_of: Mapping[str, str]
    advantage_of: Mapping[str, float]
    temperature_of: Mapping[str, float]
    teacher: TeacherTargets | None = None


@dataclass(frozen=True)
class StepResult:
    """This process's share of the step. ``loss`` is ``sum_k weight_k * term_k``; ``kd_loss`` and
    ``rl_loss`` are the unweighted distillation and policy-gradient terms (0 when absent); ``metrics``
    holds the policy-gradient diagnostics (when that term is present) and ``{name}_loss`` of the other
    terms; ``global_actions`` is the step's action tokens over all processes."""

    loss: float
    kd_loss: float
    rl_loss: float
    tokens: int
    actions: int
    metrics: dict[str, float]
    global_actions: int = 0


@dataclass(frozen=True)
class StepTotals:
    """The step's counts over all processes: action tokens, calls with an action, and tokens per episode
    (in ``step_episodes`` order; ``slot`` maps an episode id to its index)."""

    actions: int
    calls: int
    episode_tokens: torch.Tensor  # float32 [E]
    slot: Mapping[str, int]

    @property
    def episodes(self) -> int:
        return int((self.episode_tokens > 0).sum())


def step_totals(batches: Sequence[PackedBatch], episode_of: Mapping[str, str], runtime: Runtime = CPU,
                step_episodes: Sequence[str] | None = None) -> StepTotals:
    """Local counts summed over processes with one ``all_reduce_sum``; ``step_episodes`` defaults to this
    process's episodes (right for one process)."""
    calls = [(i, n) for b in batches for i, n in zip(b.invocation_ids, b.action_counts, strict=True) if n]
    if step_episodes is None:
        step_episodes = list(dict.fromkeys(episode_of[i] for i, _ in calls))
    slot = {e: k for k, e in enumerate(step_episodes)}
    local = torch.zeros(2 + len(slot), dtype=torch.float64)
    local[0], local[1] = sum(n for _, n in calls), len(calls)
    for inv_id, n in calls:
        local[2 + slot[episode_of[inv_id]]] += n
    total = runtime.all_reduce_sum(local.to(runtime.device)).cpu()
    return StepTotals(int(total[0]), int(total[1]), total[2:].to(torch.float32), slot)


def step_weights(batches: Sequence[PackedBatch], episode_of: Mapping[str, str], mode: Weighting | str,
                 totals: StepTotals, device: str = "cpu") -> list[torch.Tensor]:
    """Float32 weights ``[A_b]`` per batch, normalised over the global step (module docstring)."""
    mode = Weighting(mode)
    out = []
    for b in batches:
        n = int(b.action_ids.shape[0])
        per_token_calls = [(i, c) for i, c in zip(b.invocation_ids, b.action_counts, strict=True) for _ in range(c)]
        if mode is Weighting.token:
            w = torch.full((n,), 1.0 / totals.actions if totals.actions else 0.0, dtype=torch.float32)
        elif mode is Weighting.call:
            sizes = torch.tensor([c for _, c in per_token_calls], dtype=torch.float32)
            w = 1.0 / (totals.calls * sizes)
        else:
            index = torch.tensor([totals.slot[episode_of[i]] for i, _ in per_token_calls], dtype=torch.long)
            w = 1.0 / (totals.episodes * totals.episode_tokens[index])
        out.append(w.to(device))
    return out


def _per_action(batch: PackedBatch, values: Mapping[str, float], device) -> torch.Tensor:
    return torch.cat([torch.full((n,), float(values[i])) for i, n in zip(batch.invocation_ids, batch.action_counts,
                                                                      strict=True)]).to(device)


def accumulate_step(student: PackedModel, rows: Sequence[Row], inputs: StepInputs, objective: Objective,
                    runtime: Runtime = CPU, *, reference: PackedModel | None = None,
                    step_episodes: Sequence[str] | None = None) -> StepResult:
    """Forward and backward over this process's student rows, one row per micro-batch (gradients
    accumulate in ``student.model``). ``reference``: the frozen model of the anchor term."""
    batches = [student.collate([r]) for r in rows]
    totals_ = step_totals(batches, inputs.episode_of, runtime, step_episodes)
    weights = step_weights(batches, inputs.episode_of, objective.weighting, totals_, student.device)
    totals = {t.name: 0.0 for _, t in objective.terms}
    metrics: dict[str, float] = {}
    tokens = actions = 0
    for batch, w in zip(batches, weights, strict=True):
        logits = student.action_logits(batch)
        mb = MicroBatch(
            logits=logits, action_ids=batch.action_ids, sampler_logprobs=batch.sampler_logprobs,
            sampling_temperature=_per_action(batch, inputs.temperature_of, logits.device),
            advantages=_per_action(batch, inputs.advantage_of, logits.device), weights=w,
            teacher=_teacher(batch, inputs.teacher, logits.device) if objective.needs_teacher else None,
            reference=_reference(reference, batch) if objective.needs_reference else None,
        )
        loss = logits.new_zeros(())
        for weight, term in objective.terms:
            value = term(mb)
            loss = loss + weight * value.loss
            totals[term.name] += float(value.loss.detach())
            for key, v in value.metrics.items():
                metrics[key] = metrics.get(key, 0.0) + v
        loss.backward()
        tokens += batch.num_tokens
        actions += int(batch.action_ids.shape[0])
    total = 0.0
    for weight, term in objective.terms:
        total += weight * totals[term.name]
    metrics.update({f"{name}_loss": v for name, v in totals.items() if name not in ("kd", "rl")})
    return StepResult(total, totals.get("kd", 0.0), totals.get("rl", 0.0), tokens, actions, metrics,
                      totals_.actions)


def _teacher(batch: PackedBatch, targets: TeacherTargets | None, device) -> torch.Tensor:
    if targets is None:
        raise TrainingError("the objective has a distillation term but the step has no teacher targets")
    return torch.cat([targets.values[i] for i in batch.invocation_ids]).to(device)


def _reference(reference: PackedModel | None, batch: PackedBatch) -> torch.Tensor:
    if reference is None:
        raise TrainingError("anchor_weight > 0 needs the frozen reference model (Models.reference)")
    with torch.no_grad():
        return reference.action_logits(batch)

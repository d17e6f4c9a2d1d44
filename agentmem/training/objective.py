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

A step of weighted parts (``Mix``, PSD ``mixed``) normalises each part's weights as above within the part
(the vector carries ``N`` and ``C`` per part) and scales them by the part's share, so the step loss is the
shares' weighted sum of the parts' losses.

Each process's loss is its share of the step loss; the step gradient is the *sum* of the processes'
gradients (not their mean): the student's DDP wrapper sums them (``forward.PackedModel.for_training``),
once per step, on the last micro-batch; a process with no row that step runs an empty batch so it still
takes part.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from agentmem.config import Weighting
from agentmem.errors import TrainingError
from agentmem.records import TERM_LOSS
from agentmem.replay import Row
from agentmem.runtime import CPU, Runtime
from agentmem.training.collate import PackedBatch
from agentmem.training.forward import PackedModel
from agentmem.training.losses import reverse_kl
from agentmem.training.teachers import TeacherTargets
from agentmem.training.terms import DistillTerm, MicroBatch, Objective, objective_from_config

__all__ = ["Mix", "Objective", "StepInputs", "StepResult", "accumulate_step", "objective_from_config", "step_totals",
           "step_weights"]


@dataclass(frozen=True)
class StepInputs:
    """Per-invocation facts the objective needs besides the rows: its episode, the episode's advantage,
    the sampling temperature (> 0), the teacher's targets (None when no term needs a teacher) and, for a
    step of weighted parts (PSD mixed), the ``Mix``."""

    episode_of: Mapping[str, str]
    advantage_of: Mapping[str, float]
    temperature_of: Mapping[str, float]
    teacher: TeacherTargets | None = None
    mix: Mix | None = None  # PSD mixed: the step's weighted parts
    # dynamics (``agentmem.training.dynamics``): each call's kind and the end-of-sequence id; when given,
    # the step's metrics carry the first-token EOS mass per kind and the KLs to the teacher and reference
    kind_of: Mapping[str, str] | None = None
    eos_id: int | None = None
    # the teacher term's centring (DistillConfig.loss.teacher_centering): each call's group, one mapping for the
    # whole step on every process (``agentmem.replay.groups.centering_groups``)
    center_group_of: Mapping[str, str] | None = None


@dataclass(frozen=True)
class StepResult:
    """This process's share of the step. ``loss`` is ``sum_k weight_k * term_k``; ``metrics`` holds every
    term's unweighted value as ``{name}_loss`` (``records.TERM_LOSS``; built-in and plugin terms alike, each
    term of the objective, first, in its order), then the terms' own metrics (``TermValue.metrics``) and the
    dynamics sums; ``global_actions`` is the step's action tokens over all processes."""

    loss: float
    tokens: int
    actions: int
    metrics: dict[str, float]
    global_actions: int = 0


@dataclass(frozen=True)
class Mix:
    """A step made of weighted parts (PSD ``mixed``: on-policy calls, part 0, and off-policy calls, part 1).
    ``part_of`` maps an episode id to its part; token weights are normalised within each part as the
    weighting says, then scaled by the part's ``shares[p]``, so the step loss of any term is exactly
    ``sum_p shares[p] * L_p`` with ``L_p`` that term's step loss over part ``p`` alone (a part with no
    action token in a step adds nothing)."""

    part_of: Mapping[str, int]
    shares: tuple[float, ...]


@dataclass(frozen=True)
class StepTotals:
    """The step's counts over all processes, per part (one part unless the step is a ``Mix``): action
    tokens, calls with an action, and tokens per episode (in ``step_episodes`` order; ``slot`` maps an
    episode id to its index, ``episode_parts`` gives each slot's part)."""

    part_actions: tuple[int, ...]
    part_calls: tuple[int, ...]
    episode_tokens: torch.Tensor  # float32 [E]
    slot: Mapping[str, int]
    episode_parts: torch.Tensor  # int64 [E]

    @property
    def actions(self) -> int:
        return sum(self.part_actions)

    @property
    def calls(self) -> int:
        return sum(self.part_calls)

    @property
    def episodes(self) -> int:
        return int((self.episode_tokens > 0).sum())

    def part_episodes(self) -> list[int]:
        """Episodes with any action token, per part."""
        return [int(((self.episode_tokens > 0) & (self.episode_parts == p)).sum()) for p in range(len(self.part_actions))]


def _part(mix: Mix | None, episode: str) -> int:
    return mix.part_of[episode] if mix is not None else 0


def step_totals(batches: Sequence[PackedBatch], episode_of: Mapping[str, str], runtime: Runtime = CPU,
                step_episodes: Sequence[str] | None = None, mix: Mix | None = None) -> StepTotals:
    """Local counts summed over processes with one ``all_reduce_sum``; ``step_episodes`` defaults to this
    process's episodes (right for one process). The vector is ``[N_p..., C_p..., n_e...]``."""
    calls = [(i, n) for b in batches for i, n in zip(b.invocation_ids, b.action_counts, strict=True) if n]
    if step_episodes is None:
        step_episodes = list(dict.fromkeys(episode_of[i] for i, _ in calls))
    parts = len(mix.shares) if mix is not None else 1
    slot = {e: k for k, e in enumerate(step_episodes)}
    local = torch.zeros(2 * parts + len(slot), dtype=torch.float64)
    for inv_id, n in calls:
        p = _part(mix, episode_of[inv_id])
        local[p] += n
        local[parts + p] += 1
        local[2 * parts + slot[episode_of[inv_id]]] += n
    total = runtime.all_reduce_sum(local.to(runtime.device)).cpu()
    return StepTotals(tuple(int(x) for x in total[:parts]), tuple(int(x) for x in total[parts : 2 * parts]),
                      total[2 * parts :].to(torch.float32), slot,
                      torch.tensor([_part(mix, e) for e in step_episodes], dtype=torch.long))


def step_weights(batches: Sequence[PackedBatch], episode_of: Mapping[str, str], mode: Weighting | str,
                 totals: StepTotals, device: str = "cpu", mix: Mix | None = None) -> list[torch.Tensor]:
    """Float32 weights ``[A_b]`` per batch, normalised over the global step (module docstring), within
    each part of a ``Mix`` and scaled by its share."""
    mode = Weighting(mode)
    shares = torch.tensor(mix.shares if mix is not None else (1.0,), dtype=torch.float32)
    inv_actions = torch.tensor([1.0 / a if a else 0.0 for a in totals.part_actions], dtype=torch.float32)
    calls = torch.tensor(totals.part_calls, dtype=torch.float32)
    episodes = torch.tensor(totals.part_episodes(), dtype=torch.float32)
    out = []
    for b in batches:
        per_token_calls = [(i, c) for i, c in zip(b.invocation_ids, b.action_counts, strict=True) for _ in range(c)]
        part = torch.tensor([_part(mix, episode_of[i]) for i, _ in per_token_calls], dtype=torch.long)
        if mode is Weighting.token:
            w = inv_actions[part]
        elif mode is Weighting.call:
            sizes = torch.tensor([c for _, c in per_token_calls], dtype=torch.float32)
            w = 1.0 / (calls[part] * sizes)
        else:
            index = torch.tensor([totals.slot[episode_of[i]] for i, _ in per_token_calls], dtype=torch.long)
            w = 1.0 / (episodes[part] * totals.episode_tokens[index])
        out.append((w * shares[part]).to(device))
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
    totals_ = step_totals(batches, inputs.episode_of, runtime, step_episodes, inputs.mix)
    weights = step_weights(batches, inputs.episode_of, objective.weighting, totals_, student.device, inputs.mix)
    totals = {t.name: 0.0 for _, t in objective.terms}
    metrics = _monitor_keys(inputs, reference)
    centers: list[Center | None] = [None] * len(batches)
    if objective.centered is not None:
        centers, shared = _centers(student, batches, weights, inputs, objective.centered, runtime)
        metrics["kd_shared_fraction"] = shared if runtime.rank == 0 else 0.0  # summed over processes
    tokens = actions = 0
    if not batches and student.wrapper is not None:
        with student.micro_batch(last=True):
            (student.action_logits(student.empty_batch()).sum() * student.grad_scale).backward()
    for k, (batch, w) in enumerate(zip(batches, weights, strict=True)):
        with student.micro_batch(last=k == len(batches) - 1):
            _micro_step(student, batch, w, inputs, objective, reference, totals, metrics, centers[k])
        tokens += batch.num_tokens
        actions += int(batch.action_ids.shape[0])
    total = 0.0
    for weight, term in objective.terms:
        total += weight * totals[term.name]
    losses = {f"{name}{TERM_LOSS}": v for name, v in totals.items()}
    return StepResult(total, tokens, actions, {**losses, **metrics}, totals_.actions)


@dataclass(frozen=True)
class Center:
    """A micro-batch's share of the centring: its calls' first action positions [G] and, at each, the
    weighted mean push of that call's kind over the whole step [G, V]."""

    positions: torch.Tensor
    mean_push: torch.Tensor


def _firsts(batch: PackedBatch) -> list[tuple[str, int]]:
    """(invocation id, index among the batch's action tokens) of each call's first action token."""
    out, pos = [], 0
    for inv, n in zip(batch.invocation_ids, batch.action_counts, strict=True):
        if n:
            out.append((inv, pos))
        pos += n
    return out


def _centers(student: PackedModel, batches: Sequence[PackedBatch], weights: Sequence[torch.Tensor],
             inputs: StepInputs, term: DistillTerm, runtime: Runtime) -> tuple[list[Center | None], float]:
    """The group baseline of the teacher term's push (``DistillConfig.loss.teacher_centering``): one forward of
    the student without gradient over this process's rows gives the push ``g_i = dD_i/dz_i`` at each call's
    first action token; per group (``StepInputs.center_group_of``), ``m_k = sum_i w_i g_i / sum_i w_i`` over the
    step's calls of that group on every process (one ``all_reduce_sum``). The term then moves each first token by ``w_i (g_i - m_k)``,
    so the pushes of a kind add to zero. Also returns the shared part's share of the push's weighted energy,
    ``sum_k W_k |m_k|^2 / sum_i w_i |g_i|^2`` (1: every call of a kind is pushed the same way)."""
    if inputs.center_group_of is None:
        raise TrainingError("teacher_centering needs each call's group (StepInputs.center_group_of)")
    group_of = inputs.center_group_of
    kinds = {k: j for j, k in enumerate(sorted(set(group_of.values())))}
    sums = torch.zeros(len(kinds), student.vocab + 1, dtype=torch.float64)  # weighted push sums, then the weight
    energy = torch.zeros(1, dtype=torch.float64)
    local: list[tuple[torch.Tensor, torch.Tensor]] = []
    for batch, w in zip(batches, weights, strict=True):
        firsts = _firsts(batch)
        positions = torch.tensor([p for _, p in firsts], dtype=torch.long, device=w.device)
        group = torch.tensor([kinds[group_of[i]] for i, _ in firsts], dtype=torch.long)
        with torch.no_grad():
            logits = student.action_logits(batch)[positions]
        push = term.push(logits, _teacher(batch, inputs.teacher, logits.device)[positions]).double().cpu()
        wf = w[positions].double().cpu()
        sums[:, :-1].index_add_(0, group, wf[:, None] * push)
        sums[:, -1].index_add_(0, group, wf)
        energy += (wf * push.pow(2).sum(-1)).sum()
        local.append((positions, group))
    total = runtime.all_reduce_sum(torch.cat([sums.flatten(), energy]).to(runtime.device)).cpu()
    sums, energy = total[:-1].view(len(kinds), -1), total[-1]
    weight = sums[:, -1]
    means = sums[:, :-1] / weight.clamp_min(1e-300)[:, None]
    shared = float((weight * means.pow(2).sum(-1)).sum() / energy) if energy > 0 else 0.0
    return [Center(p, means[g].to(torch.float32).to(p.device)) for p, g in local], shared


def _micro_step(student: PackedModel, batch: PackedBatch, w: torch.Tensor, inputs: StepInputs,
                objective: Objective, reference: PackedModel | None, totals: dict[str, float],
                metrics: dict[str, float], center: Center | None = None) -> None:
    """Forward and backward of one micro-batch; adds its term values into ``totals`` and ``metrics``."""
    logits = student.action_logits(batch)
    ref = _reference(reference, batch) if objective.needs_reference or reference is not None else None
    mb = MicroBatch(
        logits=logits, action_ids=batch.action_ids, sampler_logprobs=batch.sampler_logprobs,
        sampling_temperature=_per_action(batch, inputs.temperature_of, logits.device),
        advantages=_per_action(batch, inputs.advantage_of, logits.device), weights=w,
        teacher=_teacher(batch, inputs.teacher, logits.device) if objective.needs_teacher else None,
        reference=ref if objective.needs_reference else None,
        center_positions=center.positions if center is not None else None,
        center=center.mean_push if center is not None else None,
    )
    if inputs.kind_of is not None:
        _monitor(batch, mb, ref, inputs, metrics)
    loss = logits.new_zeros(())
    for weight, term in objective.terms:
        value = term(mb)
        loss = loss + weight * value.loss
        totals[term.name] += float(value.loss.detach())
        for key, v in value.metrics.items():
            if key.endswith(TERM_LOSS):
                raise TrainingError(f"loss term {term.name!r} reports metric {key!r}: a name ending in "
                                    f"{TERM_LOSS!r} is a term's value (name it otherwise)")
            metrics[key] = metrics.get(key, 0.0) + v
    (loss * student.grad_scale if student.grad_scale != 1.0 else loss).backward()


def _monitor_keys(inputs: StepInputs, reference: PackedModel | None) -> dict[str, float]:
    """The dynamics sums every process starts from, at 0, in one order: the processes' metrics are summed
    key by key (``Trainer._reduce``), so a process whose rows lack a call kind must still carry its keys."""
    if inputs.kind_of is None:
        return {}
    keys = [f"{p}/{k}" for k in sorted(set(inputs.kind_of.values())) for p in ("eos_first_sum", "eos_first_n")]
    if inputs.teacher is not None and inputs.teacher.full_vocab:
        keys.append("kl_teacher")
    if reference is not None:
        keys.append("kl_start")
    return dict.fromkeys(keys, 0.0)


def _monitor(batch: PackedBatch, mb: MicroBatch, ref: torch.Tensor | None, inputs: StepInputs,
             metrics: dict[str, float]) -> None:
    """Add the dynamics sums of one micro-batch to ``metrics`` (no gradient): the student's end-of-sequence
    probability at each call's first output position (``eos_first_sum/<kind>``, ``eos_first_n/<kind>``),
    and the weighted KL to the teacher (full-vocabulary targets only) and to the reference."""
    assert inputs.kind_of is not None
    with torch.no_grad():
        logits = mb.logits.detach()
        if inputs.eos_id is not None and logits.shape[0]:
            firsts = _firsts(batch)
            probs = torch.softmax(logits[[s for _, s in firsts]].float(), dim=-1)[:, inputs.eos_id].tolist()
            for (inv, _), p in zip(firsts, probs, strict=True):
                kind = inputs.kind_of[inv]
                metrics[f"eos_first_sum/{kind}"] = metrics.get(f"eos_first_sum/{kind}", 0.0) + p
                metrics[f"eos_first_n/{kind}"] = metrics.get(f"eos_first_n/{kind}", 0.0) + 1.0
        w = mb.weights.float()
        teacher = mb.teacher
        if teacher is not None and teacher.dim() == 2:  # a top-K teacher's missing mass: a floor of -1e4
            teacher = torch.nan_to_num(teacher.float(), neginf=-1e4)
            metrics["kl_teacher"] = metrics.get("kl_teacher", 0.0) + float((reverse_kl(logits, teacher) * w).sum())
        if ref is not None:
            metrics["kl_start"] = metrics.get("kl_start", 0.0) + float((reverse_kl(logits, ref) * w).sum())


def _teacher(batch: PackedBatch, targets: TeacherTargets | None, device) -> torch.Tensor:
    if targets is None:
        raise TrainingError("the objective has a distillation term but the step has no teacher targets")
    return torch.cat([targets.values[i] for i in batch.invocation_ids]).to(device)


def _reference(reference: PackedModel | None, batch: PackedBatch) -> torch.Tensor:
    if reference is None:
        raise TrainingError("anchor_weight > 0 needs the frozen reference model (Models.reference)")
    with torch.no_grad():
        return reference.action_logits(batch)

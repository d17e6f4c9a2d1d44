"""Distillation from stored invocations: the ``Trainer`` (the job around it, with run bookkeeping, model
loading and resume, is ``agentmem.jobs.distill``, on the shell it shares with sft:
``agentmem.jobs.training_shell``).

Each step takes ``invocations_per_step`` stored calls in a seeded order that depends only on
(seed, step) (with several processes, each takes every ``world_size``-th of them), rebuilds them for
the student (aligned: its own state, never cut) and asks the teacher source for targets under the chosen
context, then minimises the objective (``terms``: ``kd_weight`` x divergence, ``rl_weight`` x clipped
policy gradient, ``ce_weight`` x cross-entropy, ``anchor_weight`` x KL to the frozen starting student).

State alignment: a student call over ``row_tokens`` is refused (``oversize=error``: ReplayError naming the
invocation, its length and the budget) or left out of the step and of the teacher's targets
(``oversize=skip``), and counted in ``TrainStep.metrics`` (``skipped_calls``, ``skipped_tokens``). It is
never trained on truncated. Teacher contexts are cut from the left only with ``teacher_truncation=left``,
counted in ``teacher_truncated_calls`` / ``teacher_truncated_tokens``.

Packing: ``config.batch.packing`` lays out the student's rows, the online teacher's and (through the student's
batch) the anchor reference's; with ``shared_prefix`` the calls of one (run, task, step) group compute
their common prompt prefix once, and the step's loss and gradient are those of ``segments``.

PSD mixed (``config.teacher.psd``): the calls the student sampled and those sampled under the privileged prompt
are two parts; every step draws from each (its own seeded order, the calls split evenly) and the step loss
is ``(1 - psd_mix) L_on + psd_mix L_off`` (``objective.Mix``).

Several processes (``runtime.world_size > 1``, started by torchrun): every process draws the same step
and packs and runs its share of the units; the student's forward runs through DDP (``forward``), which
sums the gradients once per step, and ``_reduce`` sums the step's losses and counts for the record. Only
rank 0 writes: ``save`` writes the checkpoint folder and its row on rank 0 and hands the record to the
others (a barrier).

Temperature: every compared distribution at ``config.loss.temperature`` (see ``terms``); the policy-gradient
ratio at each call's sampling temperature.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentmem.config import DistillConfig, Oversize, Packing, PsdMode, RewardKind, RLKind, TeacherCentering
from agentmem.errors import ConfigError, TrainingError
from agentmem.records import Checkpoint, SamplingContext, TeacherContext, TrainStep
from agentmem.replay import OverBudget, pack
from agentmem.replay.groups import centering_groups
from agentmem.runtime import CPU, Runtime
from agentmem.training.advantages import group_advantages
from agentmem.training.checkpoints import gather_full_state, save_checkpoint
from agentmem.training.dynamics import finish_sums, group_liveness, output_stats
from agentmem.training.forward import PackedModel
from agentmem.training.objective import Mix, StepInputs, StepResult, accumulate_step
from agentmem.training.schedule import lr_at
from agentmem.training.selection import Selection, select, student_sequences, teacher_sequences
from agentmem.training.teachers import TeacherSource, teacher_source
from agentmem.training.terms import objective_from_config
from agentmem.training.vocab import check_same_vocab, vocab_size
from store import repository as repo
from store.engine import Store

__all__ = ["DistillConfig", "Models", "Trainer", "advantages", "step_indices"]


@dataclass(frozen=True)
class Models:
    """The loaded models of a distill job. ``reference`` is a frozen copy of the starting student, needed
    only by the anchor term (``anchor_weight > 0``)."""

    student: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    student_checkpoint: Checkpoint  # the version the student starts from (parent of the first save)
    teacher: PreTrainedModel | None = None
    teacher_tokenizer: PreTrainedTokenizerBase | None = None
    teacher_name: str | None = None  # the teacher's resolved path, as `agentmem score` stores it
    reference: PreTrainedModel | None = None


def step_indices(n: int, per_step: int, seed: int, step: int, stream: int | None = None) -> np.ndarray:
    """The selection indices of step ``step`` (0-based): epochs of a seeded permutation, a function of
    (n, per_step, seed, step) only, so a resumed run draws exactly what an uninterrupted one would.
    ``stream`` gives an independent order under the same seed (each part of a PSD mixed step)."""
    per_epoch = max(1, -(-n // per_step))
    epoch, pos = divmod(step, per_epoch)
    perm = np.random.default_rng([seed, epoch] if stream is None else [seed, stream, epoch]).permutation(n)
    return np.sort(perm[pos * per_step : (pos + 1) * per_step])


def draw_units(seqs: list, packing: Packing) -> list[list[int]]:
    """What a step draws, as lists of indices into ``seqs``: single calls with ``segments`` packing; with
    ``shared_prefix``, whole (run, task, step) groups, so the siblings that share a prompt prefix are
    trained on in the same step (and on the same process) and the prefix is computed once."""
    if packing is not Packing.shared_prefix:
        return [[i] for i in range(len(seqs))]
    groups: dict = {}
    for i, seq in enumerate(seqs):
        groups.setdefault(seq.group if seq.group is not None else ("call", i), []).append(i)
    return list(groups.values())


def step_units(units: list[list[int]], calls_per_step: int, seed: int, step: int,
               stream: int | None = None) -> list[int]:
    """The units (see ``draw_units``) of step ``step``: a seeded permutation per epoch, as many units as
    make ``calls_per_step`` calls on average (at least one)."""
    mean = sum(len(u) for u in units) / len(units)
    return step_indices(len(units), max(1, round(calls_per_step / mean)), seed, step, stream).tolist()


def psd_mix(selection: Selection, off_policy_share: float) -> Mix:
    """PSD mixed: part 0 holds the episodes the student sampled, part 1 those sampled under the privileged
    prompt (their calls store ``privileged_ids``); the step loss is ``(1 - share) L_0 + share L_1``.
    Raises TrainingError unless the selection holds calls of both."""
    privileged = {i.episode_id for i in selection.invocations if i.privileged_ids is not None}
    part_of = {e: int(e in privileged) for e in selection.episodes}
    if len(set(part_of[i.episode_id] for i in selection.invocations)) < 2:
        raise TrainingError("psd=mixed needs calls sampled by the student and calls sampled under the privileged "
                            "prompt (a normal and a `rollout --context privileged` run) in the selection")
    return Mix(part_of, (1.0 - off_policy_share, off_policy_share))


def episode_reward(episode, kind: RewardKind = RewardKind.f1) -> float:
    """The reward the RL term sees (``RewardKind``): ``f1`` is the stored reward (a rollout stores its
    F1); a failed or unscored episode gets 0."""
    f1 = episode.reward if episode.reward is not None else (episode.f1 or 0.0)
    if kind is RewardKind.f1:
        return float(f1)
    sub_em = float(episode.sub_em or 0.0)
    return sub_em if kind is RewardKind.sub_em else max(float(f1), sub_em)


def episode_advantages(selection: Selection, normalize_std: bool,
                       reward: RewardKind = RewardKind.f1) -> dict[str, float]:
    """Per-episode advantage: its reward minus the mean of the episodes sampled for the same task in the
    same run."""
    eps = list(selection.episodes.values())
    adv = group_advantages([episode_reward(e, reward) for e in eps], [(e.run_id, e.task_id) for e in eps],
                           normalize_std)
    return {e.id: float(a) for e, a in zip(eps, adv, strict=True)}


def advantages(selection: Selection, normalize_std: bool, reward: RewardKind = RewardKind.f1) -> dict[str, float]:
    """Per-invocation advantage: its episode's (``episode_advantages``)."""
    by_episode = episode_advantages(selection, normalize_std, reward)
    return {i.id: by_episode[i.episode_id] for i in selection.invocations}


class Trainer:
    """Steps of one distill job on a selection: ``step(i) -> TrainStep`` (the optimiser step included)
    and ``save(steps_done, parent) -> Checkpoint``. Every tensor goes to ``runtime.device``; the models
    must already be there. ``teacher``: a source to use instead of the one ``config.teacher.source``
    names (built from ``models``); ``selection``: the calls to train on, instead of every call of
    ``config.run_ids`` of ``config.kinds`` (``agentmem sft --min-f1`` filters by episode outcome);
    ``student_context``: ``privileged`` (``hint``) trains under the privileged splice (each update's hint line):
    ``SftConfig.context``, a privileged (hint) teacher's SFT; refused with a teacher or an RL term."""

    def __init__(self, store: Store, config: DistillConfig, models: Models, run_id: str,
                 runtime: Runtime = CPU, *, teacher: TeacherSource | None = None,
                 selection: Selection | None = None, student_context: SamplingContext = SamplingContext.aligned):
        self.store, self.config, self.models, self.run_id, self.runtime = store, config, models, run_id, runtime
        self.objective = objective_from_config(config)
        self.student = PackedModel.for_training(models.student, models.tokenizer, config.batch.path, runtime,
                                                config.mixed_precision)
        if models.teacher is not None:
            check_same_vocab(models.teacher_tokenizer, models.tokenizer)
            vocab_size(models.teacher, models.teacher_tokenizer)
        self.reference = (PackedModel.create(models.reference, models.tokenizer, config.batch.path, runtime,
                                             config.mixed_precision)
                          if models.reference is not None
                          and (self.objective.needs_reference or config.monitor_start_kl) else None)
        # calls sampled under a grammar are left out: their log-probs are of the masked distribution
        self.selection = (selection if selection is not None
                          else select(store, config.run_ids, kinds=config.kinds, constrained=False))
        if student_context is not SamplingContext.aligned:  # a privileged or hint teacher's own SFT
            if models.teacher is not None or config.rl.kind is not RLKind.none:
                raise ConfigError(f"a {student_context.value} student context is an SFT's (a {student_context.value} "
                                  "teacher's): a student that distils or learns from a reward reads only its own prompt")
            self.student_seqs = teacher_sequences(self.selection, TeacherContext(student_context.value),
                                                  models.tokenizer)
        else:
            self.student_seqs = student_sequences(self.selection)
        self.units = draw_units(self.student_seqs, config.batch.packing)
        self.episode_of = {i.id: i.episode_id for i in self.selection.invocations}
        self.mix = psd_mix(self.selection, config.teacher.psd_mix) if config.teacher.psd is PsdMode.mixed else None
        self.part_units = self._part_units()
        self.teacher = teacher if teacher is not None else teacher_source(
            config, store, self.selection, model=models.teacher, tokenizer=models.teacher_tokenizer,
            name=models.teacher_name, vocab=self.student.vocab, runtime=runtime)
        self.episode_advantage = episode_advantages(self.selection, config.rl.normalize_std, config.rl.reward)
        self.advantage_of = {i.id: self.episode_advantage[i.episode_id] for i in self.selection.invocations}
        self.group_of = {e.id: (e.run_id, e.task_id) for e in self.selection.episodes.values()}
        self.group_sizes: dict[tuple, int] = {}
        for g in self.group_of.values():
            self.group_sizes[g] = self.group_sizes.get(g, 0) + 1
        self.invocation = {i.id: i for i in self.selection.invocations}
        self.kind_of = {i.id: str(i.kind) for i in self.selection.invocations}
        self.center_group_of = (centering_groups(self.selection.invocations, config.loss.teacher_centering)
                                if config.loss.teacher_centering is not TeacherCentering.none else None)
        self.eos_id = models.tokenizer.eos_token_id
        self.temperature_of = {i.id: (i.temperature if i.temperature > 0 else 1.0) for i in self.selection.invocations}
        # the fused kernel: one pass per parameter, where torch's CPU default loops over several (0.07 s against
        # 0.35 s a step for the default model's 135M weights); FSDP2's sharded parameters keep torch's choice
        self.optimizer = torch.optim.AdamW([p for p in models.student.parameters() if p.requires_grad],
                                           lr=config.optim.lr, weight_decay=config.optim.weight_decay,
                                           fused=None if runtime.fsdp else True)

    def step(self, step: int) -> TrainStep:
        if self.config.optim.coast:
            return self._coast(step)
        t0 = time.perf_counter()
        units = self._draw(step)
        drawn = [i for u in units for i in self.units[u]]
        step_episodes = list(dict.fromkeys(self.episode_of[self.student_seqs[i].invocation_id] for i in drawn))
        mine = [self.student_seqs[i] for u in units[self.runtime.rank :: self.runtime.world_size]
                for i in self.units[u]]
        over: OverBudget = "skip" if self.config.batch.oversize == Oversize.skip else "error"
        rows, stats = pack(mine, self.config.batch.row_tokens, over_budget=over,
                           shared_prefix=self.config.batch.packing is Packing.shared_prefix)
        skipped = set(stats.skipped_ids)
        kept = [s.invocation_id for s in mine if s.invocation_id not in skipped]
        targets = self.teacher.targets(kept) if self.teacher is not None and kept else None
        inputs = StepInputs(self.episode_of, self.advantage_of, self.temperature_of, targets, self.mix,
                            self.kind_of, self.eos_id, self.center_group_of)
        model = self.models.student
        model.train()
        lr = self.lr(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        result: StepResult = accumulate_step(self.student, rows, inputs, self.objective, self.runtime,
                                             reference=self.reference, step_episodes=step_episodes)
        counts = {"skipped_calls": float(stats.skipped_sequences), "skipped_tokens": float(stats.skipped_tokens),
                  "teacher_truncated_calls": float(targets.truncated_calls if targets else 0),
                  "teacher_truncated_tokens": float(targets.truncated_tokens if targets else 0),
                  "teacher_tokens": float(targets.tokens if targets else 0)}
        result, counts = self._reduce(result, counts)
        self.objective.end_step(result.metrics)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.config.optim.max_grad_norm)
        self.optimizer.step()
        return TrainStep(
            run_id=self.run_id, step=step + 1, loss=result.loss, tokens=result.tokens, lr=lr,
            seconds=time.perf_counter() - t0,
            metrics={**finish_sums(result.metrics), "grad_norm": float(grad_norm), "actions": float(result.actions),
                     "fill": stats.fill, "rows": float(stats.rows), **counts, **self._dynamics(drawn, step_episodes)},
        )

    def _coast(self, step: int) -> TrainStep:
        """One step with every gradient zero (``optim.coast``): AdamW moves each weight by its carried state."""
        t0 = time.perf_counter()
        lr = self.lr(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
            for p in group["params"]:
                p.grad = torch.zeros_like(p)
        self.optimizer.step()
        return TrainStep(run_id=self.run_id, step=step + 1, loss=0.0, tokens=0, lr=lr,
                         seconds=time.perf_counter() - t0, metrics={"grad_norm": 0.0, "actions": 0.0})

    def lr(self, step: int) -> float:
        """The learning rate of step ``step`` (0-based, this job's): the schedule at the global step."""
        c = self.config.optim
        return lr_at(c.schedule_offset + step, c.lr, c.schedule_steps or c.steps, c.warmup_steps, c.schedule,
                     c.min_lr_ratio)

    def _dynamics(self, drawn: list[int], step_episodes: list[str]) -> dict[str, float]:
        """The step's groups with a live advantage and its calls' output lengths per kind (every process
        computes the same values from the step's whole draw)."""
        calls = [self.invocation[self.student_seqs[i].invocation_id] for i in drawn]
        out = output_stats([(self.kind_of[c.id], c.output_ids) for c in calls], self.eos_id)
        if self.objective_has_rl:
            groups, live = group_liveness(self.episode_advantage, self.group_of, step_episodes, self.group_sizes)
            out.update({"rl_groups": float(groups), "rl_groups_live": float(live),
                        "rl_live_fraction": live / groups if groups else 0.0})
        return out

    @property
    def objective_has_rl(self) -> bool:
        return any(t.name == "rl" for _, t in self.objective.terms)

    def _part_units(self) -> list[list[int]]:
        """Unit indices per part (one part unless PSD mixed)."""
        if self.mix is None:
            return [list(range(len(self.units)))]
        part = [self.mix.part_of[self.episode_of[self.student_seqs[u[0]].invocation_id]] for u in self.units]
        return [[k for k, p in enumerate(part) if p == q] for q in range(len(self.mix.shares))]

    def _draw(self, step: int) -> list[int]:
        """The units of step ``step``; with PSD mixed, each part's own seeded order, the step's calls split
        evenly between the parts (the first gets the odd one)."""
        per_step, seed = self.config.batch.invocations_per_step, self.config.seed
        if self.mix is None:
            return step_units(self.units, per_step, seed, step)
        counts = [per_step // 2 + per_step % 2, per_step // 2]
        return [units[k] for p, units in enumerate(self.part_units)
                for k in step_units([self.units[u] for u in units], counts[p], seed, step, stream=p)]

    def _reduce(self, result: StepResult, counts: dict[str, float]) -> tuple[StepResult, dict[str, float]]:
        """With several processes: sum the step's losses and counts over them in one all-reduce (the
        gradients were summed by the student's DDP wrapper during the backward)."""
        if self.runtime.world_size == 1:
            return result, counts
        scalars = {"loss": result.loss, "tokens": float(result.tokens), "actions": float(result.actions),
                   **result.metrics, **counts}
        flat = torch.tensor(list(scalars.values()), dtype=torch.float64, device=self.runtime.device)
        summed = dict(zip(scalars, self.runtime.all_reduce_sum(flat).tolist(), strict=True))
        metrics = {k: summed[k] for k in result.metrics}
        reduced = StepResult(summed["loss"], int(summed["tokens"]), int(summed["actions"]), metrics,
                             result.global_actions)
        return reduced, {k: summed[k] for k in counts}

    def save(self, steps_done: int, parent: Checkpoint) -> Checkpoint:
        """Every process calls it; rank 0 writes the folder and registers it, the others wait for the record."""
        folder = Path(self.config.out).expanduser().resolve() / self.run_id / f"step-{steps_done:06d}"
        ckpt = None
        full = None
        if self.student.wrapper == "fsdp":  # every process takes part in gathering the shards
            full = gather_full_state(self.models.student, self.optimizer)
        if self.runtime.is_main:
            save_checkpoint(folder, self.models.student, self.models.tokenizer, self.optimizer, steps_done,
                            self.objective.state_dict(), full_state=full)
            ckpt = Checkpoint(run_id=self.run_id, parent_id=parent.id, step=steps_done, path=str(folder),
                              base_model=parent.base_model)
            with self.store.session() as s:
                repo.insert_checkpoint(s, ckpt)
                s.commit()
        return self.runtime.broadcast(ckpt)

"""The distill job (``agentmem distill``): train a student from stored invocations.

Each step takes ``invocations_per_step`` stored calls in a seeded order that depends only on
(seed, step), rebuilds them for the student (aligned: its own state) and for the teacher (the chosen
context), packs both into rows, runs the teacher without gradient and the student with gradient on packed
rows, and minimises ``kd_weight * divergence + rl_weight * clipped policy gradient``. Metrics go to
``train_steps`` after every step; checkpoints are model folders registered in ``checkpoints``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentmem.records import Checkpoint, InvocationKind, Run, RunKind, TeacherContext, TrainStep
from agentmem.replay import Sequence, pack
from agentmem.training.advantages import group_advantages
from agentmem.training.checkpoints import load_trainer_state, save_checkpoint
from agentmem.training.objective import (
    Objective,
    StepInputs,
    StepResult,
    accumulate_step,
    teacher_action_logits,
)
from agentmem.training.selection import Selection, select, student_sequences, teacher_sequences
from agentmem.training.topk import shard_locations, teacher_logits_from_shards
from agentmem.training.vocab import check_same_vocab, vocab_size
from store import repository as repo
from store.engine import Store


class DistillConfig(BaseModel):
    """One distill job. ``weighting`` says how action tokens are averaged: ``token`` (every action token
    of the step equal), ``call`` (every invocation equal) or ``episode`` (every episode equal)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_ids: list[str] = Field(min_length=1)
    student: str = "default"
    teacher: str | None = "default"
    # "model": run the teacher online on packed rows; "shards": read its top-K log-probs written by
    # `agentmem score --topk` for this teacher and context (the teacher is not loaded).
    teacher_source: Literal["model", "shards"] = "model"
    context: TeacherContext = TeacherContext.aligned
    loss: Literal["reverse_kl", "forward_kl", "jsd"] = "reverse_kl"
    beta: float = Field(0.5, ge=0, le=1)
    rl: Literal["grpo", "none"] = "grpo"
    kd_weight: float = Field(1.0, ge=0)
    rl_weight: float = Field(1.0, ge=0)
    normalize_std: bool = False
    clip_eps: float = Field(0.2, ge=0)
    weighting: Literal["token", "call", "episode"] = "token"
    steps: int = Field(10, ge=1)
    invocations_per_step: int = Field(8, ge=1)
    row_tokens: int = Field(4096, ge=16)
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    out: str = "checkpoints"
    save_every: int | None = Field(None, ge=1)
    kinds: list[InvocationKind] | None = None
    path: Literal["fast", "reference"] = "fast"
    truncate: Literal["error", "left"] = "error"

    def objective(self) -> Objective:
        return Objective(kind=self.loss, beta=self.beta, kd_weight=self.kd_weight if self.teacher else 0.0,
                         rl_weight=self.rl_weight if self.rl == "grpo" else 0.0, clip_eps=self.clip_eps,
                         weighting=self.weighting)


@dataclass(frozen=True)
class Models:
    student: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    student_checkpoint: Checkpoint  # the version the student starts from (parent of the first save)
    teacher: PreTrainedModel | None = None
    teacher_tokenizer: PreTrainedTokenizerBase | None = None
    teacher_name: str | None = None  # the teacher's resolved path, as `agentmem score` stores it


@dataclass(frozen=True)
class DistillResult:
    run_id: str
    steps_done: int
    last_checkpoint: Checkpoint | None
    history: list[TrainStep]


def step_indices(n: int, per_step: int, seed: int, step: int) -> np.ndarray:
    """The selection indices of step ``step`` (0-based): epochs of a seeded permutation, a function of
    (n, per_step, seed, step) only, so a resumed run draws exactly what an uninterrupted one would."""
    per_epoch = max(1, -(-n // per_step))
    epoch, pos = divmod(step, per_epoch)
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return np.sort(perm[pos * per_step : (pos + 1) * per_step])


def advantages(selection: Selection, normalize_std: bool) -> dict[str, float]:
    """Per-invocation advantage: its episode's final reward (F1; failed or unscored = 0) minus the mean of
    the episodes sampled for the same task in the same run."""
    eps = list(selection.episodes.values())
    adv = group_advantages([e.reward or 0.0 for e in eps], [(e.run_id, e.task_id) for e in eps], normalize_std)
    by_episode = {e.id: float(a) for e, a in zip(eps, adv, strict=True)}
    return {i.id: by_episode[i.episode_id] for i in selection.invocations}


class Trainer:
    def __init__(self, store: Store, config: DistillConfig, models: Models, run_id: str):
        self.store, self.config, self.models, self.run_id = store, config, models, run_id
        self.vocab = vocab_size(models.student, models.tokenizer)
        if models.teacher is not None:
            check_same_vocab(models.teacher_tokenizer, models.tokenizer)
            vocab_size(models.teacher, models.teacher_tokenizer)
        self.selection = select(store, config.run_ids, kinds=config.kinds)
        self.student_seqs = student_sequences(self.selection)
        self.teacher_seqs = (teacher_sequences(self.selection, config.context, models.teacher_tokenizer)
                             if models.teacher is not None else None)
        self.advantage_of = advantages(self.selection, config.normalize_std)
        self.temperature_of = {i.id: (i.temperature if i.temperature > 0 else 1.0) for i in self.selection.invocations}
        self.episode_of = {i.id: i.episode_id for i in self.selection.invocations}
        self.pad = models.tokenizer.pad_token_id or 0
        self.shards = None
        if config.teacher and config.teacher_source == "shards":
            self.shards = shard_locations(store, self.selection.ids, models.teacher_name or config.teacher,
                                          config.context)
        self.optimizer = torch.optim.AdamW([p for p in models.student.parameters() if p.requires_grad],
                                           lr=config.lr, weight_decay=config.weight_decay)

    def _pack(self, seqs: list[Sequence]):
        rows, stats = pack(seqs, self.config.row_tokens, truncate=self.config.truncate)
        return rows, stats

    def step(self, step: int) -> TrainStep:
        t0 = time.perf_counter()
        idx = step_indices(len(self.student_seqs), self.config.invocations_per_step, self.config.seed, step)
        student_rows, stats = self._pack([self.student_seqs[i] for i in idx])
        teacher_logits = None
        if self.shards is not None and self.config.objective().kd_weight:
            teacher_logits = teacher_logits_from_shards(
                self.shards, [self.student_seqs[i].invocation_id for i in idx], self.vocab)
        elif self.teacher_seqs is not None and self.config.objective().kd_weight:
            teacher_rows, _ = self._pack([self.teacher_seqs[i] for i in idx])
            teacher_logits = teacher_action_logits(self.models.teacher, teacher_rows, self.vocab, self.pad,
                                                   self.config.path)
        inputs = StepInputs(self.episode_of, self.advantage_of, self.temperature_of, teacher_logits)
        model = self.models.student
        model.train()
        self.optimizer.zero_grad(set_to_none=True)
        result: StepResult = accumulate_step(model, student_rows, inputs, self.config.objective(), self.vocab,
                                             self.pad, self.config.path)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        return TrainStep(
            run_id=self.run_id, step=step + 1, loss=result.loss, kd_loss=result.kd_loss, rl_loss=result.rl_loss,
            tokens=result.tokens, lr=self.config.lr, seconds=time.perf_counter() - t0,
            metrics={**result.metrics, "grad_norm": float(grad_norm), "actions": float(result.actions),
                     "fill": stats.fill, "rows": float(stats.rows)},
        )

    def save(self, steps_done: int, parent: Checkpoint) -> Checkpoint:
        folder = Path(self.config.out).expanduser().resolve() / self.run_id / f"step-{steps_done:06d}"
        save_checkpoint(folder, self.models.student, self.models.tokenizer, self.optimizer, steps_done)
        ckpt = Checkpoint(run_id=self.run_id, parent_id=parent.id, step=steps_done, path=str(folder),
                          base_model=parent.base_model)
        with self.store.session() as s:
            repo.insert_checkpoint(s, ckpt)
            s.commit()
        return ckpt


def start_distill_run(store: Store, config: DistillConfig) -> Run:
    run = Run(kind=RunKind.distill, config=config.model_dump(mode="json"))
    with store.session() as s:
        repo.insert_run(s, run)
        s.commit()
    return run


def load_distill_run(store: Store, run_id: str) -> tuple[str, DistillConfig, Checkpoint | None]:
    """(full run id, stored config, latest checkpoint or None) of a distill run."""
    with store.session() as s:
        run = repo.get_run(s, run_id)
        if run.kind is not RunKind.distill:
            raise ValueError(f"run {run.id} is a {run.kind.value} run, not a distill run")
        ckpts = repo.list_checkpoints(s, run.id)
    return run.id, DistillConfig.model_validate(run.config), (ckpts[-1] if ckpts else None)


def run_distill(
    store: Store,
    config: DistillConfig,
    models: Models,
    *,
    run_id: str | None = None,
    resume_from: Checkpoint | None = None,
    on_step: Callable[[TrainStep], None] | None = None,
) -> DistillResult:
    """Train for ``config.steps`` steps (continuing after ``resume_from``'s step when given, whose weights
    ``models.student`` must already hold)."""
    rid = run_id or start_distill_run(store, config).id
    trainer = Trainer(store, config, models, rid)
    done, parent, last = 0, models.student_checkpoint, None
    if resume_from is not None:
        done = load_trainer_state(Path(resume_from.path), trainer.optimizer)
        parent = last = resume_from
    history = []
    for step in range(done, config.steps):
        record = trainer.step(step)
        with store.session() as s:
            repo.insert_train_step(s, record)
            s.commit()
        history.append(record)
        if on_step:
            on_step(record)
        steps_done = step + 1
        if steps_done == config.steps or (config.save_every and steps_done % config.save_every == 0):
            last = parent = trainer.save(steps_done, parent)
    with store.session() as s:
        repo.finish_run(s, rid)
        s.commit()
    return DistillResult(rid, config.steps, last, history)


def load_models(store: Store, config: DistillConfig, resume_from: Checkpoint | None = None) -> Models:
    """Student (fp32, trainable; from ``resume_from`` when resuming) and frozen teacher, from the config's
    references (checkpoint ids, folders, 'default' or hub names)."""
    from agentmem.agent.models import resolve_model_ref
    from agentmem.agent.rollout import register_policy
    from agentmem.policy.models import load_model

    path, base = resolve_model_ref(store, config.student)
    start = register_policy(store, path, base)
    student, tokenizer = load_model(resume_from.path if resume_from else path, dtype="float32")
    student.requires_grad_(True)
    teacher = teacher_tok = tpath = None
    if config.teacher:
        tpath, _ = resolve_model_ref(store, config.teacher)
        if config.teacher_source == "model":
            teacher, teacher_tok = load_model(tpath, dtype="float32")
            teacher.requires_grad_(False)
    return Models(student, tokenizer, start, teacher, teacher_tok, tpath)

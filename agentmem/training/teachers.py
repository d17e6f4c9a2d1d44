"""Teacher sources: where a distillation step's teacher targets come from.

A ``TeacherSource`` gives, for the invocations of a step, one target per invocation aligned with that
invocation's action tokens, plus how many teacher contexts it cut to fit:

- ``OnlineTeacher``: a model run without gradient on the selection rebuilt under a named teacher context
  (``aligned``, ``persistent``, ``persistent_chat``, ``privileged``), packed into rows; full-vocabulary
  logits ``[O, V]``;
- ``ShardTeacher``: the top-K log-probs that ``agentmem score --topk`` wrote to safetensors shards, the
  remaining mass spread evenly (``topk.dense_logprobs``); full-vocabulary ``[O, V]``;
- ``StoredScoresTeacher``: the per-token teacher log-probs stored in ``teacher_scores``, i.e. only
  ``log p_t(a)`` of each sampled token ``[O]``; the distillation term then uses the sampled-token
  reverse-KL estimator (``losses.sampled_reverse_kl_loss``): value ``sum w (log p_s(a) - log p_t(a))``,
  gradient ``sum w stopgrad(log p_s(a) - log p_t(a)) grad log p_s(a)``, the on-policy estimate of
  ``grad KL(student || teacher)``. Only reverse KL can be estimated this way.

Temperature: full-vocabulary targets are returned as logits at T = 1 equivalents (the distillation term
divides by ``DistillConfig.loss.temperature``): shards scored at ``T_s`` hold ``log softmax(z / T_s)``, and
``T_s * log p`` equals ``z`` up to a per-row constant, which no softmax sees. Sampled-token log-probs
cannot be re-tempered, so ``StoredScoresTeacher`` requires scores taken at the distillation temperature.

Teacher contexts may be cut from the left to fit the row budget only when asked
(``TeacherTruncation.left``); the cuts are counted in the targets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentmem.config import (
    AttentionPath,
    DistillConfig,
    Packing,
    TeacherSourceKind,
    TeacherTruncation,
)
from agentmem.errors import TrainingError
from agentmem.records import TeacherContext
from agentmem.replay import OverBudget
from agentmem.replay import Sequence as Rebuilt
from agentmem.runtime import CPU, Runtime
from agentmem.training.forward import PackedModel, plan
from agentmem.training.selection import Selection, teacher_sequences
from agentmem.training.topk import dense_logprobs, read_topk
from store import repository as repo
from store.engine import Store


@dataclass(frozen=True)
class TeacherTargets:
    """Per-invocation teacher targets: ``[O, V]`` logits (``full_vocab``) or ``[O]`` sampled-token
    log-probs, the teacher contexts cut from the left to fit (calls and tokens), and the tokens the teacher read
    for them (``tokens``: an online teacher's forward pass; 0 where the targets were read from the store)."""

    full_vocab: bool
    values: dict[str, torch.Tensor]
    truncated_calls: int = 0
    truncated_tokens: int = 0
    tokens: int = 0


class TeacherSource(Protocol):
    """Gives the targets of a set of invocations; ``name`` is what ``teacher_scores`` rows store."""

    @property
    def name(self) -> str: ...  # read-only, so that frozen dataclasses satisfy the protocol

    def targets(self, invocation_ids: Sequence[str]) -> TeacherTargets: ...


@dataclass(frozen=True)
class OnlineTeacher:
    model: PackedModel
    name: str
    sequences: Mapping[str, Rebuilt]  # the selection rebuilt under the teacher context
    row_tokens: int
    truncation: TeacherTruncation = TeacherTruncation.error
    packing: Packing = Packing.segments

    @classmethod
    def for_selection(cls, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, name: str,
                      selection: Selection, context: TeacherContext, *, row_tokens: int,
                      truncation: TeacherTruncation = TeacherTruncation.error,
                      path: AttentionPath = AttentionPath.fast, runtime: Runtime = CPU,
                      packing: Packing = Packing.segments,
                      aligned_kinds: Sequence[str] | None = None, mixed_precision: bool = False) -> OnlineTeacher:
        """``aligned_kinds``: call kinds the teacher scores in the ``aligned`` context whatever ``context``
        is (a context effect measured on the other kinds alone). ``mixed_precision``: its decoder under
        bfloat16 autocast (``DistillConfig.mixed_precision``)."""
        seqs = teacher_sequences(selection, context, tokenizer, aligned_kinds=aligned_kinds or ())
        return cls(PackedModel.create(model, tokenizer, path, runtime, mixed_precision), name,
                   {s.invocation_id: s for s in seqs}, row_tokens, TeacherTruncation(truncation), Packing(packing))

    def targets(self, invocation_ids: Sequence[str]) -> TeacherTargets:
        over: OverBudget = "left" if self.truncation == TeacherTruncation.left else "error"
        batches = plan([self.sequences[i] for i in invocation_ids], self.row_tokens, 1, over, self.packing)
        return TeacherTargets(True, self.model.logits_by_invocation(batches.batches),
                              batches.stats.truncated_sequences, batches.stats.truncated_tokens, batches.stats.tokens)


@dataclass(frozen=True)
class ShardTeacher:
    name: str
    locations: Mapping[str, tuple[str, str, float]]  # invocation id -> (shard path, key, score temperature)
    vocab: int

    @classmethod
    def from_store(cls, store: Store, name: str, context: TeacherContext, invocation_ids: Sequence[str],
                   vocab: int) -> ShardTeacher:
        """Raises TrainingError naming the first invocation without a shard."""
        with store.session() as s:
            scores = repo.get_teacher_scores(s, list(invocation_ids), name, context)
        locations: dict[str, tuple[str, str, float]] = {}
        for inv_id in invocation_ids:
            score = scores.get(inv_id)
            if score is None or not score.topk_path or score.topk_key is None:
                raise TrainingError(f"invocation {inv_id} has no top-K shard for teacher {name!r} under context "
                                    f"{TeacherContext(context).value!r}: run `agentmem score --topk K` first")
            locations[inv_id] = (score.topk_path, score.topk_key, score.temperature)
        return cls(name, locations, vocab)

    def targets(self, invocation_ids: Sequence[str]) -> TeacherTargets:
        out = {}
        for inv_id in invocation_ids:
            path, key, temperature = self.locations[inv_id]
            logp = dense_logprobs(*read_topk(path, key), self.vocab)
            out[inv_id] = logp if temperature == 1.0 else logp * temperature
        return TeacherTargets(True, out)


@dataclass(frozen=True)
class StoredScoresTeacher:
    store: Store
    name: str
    context: TeacherContext
    temperature: float = 1.0

    def targets(self, invocation_ids: Sequence[str]) -> TeacherTargets:
        """Raises TrainingError naming an invocation without a stored score, or scored at another temperature."""
        with self.store.session() as s:
            scores = repo.get_teacher_scores(s, list(invocation_ids), self.name, self.context)
        out = {}
        for inv_id in invocation_ids:
            score = scores.get(inv_id)
            if score is None:
                raise TrainingError(f"invocation {inv_id} has no stored score for teacher {self.name!r} under "
                                    f"context {TeacherContext(self.context).value!r}: run `agentmem score` first")
            if score.temperature != self.temperature:
                raise TrainingError(f"invocation {inv_id}: its score for teacher {self.name!r} was taken at "
                                    f"temperature {score.temperature}, distillation uses {self.temperature}")
            out[inv_id] = torch.from_numpy(score.token_logprobs.copy())
        return TeacherTargets(False, out)


def teacher_source(config: DistillConfig, store: Store, selection: Selection, *,
                   model: PreTrainedModel | None, tokenizer: PreTrainedTokenizerBase | None, name: str | None,
                   vocab: int, runtime: Runtime = CPU) -> TeacherSource | None:
    """The source ``config.teacher.source`` names, or None when no term needs a teacher."""
    if not config.effective_kd_weight:
        return None
    name = name or config.teacher.model
    if name is None:
        raise TrainingError("a teacher term is on (kd_weight > 0) but no teacher is named: set teacher")
    if config.teacher.source == TeacherSourceKind.model:
        if model is None or tokenizer is None:
            raise TrainingError("teacher_source=model needs the teacher model and tokenizer loaded (Models.teacher)")
        return OnlineTeacher.for_selection(model, tokenizer, name, selection, config.teacher.context,
                                           row_tokens=config.batch.row_tokens, truncation=config.teacher.truncation,
                                           path=config.batch.path, runtime=runtime, packing=config.batch.packing,
                                           aligned_kinds=config.teacher.aligned_kinds,
                                           mixed_precision=config.mixed_precision)
    if config.teacher.aligned_kinds:
        raise TrainingError("aligned_kinds mixes two teacher contexts: it needs teacher_source=model")
    if config.teacher.source == TeacherSourceKind.shards:
        return ShardTeacher.from_store(store, name, config.teacher.context, selection.ids, vocab)
    return StoredScoresTeacher(store, name, config.teacher.context, config.loss.temperature)

"""Teacher scoring of stored invocations: the ``Scorer`` (the job around it is ``agentmem.jobs.score``).

For every selected invocation, rebuilt under the chosen teacher context and packed into rows, the
teacher's distribution over the full vocabulary is taken at the action positions only, and per action
token we store: the teacher's log-prob of the sampled token, the teacher's entropy and, when a student
model is given, the reverse KL(student || teacher). With ``topk > 0`` the teacher's top-K log-probs go to
a safetensors shard per batch, referenced from each score row. One ``teacher_scores`` row per
(invocation, teacher, context): already scored invocations are skipped, so the job resumes.

Temperature convention (the same as distillation's, see ``terms``): every stored quantity (log-probs,
entropy, reverse KL, top-K) is taken with both distributions at ``config.temperature`` (T, default 1),
``p = softmax(logits / T)``, and T is stored in ``TeacherScore.temperature``.

Teacher contexts over ``row_tokens`` are refused, or cut from the left with ``teacher_truncation=left``
(counted in the result). The student reads its own aligned state, packed on its own and never cut.
``config.packing`` lays out both sides' rows (``shared_prefix``: the G calls of a (run, task, step) group
share their common prompt prefix; the scores are the same).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentmem.config import ScoreConfig, TeacherTruncation
from agentmem.records import TeacherScore
from agentmem.replay import OverBudget, Sequence
from agentmem.runtime import CPU, Runtime
from agentmem.training.collate import PackedBatch
from agentmem.training.forward import PackedModel, RowBatches, plan, split_actions
from agentmem.training.losses import reverse_kl
from agentmem.training.vocab import check_same_vocab

__all__ = ["LoadedModel", "ScoreConfig", "ScoreProgress", "ScoreResult", "ScoredBatch", "Scorer"]


@dataclass(frozen=True)
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str  # what is stored as the teacher's name: its resolved path or hub name


@dataclass(frozen=True)
class ScoreProgress:
    invocations: int
    tokens: int
    seconds: float


@dataclass(frozen=True)
class ScoreResult:
    run_id: str
    scored: int
    skipped: int  # already scored before this job
    fill: float
    teacher_truncated_calls: int = 0
    teacher_truncated_tokens: int = 0
    not_chat: int = 0  # persistent_chat: calls left out, being no chat turns (replay.teacher_calls)


@dataclass(frozen=True)
class ScoredBatch:
    """The score rows of one forward pass, with its real tokens and seconds."""

    scores: list[TeacherScore]
    tokens: int
    seconds: float


class Scorer:
    """Scores rebuilt invocations with a teacher (and optionally a student) on ``runtime.device``; the
    models must already be there. ``plan`` packs, ``score`` runs the batches and yields score rows."""

    def __init__(self, config: ScoreConfig, teacher: LoadedModel, student: LoadedModel | None = None,
                 runtime: Runtime = CPU):
        self.config, self.teacher_name = config, teacher.name
        self.teacher = PackedModel.create(teacher.model, teacher.tokenizer, config.path, runtime)
        self.student = None
        if student is not None:
            check_same_vocab(teacher.tokenizer, student.tokenizer)
            self.student = PackedModel.create(student.model, student.tokenizer, config.path, runtime)

    def plan(self, sequences: list[Sequence]) -> RowBatches:
        over: OverBudget = "left" if self.config.teacher_truncation == TeacherTruncation.left else "error"
        return plan(sequences, self.config.row_tokens, self.config.rows_per_batch, over, self.config.packing)

    def score(self, batches: RowBatches, student_seqs: dict[str, Sequence] | None, run_id: str
              ) -> Iterator[ScoredBatch]:
        """``student_seqs``: the aligned rebuilds of the planned invocations (needed with a student)."""
        temperature = self.config.temperature
        for index, rows in enumerate(batches.batches):
            t0 = time.perf_counter()
            batch = self.teacher.collate(rows)
            with torch.inference_mode():
                t_logits = self.teacher.action_logits(batch)
                s_logits = self._student_logits(student_seqs, batch)
            t_logp = torch.log_softmax(t_logits / temperature, -1)
            token_lp = t_logp.gather(-1, batch.action_ids[:, None])[:, 0]
            entropy = -(t_logp.exp() * t_logp).sum(-1)
            kl = reverse_kl(s_logits, t_logits, temperature) if s_logits is not None else None
            shard = _write_topk(self.config, run_id, index, batch, t_logp) if self.config.topk else None
            kls = dict(split_actions(batch, kl.cpu())) if kl is not None else {}
            scores = [
                TeacherScore(
                    run_id=run_id, invocation_id=inv_id, teacher=self.teacher_name, context=self.config.context,
                    token_logprobs=lp.numpy(), entropy=ent.numpy(),
                    reverse_kl=kls[inv_id].numpy() if kls else [],
                    topk_path=shard, topk_key=inv_id if shard else None, temperature=temperature,
                )
                for (inv_id, lp), (_, ent) in zip(split_actions(batch, token_lp.cpu()),
                                                  split_actions(batch, entropy.cpu()), strict=True)
            ]
            yield ScoredBatch(scores, batch.num_tokens, time.perf_counter() - t0)

    def _student_logits(self, student_seqs: dict[str, Sequence] | None, teacher_batch: PackedBatch
                        ) -> torch.Tensor | None:
        """The student's logits at the same actions, in the teacher batch's order. The student reads its own
        (aligned) state, packed on its own (never cut): its rows differ from the teacher's in other contexts."""
        if self.student is None or student_seqs is None:
            return None
        seqs = [student_seqs[i] for i in teacher_batch.invocation_ids]
        rows = plan(seqs, max(self.config.row_tokens, max(len(s) for s in seqs)),
                    packing=self.config.packing).batches
        parts = self.student.logits_by_invocation(rows)
        return torch.cat([parts[i] for i in teacher_batch.invocation_ids])


def _write_topk(config: ScoreConfig, run_id: str, index: int, batch, t_logp: torch.Tensor) -> str:
    k = min(config.topk, t_logp.shape[-1])
    values, indices = t_logp.cpu().topk(k, dim=-1)
    tensors = {}
    for inv_id, part in split_actions(batch, torch.arange(values.shape[0])):
        tensors[f"{inv_id}.logprobs"] = values[part].contiguous()
        tensors[f"{inv_id}.indices"] = indices[part].to(torch.int32).contiguous()
    folder = Path(config.topk_dir).expanduser().resolve() / run_id
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"shard-{index:05d}.safetensors"
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"k": str(k), "context": config.context.value,
                                           "temperature": str(config.temperature)})
    os.replace(tmp, path)  # a killed job never leaves a half shard behind a stored score row
    return str(path)

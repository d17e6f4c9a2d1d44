"""Teacher scoring of stored invocations (``agentmem score``).

For every selected invocation, rebuilt under the chosen teacher context and packed into rows, the
teacher's distribution over the full vocabulary is taken at the action positions only, and per action
token we store: the teacher's log-prob of the sampled token, the teacher's entropy and, when a student
model is given, the reverse KL from the student's sampling distribution (its logits at the invocation's
sampling temperature) to the teacher. With ``topk > 0`` the teacher's top-K log-probs go to a
safetensors shard per batch, referenced from each score row. One ``teacher_scores`` row per
(invocation, teacher, context): already scored invocations are skipped, so the job resumes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentmem.records import InvocationKind, Run, RunKind, TeacherContext, TeacherScore
from agentmem.training.forward import collate, invocation_action_logits, row_batches, split_actions
from agentmem.training.losses import reverse_kl
from agentmem.training.selection import Selection, select, student_sequences, teacher_sequences
from agentmem.training.vocab import check_same_vocab, vocab_size
from store import repository as repo
from store.engine import Store


class ScoreConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    run_ids: list[str] = Field(min_length=1)
    teacher: str = "default"
    student: str | None = None
    context: TeacherContext = TeacherContext.aligned
    kinds: list[InvocationKind] | None = None
    row_tokens: int = Field(4096, ge=16)
    rows_per_batch: int = Field(1, ge=1)
    topk: int = Field(0, ge=0)
    topk_dir: str = "agentmem_topk"
    path: Literal["fast", "reference"] = "fast"
    truncate: Literal["error", "left"] = "error"


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
    skipped: int
    fill: float
    truncated_sequences: int


def _temperature(t: float) -> float:
    return t if t > 0 else 1.0  # greedy calls: the student's distribution at T = 1


def run_score(
    store: Store,
    config: ScoreConfig,
    teacher: LoadedModel,
    student: LoadedModel | None = None,
    *,
    on_start: Callable[[int, int], None] | None = None,
    on_batch: Callable[[ScoreProgress], None] | None = None,
) -> ScoreResult:
    vocab = vocab_size(teacher.model, teacher.tokenizer)
    if student is not None:
        check_same_vocab(teacher.tokenizer, student.tokenizer)
    selection = select(store, config.run_ids, kinds=config.kinds)
    with store.session() as s:
        done = repo.scored_invocation_ids(s, teacher.name, config.context)
    sequences = teacher_sequences(selection, config.context, teacher.tokenizer)
    todo = [seq for seq in sequences if seq.invocation_id not in done]
    skipped = len(sequences) - len(todo)
    temperature = {i.id: _temperature(i.temperature) for i in selection.invocations}
    run = Run(kind=RunKind.score, config=config.model_dump(mode="json") | {"teacher_name": teacher.name})
    with store.session() as s:
        repo.insert_run(s, run)
        s.commit()
    if on_start:
        on_start(len(sequences), skipped)
    if not todo:
        _finish(store, run.id)
        return ScoreResult(run.id, 0, skipped, 0.0, 0)
    plan = row_batches(todo, config.row_tokens, config.rows_per_batch, config.truncate)
    student_rows = _student_rows(selection, student, config, {s.invocation_id for s in todo})
    pad = teacher.tokenizer.pad_token_id or 0
    scored = 0
    for index, rows in enumerate(plan.batches):
        t0 = time.perf_counter()
        batch = collate(rows, pad, teacher.model.device)
        with torch.inference_mode():
            t_logits = invocation_action_logits(teacher.model, batch, vocab, config.path).float()
            s_logits = _student_logits(student, student_rows, batch, vocab, config, temperature)
        t_logp = torch.log_softmax(t_logits, -1)
        token_lp = t_logp.gather(-1, batch.action_ids[:, None])[:, 0]
        entropy = -(t_logp.exp() * t_logp).sum(-1)
        kl = reverse_kl(s_logits, t_logits) if s_logits is not None else None
        shard = _write_topk(config, run.id, index, batch, t_logp) if config.topk else None
        kls = dict(split_actions(batch, kl)) if kl is not None else {}
        scores = [
            TeacherScore(
                run_id=run.id, invocation_id=inv_id, teacher=teacher.name, context=config.context,
                token_logprobs=lp.numpy(), entropy=ent.numpy(),
                reverse_kl=kls[inv_id].numpy() if kls else [],
                topk_path=shard, topk_key=inv_id if shard else None,
            )
            for (inv_id, lp), (_, ent) in zip(split_actions(batch, token_lp), split_actions(batch, entropy),
                                              strict=True)
        ]
        with store.session() as s:
            repo.insert_teacher_scores(s, scores)
            s.commit()
        scored += len(scores)
        if on_batch:
            on_batch(ScoreProgress(len(scores), batch.num_tokens, time.perf_counter() - t0))
    _finish(store, run.id)
    return ScoreResult(run.id, scored, skipped, plan.stats.fill, plan.stats.truncated_sequences)


def _finish(store: Store, run_id: str) -> None:
    with store.session() as s:
        repo.finish_run(s, run_id)
        s.commit()


def _student_rows(selection: Selection, student: LoadedModel | None, config: ScoreConfig, todo: set[str]):
    if student is None:
        return None
    return {s.invocation_id: s for s in student_sequences(selection) if s.invocation_id in todo}


def _student_logits(student: LoadedModel | None, student_rows, teacher_batch, vocab: int, config: ScoreConfig,
                    temperature: dict[str, float]) -> torch.Tensor | None:
    """The student's tempered logits at the same actions, in the teacher batch's order. The student reads
    its own (aligned) state, packed on its own: its rows differ from the teacher's under other contexts."""
    if student is None:
        return None
    seqs = [student_rows[i] for i in teacher_batch.invocation_ids]
    plan = row_batches(seqs, max(config.row_tokens, max(len(s) for s in seqs)), 1, "error")
    parts: dict[str, torch.Tensor] = {}
    pad = student.tokenizer.pad_token_id or 0
    for rows in plan.batches:
        batch = collate(rows, pad, student.model.device)
        logits = invocation_action_logits(student.model, batch, vocab, config.path).float()
        for inv_id, part in split_actions(batch, logits):
            parts[inv_id] = part / temperature[inv_id]
    return torch.cat([parts[i] for i in teacher_batch.invocation_ids])


def _write_topk(config: ScoreConfig, run_id: str, index: int, batch, t_logp: torch.Tensor) -> str:
    k = min(config.topk, t_logp.shape[-1])
    values, indices = t_logp.topk(k, dim=-1)
    tensors = {}
    for inv_id, part in split_actions(batch, torch.arange(values.shape[0])):
        tensors[f"{inv_id}.logprobs"] = values[part].contiguous()
        tensors[f"{inv_id}.indices"] = indices[part].to(torch.int32).contiguous()
    folder = Path(config.topk_dir).expanduser().resolve() / run_id
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"shard-{index:05d}.safetensors"
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"k": str(k), "context": config.context.value})
    os.replace(tmp, path)  # a killed job never leaves a half shard behind a stored score row
    return str(path)

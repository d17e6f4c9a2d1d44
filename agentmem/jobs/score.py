"""The score job (``agentmem score``): the teacher's judgement of stored calls, written batch by batch.

Order of work: the run ids and model references are checked before any weights load; one ``score`` run
records the job; already scored (invocation, teacher, context) rows are skipped, so a killed job resumes
by running it again. Teacher contexts over the row budget are refused or cut from the left and counted
(``ScoreResult.teacher_truncated_calls``); the student side is never cut.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from agentmem import model_refs
from agentmem.agent.registry import check_kinds
from agentmem.config import ScoreConfig
from agentmem.errors import AgentmemError, ConfigError, TrainingError
from agentmem.jobs.runs import check_runs, tracked_run
from agentmem.records import RunKind
from agentmem.runtime import CPU, Runtime
from store import repository as repo
from store.engine import Store

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # torch loads inside the job, after its ids and flags are checked (a fast error)
    from agentmem.training.scoring import LoadedModel, ScoreProgress, ScoreResult


def load(store: Store, ref: str, config: ScoreConfig, runtime: Runtime) -> LoadedModel:
    from agentmem.training.scoring import LoadedModel

    resolved = model_refs.resolve(store, ref)
    model, tokenizer = model_refs.load(resolved.path, config.dtype, runtime)
    return LoadedModel(model, tokenizer, resolved.path)


def check_run_vocab(store: Store, run_ids: list[str], tokenizer, who: str) -> None:
    """Refuse (before any weights load) a ``who`` model whose vocabulary is not that of the model named in
    each run's config: its scores of the stored token ids would be meaningless. A run whose model cannot be
    resolved any more (a deleted folder) is not checked."""
    from agentmem.training.vocab import check_same_vocab

    with store.session() as s:
        runs = [repo.get_run(s, rid) for rid in run_ids]
    for run in runs:
        ref = run.config.get("model") if isinstance(run.config, dict) else None
        if not isinstance(ref, str):
            continue
        try:
            sampler_path = model_refs.resolve(store, ref).path
            sampler = model_refs.load_tokenizer(sampler_path)
        except AgentmemError:
            continue
        try:
            check_same_vocab(tokenizer, sampler)
        except TrainingError as err:
            raise ConfigError(f"run {run.id[:12]} was sampled by {sampler_path}, whose vocabulary differs from "
                              f"the {who}'s: {err}") from None


def run_score(
    store: Store,
    config: ScoreConfig,
    runtime: Runtime = CPU,
    *,
    teacher: LoadedModel | None = None,
    student: LoadedModel | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_batch: Callable[[ScoreProgress], None] | None = None,
) -> ScoreResult:
    """Score every selected invocation not yet scored by this teacher under this context. ``teacher`` and
    ``student`` inject loaded models (tests); otherwise ``config.teacher`` / ``config.student`` load."""
    config = config.model_copy(update={"run_ids": check_runs(store, config.run_ids)})
    check_kinds(config.kinds)
    with store.session() as s:  # rows it could not read: one line naming them, before its run opens
        repo.check_stored_rows(s, config.run_ids)
    from agentmem.training.privileged_file import read_privileged, with_privileged
    from agentmem.training.scoring import ScoreProgress, Scorer, ScoreResult
    from agentmem.training.selection import select, student_sequences, teacher_selection, teacher_sequences

    privileged = read_privileged(config.privileged_file) if config.privileged_file else None
    if teacher is None:
        teacher_path = model_refs.resolve(store, config.teacher).path
        check_run_vocab(store, config.run_ids, model_refs.load_tokenizer(teacher_path), "teacher")
        if config.student:
            model_refs.resolve(store, config.student)
    else:
        teacher_path = teacher.name
    with tracked_run(store, RunKind.score, config, extra={"teacher_name": teacher_path}) as run:
        teacher = teacher or load(store, config.teacher, config, runtime)
        if student is None and config.student:
            student = load(store, config.student, config, runtime)
        scorer = Scorer(config, teacher, student, runtime)
        selection = select(store, config.run_ids, kinds=config.kinds)
        if privileged is not None:
            selection = with_privileged(selection, privileged)
        selection, not_chat = teacher_selection(selection, config.context, teacher.tokenizer)
        if not_chat:  # persistent_chat: completions calls have no place in a chat
            log.warning("persistent_chat: %d call(s) that are no chat turns (completions) are not scored", not_chat)
        with store.session() as s:
            done = repo.scored_invocation_ids(s, teacher.name, config.context)
        sequences = teacher_sequences(selection, config.context, teacher.tokenizer)
        todo = [seq for seq in sequences if seq.invocation_id not in done]
        skipped = len(sequences) - len(todo)
        if on_start:
            on_start(len(sequences), skipped)
        if not todo:
            return ScoreResult(run.id, 0, skipped, 0.0, not_chat=not_chat)
        batches = scorer.plan(todo)
        wanted = {s.invocation_id for s in todo}
        student_seqs = ({s.invocation_id: s for s in student_sequences(selection) if s.invocation_id in wanted}
                        if student is not None else None)
        scored = 0
        for part in scorer.score(batches, student_seqs, run.id):
            with store.session() as s:
                repo.insert_teacher_scores(s, part.scores)
                s.commit()
            run.beat()
            scored += len(part.scores)
            if on_batch:
                on_batch(ScoreProgress(len(part.scores), part.tokens, part.seconds))
    return ScoreResult(run.id, scored, skipped, batches.stats.fill, batches.stats.truncated_sequences,
                       batches.stats.truncated_tokens, not_chat)

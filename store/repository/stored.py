"""What a job checks of the rows it is about to read, before it opens its own run: every row of the runs reads in
this version (known enum values, whole id and log-prob arrays) and every outcome is one the store takes now (a
finite reward, F1-like scores in [0, 1]). Rows written by an older or newer schema, or by hand (``agentmem sql
--write``), or before the store checked its bounds (``store.bounds``), are named here, one line each: the run, the
row, the column and its value, and what to do."""

from __future__ import annotations

import math
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentmem.records import EpisodeStatus, FinishReason, SamplingContext
from store.bounds import UNIT_METRICS
from store.errors import StoredRowError
from store.orm import EpisodeRow, InvocationRow

FIX = "fix the row (agentmem sql --write) or leave its run out"


def check_stored_rows(session: Session, run_ids: Sequence[str]) -> None:
    """Raise ``StoredRowError`` naming the first row of ``run_ids`` that a job could not read or train on."""
    runs = list(run_ids)
    episodes = session.execute(sa.select(EpisodeRow.run_id, EpisodeRow.id, EpisodeRow.status, EpisodeRow.reward,
                                         *[getattr(EpisodeRow, m) for m in UNIT_METRICS])
                               .where(EpisodeRow.run_id.in_(runs)).order_by(EpisodeRow.run_id, EpisodeRow.id))
    statuses = {s.value for s in EpisodeStatus}
    for run_id, ep_id, status, reward, *scores in episodes:
        where = f"run {run_id}: episode {ep_id}"
        if status not in statuses:
            raise StoredRowError(f"{where} has status {status!r}, which this version does not read (a row of "
                                 f"another schema?): {FIX}")
        if reward is not None and not math.isfinite(reward):
            raise StoredRowError(f"{where} has reward {reward}, not a finite number: {FIX}")
        for name, value in zip(UNIT_METRICS, scores, strict=True):
            if value is not None and not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise StoredRowError(f"{where} has {name} {value}, outside [0, 1]: {FIX}")
    _check_invocations(session, runs)


def _check_invocations(session: Session, runs: list[str]) -> None:
    enums = {InvocationRow.finish_reason: [r.value for r in FinishReason],
             InvocationRow.sampled_context: [c.value for c in SamplingContext]}
    arrays = (InvocationRow.prompt_ids, InvocationRow.output_ids, InvocationRow.output_logprobs,
              InvocationRow.privileged_ids)
    odd = [sa.func.length(column) % 4 != 0 for column in arrays]
    unknown = [column.not_in(values) for column, values in enums.items()]
    unequal = sa.and_(InvocationRow.output_logprobs.is_not(None),
                      sa.func.length(InvocationRow.output_logprobs) != sa.func.length(InvocationRow.output_ids))
    row = session.execute(
        sa.select(EpisodeRow.run_id, InvocationRow.id, InvocationRow.finish_reason, InvocationRow.sampled_context,
                  *[sa.func.length(column) for column in arrays])
        .join(EpisodeRow, EpisodeRow.id == InvocationRow.episode_id)
        .where(EpisodeRow.run_id.in_(runs), sa.or_(*odd, *unknown, unequal))
        .order_by(EpisodeRow.run_id, InvocationRow.id).limit(1)).first()
    if row is None:
        return
    run_id, inv_id, finish, context, *sizes = row
    where = f"run {run_id}: invocation {inv_id}"
    for column, value in (("finish_reason", finish), ("sampled_context", context)):
        if value not in enums[getattr(InvocationRow, column)]:
            raise StoredRowError(f"{where} has {column} {value!r}, which this version does not read (a row of "
                                 f"another schema?): {FIX}")
    for column, size in zip(arrays, sizes, strict=True):
        if size is not None and size % 4:
            raise StoredRowError(f"{where}: {column.key} holds {size} bytes, not whole 4-byte values: {FIX}")
    raise StoredRowError(f"{where}: output_logprobs ({sizes[2] // 4}) and output_ids ({sizes[1] // 4}) differ in "
                         f"length: {FIX}")

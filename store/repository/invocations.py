"""Invocations: one model call each. Token ids and log-probs are binary array columns
(``store.arrays``); reading streams them in (episode id, step) order, without validation (the replay
hot path)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentmem.records import FinishReason, Invocation, InvocationKind, SamplingContext
from store import arrays
from store.orm import EpisodeRow, InvocationRow
from store.repository.rows import check_row, insert_ignore, text_column


def _kind_value(kind: InvocationKind | str) -> str:
    """Kinds are stored as plain strings (``InvocationKind`` members by their value)."""
    return kind.value if isinstance(kind, InvocationKind) else str(kind)


def _invocation_row(inv: Invocation) -> dict[str, Any]:
    return check_row("invocations", {
        "id": inv.id, "episode_id": inv.episode_id, "step": inv.step, "kind": _kind_value(inv.kind),
        "memory_policy": inv.memory_policy, "policy_version": inv.policy_version,
        "prompt_ids": arrays.encode(inv.prompt_ids, arrays.IDS),
        "output_ids": arrays.encode(inv.output_ids, arrays.IDS),
        "output_logprobs": None if inv.output_logprobs is None else arrays.encode(inv.output_logprobs, arrays.FLOATS),
        "role": inv.role, "prompt_text": text_column(inv.prompt_text), "output_text": text_column(inv.output_text),
        "memory_before": text_column(inv.memory_before), "memory_after": text_column(inv.memory_after),
        "chunk_text": text_column(inv.chunk_text), "chunk_index": inv.chunk_index,
        "prompt_tokens": inv.prompt_tokens, "output_tokens": inv.output_tokens,
        "finish_reason": inv.finish_reason.value, "temperature": inv.temperature, "latency_s": inv.latency_s,
        "created_at": inv.created_at, "sampled_context": SamplingContext(inv.sampled_context).value,
        "privileged_ids": None if inv.privileged_ids is None else arrays.encode(inv.privileged_ids, arrays.IDS),
        "parent_invocation_id": inv.parent_invocation_id,
    }, f"invocation {inv.id}: ")


def insert_invocations(session: Session, invocations: Iterable[Invocation]) -> None:
    """Insert invocations (an id already stored is left as it is); a value outside the store's bounds
    (``store.bounds``) raises ``ValueOutOfBounds`` before any is written."""
    insert_ignore(session, InvocationRow.__table__, [_invocation_row(i) for i in invocations])


_INV_COLUMNS = [c for c in InvocationRow.__table__.c if c.name not in ("prompt_tokens", "output_tokens")]
# every field is set; shared by every streamed row, so frozen (pydantic only reads it, or copies it on update)
_INV_FIELDS = cast("set[str]", frozenset(Invocation.model_fields))


def _invocation(row: sa.Row) -> Invocation:
    # Values come from our own typed columns, so validation is skipped (this is the replay hot path).
    m = row._mapping
    return Invocation.model_construct(
        id=m["id"], episode_id=m["episode_id"], step=m["step"], kind=m["kind"], memory_policy=m["memory_policy"],
        policy_version=m["policy_version"],
        prompt_ids=arrays.decode(m["prompt_ids"], arrays.IDS),
        output_ids=arrays.decode(m["output_ids"], arrays.IDS),
        output_logprobs=None if m["output_logprobs"] is None else arrays.decode(m["output_logprobs"], arrays.FLOATS),
        role=m["role"], prompt_text=m["prompt_text"], output_text=m["output_text"], memory_before=m["memory_before"],
        memory_after=m["memory_after"], chunk_text=m["chunk_text"], chunk_index=m["chunk_index"],
        finish_reason=FinishReason(m["finish_reason"]), temperature=m["temperature"], latency_s=m["latency_s"],
        created_at=m["created_at"], sampled_context=SamplingContext(m["sampled_context"]),
        privileged_ids=None if m["privileged_ids"] is None else arrays.decode(m["privileged_ids"], arrays.IDS),
        parent_invocation_id=m["parent_invocation_id"], _fields_set=_INV_FIELDS,
    )


def stream_invocations(
    session: Session,
    *,
    run_ids: Sequence[str] | None = None,
    episode_ids: Sequence[str] | None = None,
    kinds: Sequence[InvocationKind | str] | None = None,
    policy_versions: Sequence[str] | None = None,
    batch_size: int = 500,
) -> Iterator[Invocation]:
    """Invocations matching every given filter, streamed in (episode id, step) order: a stable order in
    which each episode's calls are contiguous and in step order."""
    stmt = sa.select(*_INV_COLUMNS).order_by(InvocationRow.episode_id, InvocationRow.step)
    if run_ids is not None:
        stmt = stmt.join(EpisodeRow, EpisodeRow.id == InvocationRow.episode_id).where(EpisodeRow.run_id.in_(run_ids))
    if episode_ids is not None:
        stmt = stmt.where(InvocationRow.episode_id.in_(episode_ids))
    if kinds is not None:
        stmt = stmt.where(InvocationRow.kind.in_([_kind_value(k) for k in kinds]))
    if policy_versions is not None:
        stmt = stmt.where(InvocationRow.policy_version.in_(policy_versions))
    result = session.execute(stmt.execution_options(yield_per=batch_size))
    for row in result:
        yield _invocation(row)


def count_invocations(session: Session, run_ids: Sequence[str]) -> int:
    return session.scalar(
        sa.select(sa.func.count(InvocationRow.id))
        .join(EpisodeRow, EpisodeRow.id == InvocationRow.episode_id)
        .where(EpisodeRow.run_id.in_(run_ids))
    ) or 0


def episode_invocations(session: Session, episode_id: str) -> list[Invocation]:
    return list(stream_invocations(session, episode_ids=[episode_id]))

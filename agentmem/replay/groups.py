"""Which stored calls face the same decision: the groups of the teacher term's centring
(``DistillConfig.loss.teacher_centering``), a pure function of the calls as stored."""

from __future__ import annotations

from collections.abc import Iterable

from agentmem.config import TeacherCentering
from agentmem.records import Invocation, holds_nothing


def centering_groups(invocations: Iterable[Invocation], mode: TeacherCentering) -> dict[str, str]:
    """Each call's group: its kind (``first_token``), or its kind and whether its memory was empty
    (``first_token_memory``: ``memory_before`` blank or ``(empty)``, what the prompt shows for nothing held:
    ``memory_update/empty`` reads a chunk into nothing, ``memory_update/held`` rewrites what it holds)."""
    if mode is TeacherCentering.none:
        raise ValueError("teacher_centering=none has no groups")
    if mode is TeacherCentering.first_token_memory:
        return {i.id: f"{i.kind}/{'empty' if holds_nothing(i.memory_before) else 'held'}"
                for i in invocations}
    return {i.id: str(i.kind) for i in invocations}

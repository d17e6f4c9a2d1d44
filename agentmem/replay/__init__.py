"""Replay: rebuild stored invocations per teacher context and pack them into rows. Pure numpy, no torch."""

from agentmem.errors import ReplayError
from agentmem.replay.pack import OverBudget, PackingStats, Row, pack, shareable_prefix, truncate_left
from agentmem.replay.rebuild import (
    Sequence,
    rebuild,
    rebuild_aligned,
    rebuild_persistent,
    rebuild_persistent_chat,
    rebuild_privileged,
    teacher_calls,
)

__all__ = [
    "OverBudget",
    "PackingStats",
    "ReplayError",
    "Row",
    "Sequence",
    "pack",
    "rebuild",
    "rebuild_aligned",
    "rebuild_persistent",
    "rebuild_persistent_chat",
    "rebuild_privileged",
    "shareable_prefix",
    "teacher_calls",
    "truncate_left",
]

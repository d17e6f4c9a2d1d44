"""Typed errors of the replay layer; ``cli/`` turns them into one-line messages."""

from __future__ import annotations

from agentmem.errors import AgentmemError


class ReplayError(AgentmemError, ValueError):
    """Stored records cannot be rebuilt or packed as asked (bad order, length over budget, missing input)."""

"""Errors raised by the policy layer; the CLI turns them into one-line messages."""

from __future__ import annotations

from agentmem.errors import AgentmemError


class PolicyError(AgentmemError):
    """Base class for policy-layer errors."""


class ModelError(PolicyError, ValueError):
    """A model could not be found, prepared or loaded (the message is one line a person can act on)."""


class BackendError(PolicyError, RuntimeError):
    """A generation backend could not be built or used (e.g. an optional engine is not installed)."""

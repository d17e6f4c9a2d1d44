"""The error types of agentmem: one base, one subclass per area.

Library code raises these (never prints, never exits); ``cli/`` prints each as one ``error:`` line. Every
message names what is at fault: the file, record, field, flag or id. Any other exception reaching the CLI
is a bug and keeps its traceback.

Areas and where they live:
- ``ConfigError``: a job's configuration is invalid or inconsistent (this module);
- ``RunError``: a named run cannot be used as asked (wrong kind, nothing to resume) (this module);
- ``TrainingError``: a training or scoring step cannot proceed (vocabularies differ, calls without
  sampler log-probs, an empty step) (this module);
- ``ReplayError``: stored records cannot be rebuilt or packed as asked (this module);
- ``PolicyError`` / ``ModelError`` / ``BackendError``: a model or a generation backend (this module);
- ``AgentError``: a memory policy misbehaved (this module);
- ``StoreError`` (``store.errors``) and ``EnvError`` (``envs.errors``), beside their packages.

The value-like areas also subclass ``ValueError`` so callers that catch ``ValueError`` keep working.
"""

from __future__ import annotations


class AgentmemError(Exception):
    """Base class: something the user can act on went wrong. ``str(err)`` is one line naming the culprit."""


class ConfigError(AgentmemError, ValueError):
    """A job configuration is invalid: a flag, a field, or a combination of them."""


class RunError(AgentmemError, ValueError):
    """A run named by id cannot be used as asked (wrong kind, unknown, nothing left to resume)."""


class TrainingError(AgentmemError, ValueError):
    """A training or scoring job cannot go on with the data or models it was given."""


class AgentError(AgentmemError, ValueError):
    """A memory policy or the agent loop was driven into a state it cannot handle."""


class ReplayError(AgentmemError, ValueError):
    """Stored records cannot be rebuilt or packed as asked (bad order, length over budget, missing input)."""


class PolicyError(AgentmemError):
    """Base class for policy-layer errors."""


class ModelError(PolicyError, ValueError):
    """A model could not be found, prepared or loaded (the message is one line a person can act on)."""


class BackendError(PolicyError, RuntimeError):
    """A generation backend could not be built or used (e.g. an optional engine is not installed)."""

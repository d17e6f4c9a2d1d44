"""Small helpers shared by tests that drive jobs with injected models."""

from __future__ import annotations

from agentmem.models import ModelRef, register
from agentmem.policy.scripted import ScriptedBackend
from agentmem.records import Checkpoint


def register_policy(store, path: str, base_model: str) -> Checkpoint:
    """The checkpoint row of a model that samples (as a job registers it), without loading anything."""
    return register(store, ModelRef(base_model, path, base_model))


class KilledBackend(ScriptedBackend):
    """A scripted backend that dies (as a kill would: ``KeyboardInterrupt``) after ``left`` batched calls."""

    left = 0

    def generate(self, prompts, params):
        self.left -= 1
        if self.left < 0:
            raise KeyboardInterrupt
        return super().generate(prompts, params)

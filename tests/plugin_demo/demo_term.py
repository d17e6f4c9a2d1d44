"""An out-of-tree loss term: ``entropy_bonus``, minus the mean entropy of the student at the action tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentmem.training.terms import MicroBatch, TermValue


@dataclass(frozen=True)
class EntropyBonus:
    name: str = "entropy_bonus"
    needs_teacher: bool = False
    needs_reference: bool = False

    @classmethod
    def from_distill_config(cls, config) -> EntropyBonus:
        return cls()

    def __call__(self, batch: MicroBatch) -> TermValue:
        logp = torch.log_softmax(batch.logits.float(), dim=-1)
        entropy = -(logp.exp() * logp).sum(-1)
        loss = -(entropy * batch.weights).sum()
        return TermValue(loss, {"entropy_bonus_mean": float((entropy * batch.weights).sum().detach())})

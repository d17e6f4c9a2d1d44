"""The shaping options of ``SamplingParams`` applied to one batch's logits, step by step (the transformers
backend's decoding loop).

Each step, for each live row, in vLLM's order:

1. ``logit_bias``: each (token id, bias) pair is added to that token's logit (OpenAI's ``logit_bias``);
2. ``repetition_penalty``: transformers' ``RepetitionPenaltyLogitsProcessor`` over the row's prompt and
   output ids (a positive logit is divided by the penalty, a negative one multiplied);
3. ``presence_penalty`` and ``frequency_penalty`` (OpenAI's formula, over the output ids only):
   ``logit -= frequency_penalty * count + presence_penalty * (count > 0)``;
4. the temperature (``shape`` returns the logits before it, ``cut`` takes the tempered ones);
5. ``top_k`` and ``min_p``: transformers' ``TopKLogitsWarper`` and ``MinPLogitsWarper`` set the logits of
   the tokens they cut to ``-inf``.

``log_softmax`` of the result is the distribution the token is drawn from, and its log-prob is what the
backend stores. transformers has no presence or frequency processor, so step 3 is written here.
"""

from __future__ import annotations

import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
)

from agentmem.policy.types import SamplingParams


class Shaper:
    """The shaping state of one batch: per live row, the ids seen so far (prompt and output, for the
    repetition penalty) and each token's count in the output (for presence and frequency penalties)."""

    def __init__(self, params: SamplingParams, prompts: list[list[int]], device: torch.device):
        self.params = params
        self.bias_ids = torch.tensor([tid for tid, _ in params.logit_bias], dtype=torch.long, device=device)
        self.bias = torch.tensor([value for _, value in params.logit_bias], dtype=torch.float32, device=device)
        self.repetition = (RepetitionPenaltyLogitsProcessor(params.repetition_penalty)
                           if params.repetition_penalty != 1 else None)
        self.seen: torch.Tensor | None = None
        if self.repetition is not None:
            # left-padded with each row's own first id: a repeated id changes nothing in a set of seen ids
            width = max(len(p) for p in prompts)
            self.seen = torch.tensor([[p[0]] * (width - len(p)) + list(p) for p in prompts], device=device)
        self.penalised = bool(params.presence_penalty or params.frequency_penalty)
        self.counts: torch.Tensor | None = None  # [live rows, vocab], made at the first step
        self.warpers = ([TopKLogitsWarper(params.top_k)] if params.top_k else []) + (
            [MinPLogitsWarper(params.min_p)] if params.min_p else [])

    def shape(self, logits: torch.Tensor) -> torch.Tensor:
        """Steps 1-3 on float32 ``logits`` [live rows, vocab] (a new tensor)."""
        logits = logits.clone()
        if len(self.bias_ids):
            if int(self.bias_ids.max()) >= logits.shape[-1] or int(self.bias_ids.min()) < 0:
                raise ValueError(f"logit_bias names a token id outside the model's vocabulary [0, {logits.shape[-1]})")
            logits.index_add_(1, self.bias_ids, self.bias.expand(len(logits), -1))
        if self.repetition is not None and self.seen is not None:
            logits = self.repetition(self.seen, logits)
        if self.penalised:
            if self.counts is None:
                self.counts = torch.zeros_like(logits)
            p = self.params
            logits = logits - p.frequency_penalty * self.counts - p.presence_penalty * (self.counts > 0).float()
        return logits

    def cut(self, scores: torch.Tensor) -> torch.Tensor:
        """Step 5 on the tempered logits."""
        for warper in self.warpers:
            scores = warper(None, scores)  # type: ignore[arg-type]  # neither warper reads the ids
        return scores

    def add(self, tokens: torch.Tensor) -> None:
        """Each live row sampled ``tokens[row]``."""
        if self.seen is not None:
            self.seen = torch.cat([self.seen, tokens[:, None]], dim=-1)
        if self.counts is not None:
            self.counts[torch.arange(len(tokens), device=tokens.device), tokens] += 1

    def keep(self, rows: torch.Tensor) -> None:
        """Only ``rows`` (indices into the live rows) go on."""
        if self.seen is not None:
            self.seen = self.seen[rows]
        if self.counts is not None:
            self.counts = self.counts[rows]

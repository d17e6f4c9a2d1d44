"""The shaping options of ``SamplingParams`` applied to one batch's logits, step by step (the transformers
backend's decoding loop).

Each step, for each live row, in vLLM's order:

0. ``grammar`` (constrained decoding): the tokens the row's grammar does not allow next get ``-inf``
   (llguidance computes the allowed set from the row's output so far; ``Grammars``);
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

from collections.abc import Collection
from typing import Any

import llguidance
import llguidance.hf
import llguidance.numpy
import numpy as np
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
)

from agentmem.backends.types import SamplingParams


class Grammars:
    """llguidance's view of one tokenizer (built once per backend: about half a second for a 49k vocabulary):
    compiles a ``SamplingParams.grammar`` into one matcher per row. ``vocab``: the width of the model's logits
    (ids past the tokenizer's are never allowed); ``eos_ids``: the ids that end an output, the only ones
    allowed once the grammar is complete."""

    def __init__(self, tokenizer: Any, vocab: int, eos_ids: Collection[int]):
        self.vocab = vocab
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=sorted(eos_ids))

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        matcher = llguidance.LLMatcher(self.tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar))
        if matcher.is_error():
            raise ValueError(f"the grammar does not compile: {matcher.get_error()}")
        return matcher


class Shaper:
    """The shaping state of one batch: per live row, its grammar's matcher (constrained decoding), the ids seen
    so far (prompt and output, for the repetition penalty) and each token's count in the output (for presence and
    frequency penalties)."""

    def __init__(self, params: SamplingParams, prompts: list[list[int]], device: torch.device,
                 grammars: Grammars | None = None):
        self.params = params
        self.matchers: list[llguidance.LLMatcher] | None = None
        if params.grammar is not None:
            if grammars is None:
                raise ValueError("a grammar needs the backend's Grammars")
            self.matchers = [grammars.matcher(params.grammar) for _ in prompts]
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
        """Steps 0-3 on float32 ``logits`` [live rows, vocab] (a new tensor)."""
        logits = logits.clone()
        if self.matchers is not None:
            logits.masked_fill_(~self.allowed(logits.shape[-1]).to(logits.device), float("-inf"))
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

    def allowed(self, vocab: int) -> torch.Tensor:
        """Which tokens each live row's grammar allows next: bool [live rows, vocab]."""
        assert self.matchers is not None
        bits = llguidance.numpy.allocate_token_bitmask(len(self.matchers), vocab)
        for row, matcher in enumerate(self.matchers):
            llguidance.numpy.fill_next_token_bitmask(matcher, bits, row)
        return torch.from_numpy(np.unpackbits(bits.view(np.uint8), axis=-1, bitorder="little")[:, :vocab].view(np.bool_))

    def add(self, tokens: torch.Tensor) -> None:
        """Each live row sampled ``tokens[row]``."""
        if self.matchers is not None:
            for matcher, token in zip(self.matchers, tokens.tolist(), strict=True):
                if not matcher.consume_token(token):
                    raise RuntimeError(f"the grammar refused sampled token {token}: {matcher.get_error()}")
        if self.seen is not None:
            self.seen = torch.cat([self.seen, tokens[:, None]], dim=-1)
        if self.counts is not None:
            self.counts[torch.arange(len(tokens), device=tokens.device), tokens] += 1

    def keep(self, rows: torch.Tensor) -> None:
        """Only ``rows`` (indices into the live rows) go on."""
        if self.matchers is not None:
            self.matchers = [self.matchers[i] for i in rows.tolist()]
        if self.seen is not None:
            self.seen = self.seen[rows]
        if self.counts is not None:
            self.counts = self.counts[rows]

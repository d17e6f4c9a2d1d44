"""The default generation backend: a transformers causal LM with our own KV-cached decoding loop.

Why our own loop rather than ``model.generate``: the stored log-probs must be exactly the quantity
training recomputes, and the loop is short enough to own.

Batching: all prompts of a call go into one left-padded batch with an attention mask and position
ids that restart at 0 at each prompt's first real token (``cumsum(mask) - 1``), so a prompt's
output does not depend on how much padding it got. A row leaves the batch (its KV cache rows are
dropped) as soon as it finishes, so short answers do not pay for long ones.

Log-probs: for each sampled token the backend stores ``log_softmax(logits / T)`` at that token,
over the FULL vocabulary, computed in float32 from the model's logits. Top-p only restricts which
tokens may be sampled (the smallest set of most likely tokens whose tempered probability reaches
``top_p``; the most likely token is always in it); it does not renormalise the stored log-prob.
Greedy decoding (T == 0) takes the argmax and stores the log-prob under T = 1.

Stopping: a row stops when it samples one of the end-of-sequence ids (the tokenizer's eos and the
model's ``generation_config.eos_token_id``, e.g. ``<|im_end|>``); that token IS included in
``output_ids`` and ``logprobs`` (the policy sampled it and is trained on it), and nothing follows it.
Otherwise it stops at ``max_new_tokens`` with finish reason ``length``.

Seeds: with ``SamplingParams.seed`` set, one ``torch.Generator`` drives the whole call, so the same
prompts in the same order with the same seed give the same outputs (on the same device and dtype).
"""

from __future__ import annotations

import time

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentmem.policy.errors import ModelError
from agentmem.policy.models import DType, load_model
from agentmem.policy.types import Generation, SamplingParams
from agentmem.records import FinishReason


class TransformersBackend:
    name = "transformers"

    def __init__(self, model_path: str, *, dtype: DType = "bfloat16", device: str = "cpu") -> None:
        model, tokenizer = load_model(model_path, dtype=dtype, device=device)
        self._setup(model, tokenizer)

    @classmethod
    def from_model(cls, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> TransformersBackend:
        """Wrap an already loaded model (tests, or a trainer sampling from its live weights)."""
        backend = cls.__new__(cls)
        backend._setup(model.eval(), tokenizer)
        return backend

    def _setup(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.stop_ids = eos_ids(model, tokenizer)
        if not self.stop_ids:
            raise ModelError("neither the tokenizer nor the model's generation config names an eos token")
        pad = tokenizer.pad_token_id
        # Pad values never reach a real token (they are masked); any valid id will do.
        self.pad_id = pad if pad is not None else min(self.stop_ids)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        start = time.perf_counter()
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        device = self.model.device
        generator = None
        if params.seed is not None and not params.greedy:
            generator = torch.Generator(device=device).manual_seed(params.seed)
        stop = torch.tensor(sorted(self.stop_ids), device=device)

        input_ids, mask = self._left_pad(prompts, device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1
        )
        cache = out.past_key_values
        logits = out.logits[:, -1, :].float()
        next_pos = positions[:, -1] + 1
        rows = torch.arange(len(prompts), device=device)  # original index of each live row

        ids: list[list[int]] = [[] for _ in prompts]
        lps: list[list[float]] = [[] for _ in prompts]
        results: list[Generation | None] = [None] * len(prompts)
        for step in range(params.max_new_tokens):
            tokens, logprobs = sample(logits, params, generator)
            stopped = torch.isin(tokens, stop)
            now = time.perf_counter() - start
            for row, tok, lp, st in zip(
                rows.tolist(), tokens.tolist(), logprobs.tolist(), stopped.tolist(), strict=True
            ):
                ids[row].append(tok)
                lps[row].append(lp)
                if st or step == params.max_new_tokens - 1:
                    reason = FinishReason.stop if st else FinishReason.length
                    results[row] = Generation(ids[row], lps[row], reason, now)
            live = ~stopped
            if step == params.max_new_tokens - 1 or not live.any():
                break
            if not live.all():
                keep = live.nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                rows, mask, tokens, next_pos = rows[keep], mask[keep], tokens[keep], next_pos[keep]
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=-1)
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=next_pos[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            logits = out.logits[:, -1, :].float()
            next_pos = next_pos + 1
        return results  # type: ignore[return-value]  # every row was filled before the loop ended

    def _left_pad(self, prompts: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        return input_ids.to(device), mask.to(device)


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """The tokenizer's eos id plus the generation config's eos id(s)."""
    found: set[int] = set()
    if tokenizer.eos_token_id is not None:
        found.add(tokenizer.eos_token_id)
    config_eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    if isinstance(config_eos, int):
        found.add(config_eos)
    elif config_eos is not None:
        found.update(config_eos)
    return found


def sample(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row from float32 ``logits`` [batch, vocab]; return (tokens, log-probs).

    The log-prob is under ``log_softmax(logits / T)`` over the full vocabulary (T = 1 for greedy).
    """
    if params.greedy:
        tokens = logits.argmax(-1)
        logp = torch.log_softmax(logits, dim=-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1:
        sorted_lp, order = logp.sort(dim=-1, descending=True)
        probs = sorted_lp.exp()
        # Drop a token when the mass of the tokens strictly more likely already reaches top_p.
        drop = (probs.cumsum(-1) - probs) >= params.top_p
        choice = torch.multinomial(probs.masked_fill(drop, 0.0), 1, generator=generator)
        tokens = order.gather(-1, choice).squeeze(-1)
    else:
        tokens = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)

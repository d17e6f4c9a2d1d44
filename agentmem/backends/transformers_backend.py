"""The default generation backend: a transformers causal LM with our own KV-cached decoding loop.

Why our own loop rather than ``model.generate``: the stored log-probs must be exactly the quantity
training recomputes, and the loop is short enough to own.

Batching: all prompts of a call go into one left-padded batch with an attention mask and position
ids that restart at 0 at each prompt's first real token (``cumsum(mask) - 1``), so a prompt's
output does not depend on how much padding it got. A row leaves the batch (its KV cache rows are
dropped) as soon as it finishes, so short answers do not pay for long ones.

Shared-prefix prefill (``share_prefix=True``, the default): GRPO sends the G siblings of a task
together, and at one step they read the same question and chunk, so their prompts share a long
token prefix. ``plan_shared_prefixes`` partitions the batch into groups whose members share at
least ``MIN_SHARED_PREFIX`` leading tokens (a group's prefix is its members' longest common prefix,
less one token when a member would be left with an empty suffix). Each distinct prefix is prefilled
once; its KV cache rows are copied to the group's rows; then every row's suffix is prefilled on top,
and the whole batch decodes together as before. Row layout in the cache:
``[pad | prefix | pad | suffix]`` (mask 0 on the pads), with explicit position ids, so every token
keeps the position it has in its own prompt and sees exactly its own earlier tokens: log-probs equal
the unshared path's to float round-off. A prompt that shares nothing sits in the suffix region when it
fits there, otherwise as its own one-row "prefix" (all but its last token). When the plan would not
save a tenth of the padded prefill positions, or no group forms (e.g. G = 1 with prompts that share
little), the batch takes the plain path unchanged.
Rows keep their order in the batch, so seeded sampling draws from the generator in the same order as
without sharing (a token can still differ where two candidates' probabilities differ only by
round-off). Models with sliding-window attention would count the middle pads against the window:
leave ``share_prefix`` off for them.

Prompt-head cache (``keep_head``, on with ``share_prefix``): every prompt of a call usually begins with the
same head (the chat template's system turn and the user turn's first words: about 30 tokens of the agent's prompts),
call after call. Its keys and values are computed once and kept (``PromptHead``) while the weights stay the same
(the key is every parameter's storage, in-place version and dtype, and the autocast state, so a trainer sampling
from its live weights gets a fresh head after each optimiser step); a later call whose prompts all begin with at
least ``MIN_SHARED_PREFIX`` of its tokens starts from them and prefills only the rest (row layout
``[head | pad | rest]``, or with shared prefixes ``[head | pad | prefix | pad | suffix]``). Positions and
attention are as before, so log-probs equal the plain path's to float round-off (greedy ids can differ where two
candidates differ by round-off: in bfloat16 more often than in float32); ``last_stats.head_reused`` says whether a
call took its head from an earlier one.

Decode step (``static_decode=True``, the default): after the prefill, models of the llama family (llama,
qwen2, mistral without sliding windows) decode through ``StaticDecoder``: the prompt's keys and values
are copied once into preallocated buffers with room for every new token, each step writes in place, the
projections run as fused, prepacked matmuls, and finished rows are dropped from the buffers
(``static_decode``). Logits equal the generic step's to float round-off, so greedy ids are the same and
the stored log-probs match a fresh full forward to 1e-5 in fp32 (tested). Other models, or
``static_decode=False``, take the generic step: the model's forward with its ``DynamicCache``. The fused
weights are built on the first call (``decoder.pack_seconds``, a fraction of a second for the default
model) and rebuilt only when the weights change in place. ``last_timing`` splits the latest call's time
into prefill and decode.

Log-probs: for each sampled token the backend stores ``log_softmax(logits / T)`` at that token,
over the FULL vocabulary, computed in float32 from the model's logits (with shaping options, of the shaped
logits: ``backends.shaping``; with a ``grammar``, of the logits with the tokens it forbids removed). Top-p only restricts which
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

import itertools
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from agentmem.backends.model_files import DType, load_model
from agentmem.backends.shaping import Grammars, Shaper
from agentmem.backends.static_decode import StaticDecoder, unsupported_reason, version_key
from agentmem.backends.types import Generation, SamplingParams
from agentmem.errors import ModelError
from agentmem.records import FinishReason

MIN_SHARED_PREFIX = 16  # shorter common prefixes are not worth a separate prefill


@dataclass
class PrefillStats:
    """Prompt-side work of ``generate`` calls. ``prefill_tokens_total``: prompt tokens passed in;
    ``prefill_tokens_computed``: real tokens run through the model (a shared prefix counts once);
    ``prefill_tokens_padded``: positions run, padding included (what the forward passes cost)."""

    calls: int = 0
    prompts: int = 0
    shared_groups: int = 0
    prefill_tokens_total: int = 0
    prefill_tokens_computed: int = 0
    prefill_tokens_padded: int = 0
    head_reused: int = 0  # calls that took their prompts' common head from an earlier call (the prompt-head cache)

    def add(self, other: PrefillStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(frozen=True)
class CallTiming:
    """Where the latest ``generate`` call spent its time: ``prefill_s`` (wall) until the first token was
    sampled; ``decode_s`` (wall) and ``decode_cpu_s`` (this process's CPU time) after it, over which
    ``decode_tokens`` tokens were produced (every token after each row's first)."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_cpu_s: float = 0.0
    decode_tokens: int = 0


@dataclass(frozen=True)
class PrefixPlan:
    """How a batch is prefilled with shared prefixes: ``prefixes`` are prefilled once each; row ``i``
    reads ``prefixes[source[i]]`` (``-1``: none) and its prompt from ``split[i]`` on is its suffix."""

    prefixes: list[list[int]]
    source: list[int]
    split: list[int]
    groups: int  # groups of two or more rows sharing a prefix


@dataclass(frozen=True)
class PromptHead:
    """The keys and values of ``tokens`` (a prompt head: the tokens every prompt of a call began with), per layer
    ``[1, kv heads, len(tokens), head dim]``, under the weights and autocast state named by ``key``."""

    tokens: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    key: tuple

    def cache(self, n: int, rows: int, config: Any) -> DynamicCache:
        """A cache holding the first ``n`` head tokens for each of ``rows`` rows."""
        return DynamicCache(ddp_cache_data=[(k[:, :, :n].expand(rows, -1, -1, -1), v[:, :, :n].expand(rows, -1, -1, -1))
                                            for k, v in self.layers], config=config)


@dataclass(frozen=True)
class Step:
    """What one row sampled in one decoding step: the prompt's index, the token, its log-prob and, when asked,
    its ``top_logprobs`` alternatives (id, log-prob)."""

    row: int
    token: int
    logprob: float
    top: list[tuple[int, float]] | None = None


StepHook = Callable[[list[Step]], Collection[int] | None]


class TransformersBackend:
    name = "transformers"
    shaping = True  # applies SamplingParams' shaping options (backends.shaping)
    constrains = True  # applies SamplingParams.grammar (constrained decoding)
    lists_top_logprobs = True  # generate(..., top_logprobs=k)

    def __init__(
        self,
        model_path: str,
        *,
        dtype: DType = "bfloat16",
        device: str = "cpu",
        share_prefix: bool = True,
        static_decode: bool = True,
        keep_head: bool = True,
    ) -> None:
        model, tokenizer = load_model(model_path, dtype=dtype, device=device)
        self._setup(model, tokenizer, share_prefix, static_decode, keep_head)

    @classmethod
    def from_model(
        cls,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        share_prefix: bool = True,
        static_decode: bool = True,
        keep_head: bool = True,
    ) -> TransformersBackend:
        """Wrap an already loaded model (tests, or a trainer sampling from its live weights)."""
        backend = cls.__new__(cls)
        backend._setup(model.eval(), tokenizer, share_prefix, static_decode, keep_head)
        return backend

    def _setup(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, share_prefix: bool, static_decode: bool,
        keep_head: bool = True,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.share_prefix = share_prefix
        self.keep_head = share_prefix and keep_head  # the prompt-head cache (off: the shared-prefix plan per call only)
        # The static decode step when asked for and the model supports it; else the generic one.
        reason = unsupported_reason(model) if static_decode else "turned off"
        self.decoder = StaticDecoder(model) if reason is None else None
        self.decode_path = "static" if reason is None else f"generic ({reason})"
        self.head: PromptHead | None = None  # the prompt-head cache (keep_head)
        self.grammars: Grammars | None = None  # constrained decoding's view of the tokenizer (built when first needed)
        self.stats = PrefillStats()  # all calls so far
        self.last_stats = PrefillStats()  # the latest call
        self.last_timing = CallTiming()
        self.stop_ids = eos_ids(model, tokenizer)
        if not self.stop_ids:
            raise ModelError("neither the tokenizer nor the model's generation config names an eos token")
        pad = tokenizer.pad_token_id
        # Pad values never reach a real token (they are masked); any valid id will do.
        self.pad_id = pad if pad is not None else min(self.stop_ids)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: SamplingParams, *, top_logprobs: int = 0,
                 on_step: StepHook | None = None) -> list[Generation]:
        """One ``Generation`` per prompt; with ``top_logprobs`` k > 0 each lists, per output token, the ``k``
        most likely tokens of the distribution its token was drawn from (the same tensor as its log-prob).

        ``on_step`` (``agentmem serve``'s token streaming) is called after each sampling step, before the next
        forward pass, with one ``Step`` per row still generating; the rows it returns end there (finish reason
        ``stop``: a stop string completed), as if their token were an end-of-sequence token."""
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
        cache, mask, next_pos, logits = self.prefill(prompts)
        rows = torch.arange(len(prompts), device=device)  # original index of each live row
        decoder = self.decoder if params.max_new_tokens > 1 else None
        if decoder is not None:
            decoder.start(cache, mask, params.max_new_tokens - 1)
            del cache  # the static buffers hold the prompt's keys and values now

        ids: list[list[int]] = [[] for _ in prompts]
        lps: list[list[float]] = [[] for _ in prompts]
        tops: list[list[list[tuple[int, float]]]] = [[] for _ in prompts]
        results: list[Generation | None] = [None] * len(prompts)
        grammars = self._grammars(logits.shape[-1]) if params.grammar is not None else None
        shaper = Shaper(params, prompts, device, grammars) if params.shaping or grammars is not None else None
        for step in range(params.max_new_tokens):
            tokens, dist = sample_from(logits, params, generator, shaper)
            logprobs = dist.gather(-1, tokens[:, None]).squeeze(-1)
            if step == 0:
                first_token, first_cpu = time.perf_counter(), time.process_time()
            if shaper is not None:
                shaper.add(tokens)
            if top_logprobs:
                values, index = dist.topk(top_logprobs, dim=-1)
                for row, i, v in zip(rows.tolist(), index.tolist(), values.tolist(), strict=True):
                    # tokens top-k or min-p cut (log-prob -inf) are no alternatives
                    tops[row].append([(t, x) for t, x in zip(i, v, strict=True) if x != float("-inf")])
            stopped = torch.isin(tokens, stop)
            live_rows, toks, values = rows.tolist(), tokens.tolist(), logprobs.tolist()
            if on_step is not None:
                ended = on_step([Step(row, tok, lp, tops[row][-1] if top_logprobs else None)
                                 for row, tok, lp in zip(live_rows, toks, values, strict=True)])
                if ended:
                    stopped |= torch.tensor([row in ended for row in live_rows], device=device)
            now = time.perf_counter() - start
            for row, tok, lp, st in zip(live_rows, toks, values, stopped.tolist(), strict=True):
                ids[row].append(tok)
                lps[row].append(lp)
                if st or step == params.max_new_tokens - 1:
                    reason = FinishReason.stop if st else FinishReason.length
                    results[row] = Generation(ids[row], lps[row], reason, now, tops[row] if top_logprobs else None)
            live = ~stopped
            if step == params.max_new_tokens - 1 or not live.any():
                break
            if not live.all():
                keep = live.nonzero().squeeze(-1)
                if shaper is not None:
                    shaper.keep(keep)
                if decoder is not None:
                    decoder.keep(keep)
                else:
                    cache.batch_select_indices(keep)
                rows, mask, tokens, next_pos = rows[keep], mask[keep], tokens[keep], next_pos[keep]
            if decoder is not None:
                logits = decoder.step(tokens, next_pos).float()
            else:
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
        decoded = sum(len(i) - 1 for i in ids)
        self.last_timing = CallTiming(
            first_token - start, time.perf_counter() - first_token, time.process_time() - first_cpu, decoded
        )
        return results  # type: ignore[return-value]  # every row was filled before the loop ended

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]]) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The prompts' forward pass, reusing the kept prompt head and sharing common prefixes (its work counted
        in ``last_stats``): (transformers cache, attention mask [rows, width], each row's next position, float32
        logits [rows, vocab] of each row's first output token)."""
        device = self.model.device
        head, n, computed_head = self._head_for(prompts, device) if self.keep_head else (None, 0, 0)
        rest = [p[n:] for p in prompts]
        plan = plan_shared_prefixes(rest) if self.share_prefix else None
        if plan is None:
            out, mask, next_pos, stats = self._prefill(rest, device, head, n)
        else:
            out, mask, next_pos, stats = self._prefill_shared(rest, plan, device, head, n)
        total = sum(len(p) for p in prompts)
        self._count(replace(stats, prefill_tokens_total=total,
                            prefill_tokens_computed=stats.prefill_tokens_computed + computed_head,
                            prefill_tokens_padded=stats.prefill_tokens_padded + computed_head,
                            head_reused=int(n > 0 and not computed_head)))
        return out.past_key_values, mask, next_pos, out.logits[:, -1, :].float()

    def _grammars(self, vocab: int) -> Grammars:
        """llguidance's view of the tokenizer, built at the first constrained call (``SamplingParams.grammar``)."""
        if self.grammars is None or self.grammars.vocab != vocab:
            self.grammars = Grammars(self.tokenizer, vocab, self.stop_ids)
        return self.grammars

    def _weights_key(self) -> tuple:
        device = self.model.device.type
        return (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device), version_key(self.model.parameters()))

    def _head_for(self, prompts: list[list[int]], device: torch.device) -> tuple[PromptHead | None, int, int]:
        """The prompt head of this call: (head, tokens of it the prompts start from, tokens computed for it now).
        The head is the prompts' common prefix (each keeps at least one token of its own); a kept head serves
        when the weights are the same and it matches at least ``MIN_SHARED_PREFIX`` of it, otherwise the head
        is computed (one row) and kept. (None, 0, 0) when the prompts share fewer tokens."""
        common = min(len(p) - 1 for p in prompts)
        for p in prompts[1:]:
            common = min(common, _common_prefix(prompts[0][:common], p))
        if common < MIN_SHARED_PREFIX:
            return None, 0, 0
        key = self._weights_key()
        if self.head is not None and self.head.key == key:
            n = min(common, _common_prefix(self.head.tokens, prompts[0]))
            if n >= MIN_SHARED_PREFIX:
                return self.head, n, 0
        tokens = prompts[0][:common]
        out = self.model(input_ids=torch.tensor([tokens], device=device), use_cache=True, logits_to_keep=1)
        self.head = PromptHead(tokens, [(layer.keys, layer.values) for layer in out.past_key_values.layers], key)
        return self.head, common, common

    def _prefill(
        self, prompts: list[list[int]], device: torch.device, head: PromptHead | None = None, n: int = 0
    ) -> tuple[Any, torch.Tensor, torch.Tensor, PrefillStats]:
        """One left-padded forward over whole prompts (after the first ``n`` tokens, ``head``'s): (model output,
        attention mask, next positions, work)."""
        input_ids, mask = self._left_pad(prompts, device)
        positions = n + (mask.cumsum(-1) - 1).clamp(min=0)
        past = None
        if head is not None:
            past, mask = head.cache(n, len(prompts), self.model.config), torch.cat([mask.new_ones(len(prompts), n), mask], -1)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=past,
                         use_cache=True, logits_to_keep=1)
        computed = sum(len(p) for p in prompts)
        return out, mask, positions[:, -1] + 1, PrefillStats(1, len(prompts), 0, 0, computed, input_ids.numel())

    def _prefill_shared(
        self, prompts: list[list[int]], plan: PrefixPlan, device: torch.device, head: PromptHead | None = None,
        n: int = 0,
    ) -> tuple[Any, torch.Tensor, torch.Tensor, PrefillStats]:
        """Prefill each shared prefix once (after the first ``n`` tokens, ``head``'s), copy its cache rows to its
        group, then prefill the suffixes on top with padding between prefix and suffix: cache row
        ``[head | pad | prefix | pad | suffix]``."""
        pre_ids, pre_mask = self._left_pad(plan.prefixes, device)
        past, head_mask = None, pre_mask.new_ones(len(plan.prefixes), n)
        if head is not None:
            past = head.cache(n, len(plan.prefixes), self.model.config)
        out = self.model(
            input_ids=pre_ids,
            attention_mask=torch.cat([head_mask, pre_mask], -1),
            position_ids=n + (pre_mask.cumsum(-1) - 1).clamp(min=0),
            past_key_values=past,
            use_cache=True,
            logits_to_keep=1,
        )
        cache = out.past_key_values
        source = torch.tensor(plan.source, device=device)
        cache.batch_select_indices(source.clamp(min=0))  # rows without a prefix read row 0, masked but for the head
        prefix_mask = pre_mask[source.clamp(min=0)] * (source >= 0)[:, None]
        suffixes = [p[k:] for p, k in zip(prompts, plan.split, strict=True)]
        suf_ids, suf_mask = self._left_pad(suffixes, device)
        split = torch.tensor(plan.split, device=device)[:, None]
        positions = n + split + (suf_mask.cumsum(-1) - 1).clamp(min=0)
        mask = torch.cat([prefix_mask.new_ones(len(prompts), n), prefix_mask, suf_mask], dim=-1)
        out = self.model(
            input_ids=suf_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        computed = sum(map(len, plan.prefixes)) + sum(map(len, suffixes))
        padded = pre_ids.numel() + suf_ids.numel()
        return out, mask, positions[:, -1] + 1, PrefillStats(1, len(prompts), plan.groups, 0, computed, padded)

    def _count(self, stats: PrefillStats) -> None:
        self.last_stats = stats
        self.stats.add(stats)

    def _left_pad(self, prompts: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        return input_ids.to(device), mask.to(device)


def plan_shared_prefixes(prompts: list[list[int]], min_prefix: int = MIN_SHARED_PREFIX) -> PrefixPlan | None:
    """Which rows share which prefix, or ``None`` when sharing would not cut padded prefill work by a tenth.

    Groups come from ``shared_prefix_groups``. A grouped row's suffix is what follows its group's
    prefix. A row of no group goes to the suffix region when it fits in the longest grouped suffix
    (it costs nothing extra there), otherwise it prefills all but its last token as its own prefix.
    """
    groups = [(rows, n) for rows, n in shared_prefix_groups(prompts, min_prefix) if len(rows) > 1]
    if not groups:
        return None
    source, split = [-1] * len(prompts), [0] * len(prompts)
    prefixes: list[list[int]] = []
    for rows, n in groups:
        for row in rows:
            source[row], split[row] = len(prefixes), n
        prefixes.append(prompts[rows[0]][:n])
    suffix_width = max(len(prompts[row]) - n for rows, n in groups for row in rows)
    for row, prompt in enumerate(prompts):
        if source[row] < 0 and len(prompt) > suffix_width:
            source[row], split[row] = len(prefixes), len(prompt) - 1
            prefixes.append(prompt[:-1])
    padded = len(prefixes) * max(map(len, prefixes)) + len(prompts) * max(
        len(p) - k for p, k in zip(prompts, split, strict=True)
    )
    # Share only to save at least a tenth of the padded positions: below that the extra forward pass
    # and the cache copy eat the gain (a 4% saving measured within noise of the plain path).
    if padded > 0.9 * len(prompts) * max(map(len, prompts)):
        return None
    return PrefixPlan(prefixes, source, split, len(groups))


def shared_prefix_groups(prompts: list[list[int]], min_prefix: int) -> list[tuple[list[int], int]]:
    """Partition the rows into groups ``(rows, shared)`` that minimise the prompt tokens computed
    when each group's first ``shared`` tokens are computed once.

    Rows are sorted by their tokens, so rows with long common prefixes are neighbours, and a
    dynamic programme cuts the sorted order into runs. A run of two or more rows shares the longest
    common prefix of its members, capped so that every member keeps at least one token of its own,
    and only when that is at least ``min_prefix`` tokens; otherwise a row stands alone (``shared`` 0).
    """
    order = sorted(range(len(prompts)), key=prompts.__getitem__)
    lens = [len(prompts[i]) for i in order]
    lcp = [_common_prefix(prompts[a], prompts[b]) for a, b in itertools.pairwise(order)]
    # best[j]: fewest tokens computed for sorted rows [0, j); start[j]: where its last run begins.
    best, start = [0] * (len(order) + 1), [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        best[j], start[j] = best[j - 1] + lens[j - 1], j - 1
        shared, total = lens[j - 1] - 1, lens[j - 1]
        for i in range(j - 2, -1, -1):  # the run is sorted rows [i, j)
            shared = min(shared, lcp[i], lens[i] - 1)
            if shared < min_prefix:
                break
            total += lens[i]
            cost = best[i] + total - (j - 1 - i) * shared
            if cost < best[j]:
                best[j], start[j] = cost, i
    groups: list[tuple[list[int], int]] = []
    j = len(order)
    while j > 0:
        i = start[j]
        shared = min([*lcp[i : j - 1], *(n - 1 for n in lens[i:j])]) if j - i > 1 else 0
        groups.append((sorted(order[i:j]), shared))
        j = i
    return groups[::-1]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


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
    tokens, logp = sample_from(logits, params, generator)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def sample_from(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None, shaper: Shaper | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, the log-softmax [batch, vocab] they were drawn from): ``log_softmax(logits / T)`` (T = 1 for
    greedy), after ``shaper``'s bias, penalties, top-k and min-p when given (``backends.shaping``). Top-p
    restricts the draw to the nucleus without renormalising."""
    if shaper is not None:
        logits = shaper.shape(logits)
    scores = logits if params.greedy else logits / params.temperature
    if shaper is not None:
        scores = shaper.cut(scores)
    logp = torch.log_softmax(scores, dim=-1)
    if params.greedy:
        return scores.argmax(-1), logp
    if params.top_p < 1:
        sorted_lp, order = logp.sort(dim=-1, descending=True)
        probs = sorted_lp.exp()
        # Drop a token when the mass of the tokens strictly more likely already reaches top_p.
        drop = (probs.cumsum(-1) - probs) >= params.top_p
        drop[..., 0] = False  # the most likely token always is (a top_p below float32's range rounds to 0)
        choice = torch.multinomial(probs.masked_fill(drop, 0.0), 1, generator=generator)
        tokens = order.gather(-1, choice).squeeze(-1)
    else:
        tokens = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    return tokens, logp

"""Continuous batching on the transformers backend: rows join a running decode batch between steps.

Why: a static batch is fixed when it starts, so a request that arrives one step late waits for the whole batch to
finish, and a server whose clients call at slightly different moments runs many small batches (on a CPU a decode
step costs about the same for one row as for eight). Here a request's prompts are prefilled (with the backend's
prompt head and shared prefixes, ``TransformersBackend.prefill``) and enter the static decode step's buffers
(``StaticDecoder.admit``, into a finished row's slot) at the next step boundary; finished rows leave at once.

Each row's output is what a batch of its own would sample, to float round-off: its keys and values, positions and
attention mask are its own (a row attends only to its prompt's columns and its own outputs), and its token and
log-prob come from ``sample_from`` under the batch's ``SamplingParams`` (full-vocabulary, temperature-scaled, as
``backends.types`` says). Only plain sampling joins a running batch: parameters without shaping options, grammar or
seed (a seeded request runs alone, so that it gives the same output whatever else runs), on a model the static decode
step supports (``TransformersBackend.decoder``). Each row has its own budget of new tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from agentmem.backends.transformers_backend import Step, StepHook, TransformersBackend, sample_from
from agentmem.backends.types import Generation, SamplingParams
from agentmem.records import FinishReason


def joinable(backend: object, params: SamplingParams) -> bool:
    """Whether requests sampled with ``params`` can share a ``DecodeBatch`` on ``backend``."""
    return (isinstance(backend, TransformersBackend) and backend.decoder is not None and not params.shaping
            and params.grammar is None and params.seed is None)


def batch_params(params: SamplingParams) -> SamplingParams:
    """What rows of one batch share: the sampling parameters less the budget, which is each row's own."""
    return replace(params, max_new_tokens=1)


@dataclass
class _Row:
    budget: int
    joined: float
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)


class DecodeBatch:
    """A decode batch that rows may join between steps. ``join`` adds prompts (each with its own budget of new
    tokens) and returns their row ids; ``step`` samples one token for every live row and returns the rows that
    finished, by id. Rows are ids that stay the same while other rows join and leave.

    A row that leaves frees its slot in the decoder's buffers, and a joining row takes a free slot (its own
    columns written in place, nothing else copied); the buffers are compacted when at least half their slots
    are free. A free slot is decoded with the others (its output unused) until it is taken or compacted away."""

    def __init__(self, backend: TransformersBackend, params: SamplingParams, *, trim_slack: int = 64) -> None:
        if not joinable(backend, params):
            raise ValueError("continuous batching takes plain sampling (no shaping options, grammar or seed) on a "
                             "model with the static decode step")
        assert backend.decoder is not None
        self.backend, self.decoder, self.params = backend, backend.decoder, batch_params(params)
        self.device = backend.model.device
        self.stop = torch.tensor(sorted(backend.stop_ids), device=self.device)
        self.slots: list[int | None] = []  # the row id in each slot of the decoder's buffers (None: free)
        self.rows: dict[int, _Row] = {}
        self.logits: torch.Tensor | None = None  # [slots, vocab] float32: each slot's next-token logits
        self.next_pos = torch.zeros(0, dtype=torch.long, device=self.device)
        self._next_id = 0
        self.joins = 0  # prefills made (one per join)
        # leading columns no live row sees are dropped once there are this many (StaticDecoder.trim), checked at
        # least every trim_slack steps
        self.trim_slack = trim_slack
        self._since_trim = 0

    def __len__(self) -> int:
        return len(self.rows)

    @torch.inference_mode()
    def join(self, prompts: list[list[int]], budgets: list[int]) -> list[int]:
        """Prefill ``prompts`` and add them to the batch; ``budgets``: each one's largest number of new tokens."""
        if len(prompts) != len(budgets) or not prompts:
            raise ValueError("join needs one budget per prompt, and at least one prompt")
        if any(len(p) == 0 for p in prompts) or min(budgets) < 1:
            raise ValueError("every prompt needs at least one token and every budget at least one new token")
        cache, mask, next_pos, logits = self.backend.prefill(prompts)
        room = max(budgets) - 1  # the last sampled token is never fed back
        if self.rows:
            free = [i for i, row in enumerate(self.slots) if row is None]
            slots = self.decoder.admit(cache, mask, room, free, slack=self.trim_slack)
        else:  # fresh buffers
            self.decoder.start(cache, mask, room)
            slots, self.slots, self.logits = list(range(len(prompts))), [], None
            self.next_pos = self.next_pos[:0]
        del cache
        grow = max(slots) + 1 - len(self.slots)
        if grow > 0:
            self.slots += [None] * grow
            pad = logits.new_zeros((grow, logits.shape[-1]))
            self.logits = pad if self.logits is None else torch.cat([self.logits, pad])
            self.next_pos = torch.cat([self.next_pos, self.next_pos.new_zeros(grow)])
        assert self.logits is not None
        index = torch.tensor(slots, device=self.device)
        self.logits[index] = logits
        self.next_pos[index] = next_pos.to(self.device)
        now = time.perf_counter()
        ids = list(range(self._next_id, self._next_id + len(prompts)))
        self._next_id += len(prompts)
        for row, slot, budget in zip(ids, slots, budgets, strict=True):
            self.rows[row] = _Row(budget, now)
            self.slots[slot] = row
        self.joins += 1
        return ids

    @torch.inference_mode()
    def step(self, top_logprobs: dict[int, int] | None = None,
             on_step: StepHook | None = None) -> dict[int, Generation]:
        """Sample one token for every live row (with ``top_logprobs[row]`` alternatives where asked); ``on_step``
        sees the rows' ``Step``s (ids as ``row``) and returns rows that end here (a stop string completed). Returns
        the rows that finished (end-of-sequence, budget spent, or ended), which leave the batch."""
        if not self.rows or self.logits is None:
            return {}
        live = self._live()
        ids = [row for row in self.slots if row is not None]
        index = torch.tensor(live, device=self.device)
        whole = len(live) == len(self.slots)
        tokens, dist = sample_from(self.logits if whole else self.logits[index], self.params, None)
        values = dist.gather(-1, tokens[:, None]).squeeze(-1).tolist()
        asked = {row: k for row, k in (top_logprobs or {}).items() if k > 0 and row in self.rows}
        tops: dict[int, list[tuple[int, float]]] = {}
        if asked:
            best, alternatives = dist.topk(max(asked.values()), dim=-1)
            for i, row in enumerate(ids):
                if row in asked:  # tokens cut (log-prob -inf) are no alternatives
                    pairs = zip(alternatives[i, : asked[row]].tolist(), best[i, : asked[row]].tolist(), strict=True)
                    tops[row] = [(t, x) for t, x in pairs if x != float("-inf")]
        toks = tokens.tolist()
        stopped = torch.isin(tokens, self.stop).tolist()
        if on_step is not None:
            ended = on_step([Step(row, tok, lp, tops.get(row)) for row, tok, lp in zip(ids, toks, values, strict=True)])
            stopped = [s or row in (ended or ()) for row, s in zip(ids, stopped, strict=True)]
        now = time.perf_counter()
        done: dict[int, Generation] = {}
        for slot, row, tok, lp, st in zip(live, ids, toks, values, stopped, strict=True):
            r = self.rows[row]
            r.ids.append(tok)
            r.logprobs.append(lp)
            if row in tops:
                r.top.append(tops[row])
            if st or len(r.ids) >= r.budget:
                reason = FinishReason.stop if st else FinishReason.length
                done[row] = Generation(r.ids, r.logprobs, reason, now - r.joined, r.top if row in asked else None)
                del self.rows[row]
                self.slots[slot] = None
        if not self.rows:
            return done
        feed = tokens if whole else torch.zeros(len(self.slots), dtype=tokens.dtype, device=self.device).index_copy_(
            0, index, tokens)  # a free slot decodes token 0, unused
        self.logits = self.decoder.step(feed, self.next_pos).float()
        self.next_pos = self.next_pos + 1
        self._since_trim += 1
        if 2 * len(self.rows) <= len(self.slots):
            self._compact()
        elif self._since_trim >= self.trim_slack:  # a batch that never drains must not attend over ever more columns
            self.decoder.trim(self.trim_slack, torch.tensor(self._live(), device=self.device))
            self._since_trim = 0
        return done

    def _live(self) -> list[int]:
        """The slots that hold a row."""
        return [i for i, row in enumerate(self.slots) if row is not None]

    def _compact(self) -> None:
        """Drop the free slots from the buffers (and the leading columns no live row sees)."""
        live = self._live()
        index = torch.tensor(live, dtype=torch.long, device=self.device)
        self.slots = [self.slots[i] for i in live]
        self.next_pos = self.next_pos[index]
        self.logits = self.logits[index] if self.logits is not None else None
        self.decoder.keep(index)
        self.decoder.trim(self.trim_slack)
        self._since_trim = 0

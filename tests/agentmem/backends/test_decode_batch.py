"""Continuous batching: rows that join a running decode batch between steps, with prompts wider than the
columns before the current one and budgets past its last column, sample what each would sample alone."""

from __future__ import annotations

import threading

import pytest
import torch
from model_helpers import sample_prompts

from agentmem.backends import SamplingParams, TransformersBackend
from agentmem.backends.decode_batch import DecodeBatch, joinable
from agentmem.backends.static_decode import StaticDecoder
from agentmem.records import FinishReason
from agentmem.serve.sampler import BatchSampler, Job
from agentmem.testing.tiny_models import tiny_llama, tiny_qwen2, tiny_tokenizer

HI, SIBLING, SIBLING2, SIBLING3, FRANCE, UPDATE = 0, 1, 2, 3, 5, 6  # in sample_prompts


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def prompts(tok):
    return sample_prompts(tok)


def alone(backend, prompt, params, **kw):
    return backend.generate([prompt], params, **kw)[0]


def drive(batch, joins, top_logprobs=None):
    """Step ``batch``, joining ``joins[step]`` = [(key, prompt, budget)] before step ``step``; every row's
    Generation by key."""
    out, keys, step = {}, {}, 0
    while step in joins or len(batch) or any(s > step for s in joins):
        if step in joins:  # one prefill per step's joiners (siblings share their prefix)
            rows = batch.join([p for _, p, _ in joins[step]], [b for _, _, b in joins[step]])
            keys.update(zip(rows, [k for k, _, _ in joins[step]], strict=True))
        tops = {row: top_logprobs for row in keys} if top_logprobs else None
        for row, gen in batch.step(tops).items():
            out[keys[row]] = gen
        step += 1
    return out


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_joined_rows_sample_what_they_would_alone(make, temperature, tok, prompts):
    model = make()
    backend = TransformersBackend.from_model(model, tok)
    params = SamplingParams(temperature=temperature, max_new_tokens=12)
    # short prompts start the batch; a long one joins at step 2 (buffers grow left), a large budget at step 5
    # (they grow right), siblings join after rows have left; trim_slack 1 drops unseen columns at once
    joins = {0: [("a", prompts[HI], 6), ("b", prompts[UPDATE], 12)], 2: [("c", prompts[SIBLING], 9)],
             5: [("d", prompts[FRANCE], 20)], 8: [("e", prompts[SIBLING2], 4), ("f", prompts[SIBLING3], 7)]}
    batch = DecodeBatch(backend, params, trim_slack=1)
    if temperature:
        torch.manual_seed(0)
    got = drive(batch, joins)
    stats = backend.stats
    assert stats.calls == 4 and stats.prefill_tokens_computed < stats.prefill_tokens_total  # siblings share theirs
    assert sorted(got) == ["a", "b", "c", "d", "e", "f"]
    for key, prompt, budget in (j for js in joins.values() for j in js):
        g = got[key]
        assert len(g.output_ids) == len(g.logprobs) <= budget
        assert (g.finish_reason is FinishReason.length) == (len(g.output_ids) == budget and
                                                           g.output_ids[-1] not in backend.stop_ids)
        # the same tokens teacher-forced alone: each log-prob is the row's own, to float round-off
        forced = SamplingParams(temperature=temperature, max_new_tokens=len(g.output_ids))
        if temperature == 0:
            want = alone(backend, prompt, forced)
            assert g.output_ids == want.output_ids
            assert g.logprobs == pytest.approx(want.logprobs, abs=1e-5, rel=0)
        else:
            from model_helpers import fresh_logprobs

            ref = fresh_logprobs(model, prompt, g.output_ids, temperature)
            assert torch.allclose(torch.tensor(g.logprobs), ref, atol=1e-5, rtol=0)
    assert batch.joins == 4 and len(batch) == 0


def test_slots_are_reused_and_columns_grow_and_trim(tok, prompts):
    backend = TransformersBackend.from_model(tiny_llama(), tok)
    batch = DecodeBatch(backend, SamplingParams(temperature=0, max_new_tokens=1), trim_slack=1)
    a, x = batch.join([prompts[HI], prompts[UPDATE]], [30, 30])
    dec = backend.decoder
    width = max(len(prompts[HI]), len(prompts[UPDATE]))
    assert (dec.column, dec.values.shape[3]) == (width, width + 29)
    batch.step()
    batch.join([prompts[FRANCE]], [3])  # wider than the columns before the current one: grows on the left
    assert dec.column == len(prompts[FRANCE]) and dec.rows == 3
    for _ in range(3):
        batch.step()
    assert batch.slots == [a, x, None] and dec.rows == 3  # the long row left its slot (a third free: kept)
    (c,) = batch.join([prompts[SIBLING]], [60])  # takes the free slot; grows on the left and (past the last column) right
    assert batch.slots == [a, x, c] and dec.rows == 3 and dec.values.shape[3] >= dec.column + 59
    while a in batch.rows or x in batch.rows:
        assert c not in batch.step(), "the tiny model ended the last row first"
    # a and x left: compacted to one slot, and the columns before c's prompt, seen by no row, are gone
    assert batch.slots == [c] and dec.rows == 1
    assert dec.column == len(prompts[SIBLING]) + len(batch.rows[c].ids)


def test_top_logprobs_and_ended_rows(tok, prompts):
    backend = TransformersBackend.from_model(tiny_llama(), tok)
    params = SamplingParams(temperature=0, max_new_tokens=8)
    batch = DecodeBatch(backend, params)
    rows = batch.join([prompts[HI], prompts[UPDATE]], [8, 8])
    seen = []

    def hook(steps):
        seen.extend(s.row for s in steps)
        return {rows[1]} if len(seen) >= 6 else None  # end the second row at its third token

    got = {}
    while len(batch):
        got.update(batch.step({rows[0]: 3}, hook))
    want = alone(backend, prompts[HI], params, top_logprobs=3)
    assert got[rows[0]].output_ids == want.output_ids
    assert [[t for t, _ in step] for step in got[rows[0]].top] == [[t for t, _ in step] for step in want.top]
    assert got[rows[1]].top is None
    assert len(got[rows[1]].output_ids) == 3 and got[rows[1]].finish_reason is FinishReason.stop


def test_only_plain_sampling_joins(tok):
    backend = TransformersBackend.from_model(tiny_llama(), tok)
    assert joinable(backend, SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=4))
    for params in (SamplingParams(temperature=1.0, max_new_tokens=4, seed=3),
                   SamplingParams(temperature=1.0, max_new_tokens=4, top_k=5),
                   SamplingParams(temperature=0.0, max_new_tokens=4, logit_bias=((1, -5.0),))):
        assert not joinable(backend, params)
        with pytest.raises(ValueError, match="plain sampling"):
            DecodeBatch(backend, params)
    generic = TransformersBackend.from_model(tiny_llama(), tok, static_decode=False)
    assert not joinable(generic, SamplingParams(temperature=0, max_new_tokens=4))


def test_a_late_request_joins_the_running_batch(tok, prompts, monkeypatch):
    """Through the serve sampler: a request sent after the first one's tokens started joins its batch (one
    batch in all), a seeded one waits for the batch to drain and runs alone; each gets what it would alone."""
    backend = TransformersBackend.from_model(tiny_llama(), tok)
    greedy = SamplingParams(temperature=0, max_new_tokens=16)
    want = {i: alone(backend, prompts[i], replace_budget(greedy, b)) for i, b in ((HI, 16), (FRANCE, 6))}
    seeded = SamplingParams(temperature=1.0, max_new_tokens=5, seed=7)
    want_seeded = alone(backend, prompts[UPDATE], seeded)
    widths = []
    original = StaticDecoder.step
    monkeypatch.setattr(StaticDecoder, "step", lambda self, t, p: widths.append(len(t)) or original(self, t, p))
    sampler = BatchSampler(backend, window_s=0)
    started = threading.Event()
    try:
        first = sampler.submit(Job([prompts[HI]], 1, greedy), emit=lambda tokens: started.set())
        assert started.wait(30)
        late = sampler.submit(Job([prompts[FRANCE]], 1, replace_budget(greedy, 6)))
        alone_too = sampler.submit(Job([prompts[UPDATE]], 1, seeded))
        (a,), (b,), (c,) = first.result(60), late.result(60), alone_too.result(60)
    finally:
        sampler.close()
    assert a.output_ids == want[HI].output_ids and b.output_ids == want[FRANCE].output_ids
    assert c.output_ids == want_seeded.output_ids and c.logprobs == pytest.approx(want_seeded.logprobs, abs=1e-5)
    assert sampler.batches == 2  # the greedy pair shared one batch; the seeded request ran alone
    assert 2 in widths  # steps decoded both greedy rows together


def replace_budget(params: SamplingParams, budget: int) -> SamplingParams:
    from dataclasses import replace

    return replace(params, max_new_tokens=budget)


def test_one_requests_error_after_decoding_is_its_own(tok, prompts, monkeypatch):
    """A request whose answer fails once its rows finished (here: its prompt log-probs) gets the error; the
    request decoded beside it gets its choices."""
    import agentmem.serve.sampler as sampler_module

    def broken(model, ids):
        raise RuntimeError("prompt scoring failed")

    monkeypatch.setattr(sampler_module, "score_prompt", broken)
    backend = TransformersBackend.from_model(tiny_llama(), tok)
    greedy = SamplingParams(temperature=0, max_new_tokens=5)
    sampler = BatchSampler(backend, window_s=0.05)
    try:
        scored = sampler.submit(Job([prompts[HI]], 1, greedy, prompt_logprobs=True))
        plain = sampler.submit(Job([prompts[FRANCE]], 1, greedy))
        with pytest.raises(RuntimeError, match="prompt scoring failed"):
            scored.result(60)
        (choice,) = plain.result(60)
    finally:
        sampler.close()
    assert choice.output_ids == alone(backend, prompts[FRANCE], greedy).output_ids
    assert sampler.batches == 1


def test_a_batch_that_never_drains_keeps_its_columns_bounded(tok, prompts):
    """A row joins every other step and each decodes 8 (4 slots, never half free, so never compacted): the leading
    columns no live row sees are trimmed every few steps, and the rows still sample what they would alone."""
    backend = TransformersBackend.from_model(tiny_llama(), tok)
    greedy = SamplingParams(temperature=0, max_new_tokens=1)
    batch = DecodeBatch(backend, greedy, trim_slack=4)
    order = [HI, UPDATE, FRANCE, SIBLING]
    key, got, widths = {}, {}, []
    for step in range(100):
        if step % 2 == 0:
            (row,) = batch.join([prompts[order[step // 2 % 4]]], [8])
            key[row] = (step, order[step // 2 % 4])
        got.update({key[r]: g for r, g in batch.step().items()})
        widths.append(backend.decoder.values.shape[3])
    assert len(got) >= 45 and len(batch.slots) == 4
    assert max(widths) <= max(map(len, prompts)) + 8 + 3 * 4  # without trimming: one more column every step
    for (_, i), gen in got.items():
        want = alone(backend, prompts[i], replace_budget(greedy, len(gen.output_ids)))
        assert gen.output_ids == want.output_ids
        assert gen.logprobs == pytest.approx(want.logprobs, abs=1e-5, rel=0)

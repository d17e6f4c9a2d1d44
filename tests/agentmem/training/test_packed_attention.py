"""Packed forward passes equal per-invocation passes, in logits and gradients, and never leak."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from model_helpers import make_sequences

from agentmem.replay import Row, Sequence, pack
from agentmem.testing.tiny_models import tiny_llama, tiny_qwen2
from agentmem.training.collate import collate_rows
from agentmem.training.packed_attention import (
    SEGMENT_ATTENTION,
    action_logits,
    packed_logits,
    segment_sdpa_attention,
)

torch.set_num_threads(1)
MODELS = {"llama": tiny_llama, "qwen2": tiny_qwen2}
PATHS = ["fast", "reference"]


@pytest.fixture(scope="module")
def packed():
    seqs = make_sequences()
    rows, _ = pack(seqs, row_tokens=40)
    assert len(rows) >= 3 and len({len(r) for r in rows}) > 1  # several rows, padding in some
    return {s.invocation_id: s for s in seqs}, collate_rows(rows, pad_id=0)


def alone(model, seq: Sequence) -> torch.Tensor:
    return model(input_ids=torch.from_numpy(seq.input_ids.astype(np.int64))[None], use_cache=False).logits[0]


def unpacked_logits(model, by_id, batch) -> torch.Tensor:
    return torch.cat([alone(model, by_id[i]) for i in batch.invocation_ids])


def token_logprob_sum(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return logits.log_softmax(-1).gather(-1, ids[:, None]).sum()


def test_collate_matches_docstring_example():
    row1 = Row(np.array([1, 2, 3, 4, 5], np.int32), np.array([0, 1, 2, 0, 1], np.int32), np.array([0, 3, 5], np.int32),
               np.array([0, 1, 0, 1, 0], bool), ("a", "b"), np.array([3, 5], np.int32), np.array([-1, -2], np.float32))
    row2 = Row(np.array([6, 7, 8], np.int32), np.array([0, 1, 2], np.int32), np.array([0, 3], np.int32),
               np.array([0, 1, 0], bool), ("c",), np.array([8], np.int32), np.array([-3], np.float32))
    b = collate_rows([row1, row2], pad_id=0)
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 0, 0]]
    assert b.position_ids.tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 0, 1]]
    assert b.token_mask.tolist() == [[True] * 5, [True] * 3 + [False] * 2]
    assert b.action_mask.tolist() == [[False, True, False, True, False], [False, True, False, False, False]]
    assert b.segment_ids.tolist() == [[0, 0, 0, 1, 1], [2, 2, 2, -2, -2]]
    assert b.cu_seqlens.tolist() == [0, 3, 5, 8] and b.cu_seqlens.dtype == torch.int32
    assert b.seq_lens.tolist() == [3, 2, 3] and b.max_seqlen == 3
    assert b.action_ids.tolist() == [3, 5, 8] and b.action_ids.dtype == torch.int64
    assert b.sampler_logprobs.tolist() == [-1.0, -2.0, -3.0]
    assert b.invocation_ids == ("a", "b", "c") and b.action_counts == (1, 1, 1)
    # actions in row-major order are the tokens that follow the masked positions
    assert b.input_ids[:, 1:][b.action_mask[:, :-1]].tolist() == b.action_ids.tolist()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", MODELS)
def test_packed_logits_equal_unpacked(packed, name, attn):
    by_id, batch = packed
    model = MODELS[name](attn=attn)
    with torch.no_grad():
        expected = unpacked_logits(model, by_id, batch)
        flat_mask = batch.action_mask[batch.token_mask]
        for path in PATHS:
            got = packed_logits(model, batch, path)
            assert got.shape == expected.shape
            assert (got - expected).abs().max().item() <= 1e-4, path
            acts = action_logits(model, batch, path)
            assert acts.shape == (batch.action_ids.shape[0], expected.shape[1])
            assert (acts - expected[flat_mask]).abs().max().item() <= 1e-4, path
    assert model.config._attn_implementation == attn  # the fast path restores the model's own attention


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("path", PATHS)
def test_packed_gradients_equal_unpacked(packed, name, path):
    by_id, batch = packed
    model = MODELS[name](attn="sdpa")
    params = dict(model.named_parameters())

    model.zero_grad()
    loss = token_logprob_sum(action_logits(model, batch, path), batch.action_ids)
    loss.backward()
    got = {k: p.grad.clone() for k, p in params.items()}

    model.zero_grad()
    ref = 0.0
    for inv_id in batch.invocation_ids:
        seq = by_id[inv_id]
        logits = alone(model, seq)[torch.from_numpy(seq.action_mask)]
        ref = ref + token_logprob_sum(logits, torch.from_numpy(seq.action_ids.astype(np.int64)))
    ref.backward()
    assert torch.isfinite(loss) and abs(loss.item() - ref.item()) <= 1e-3
    for k, p in params.items():
        assert torch.allclose(got[k], p.grad, atol=1e-5, rtol=1e-4), k


def changed_first_segment(batch):
    """The same batch with every token of row 0's first segment replaced."""
    ids = batch.input_ids.clone()
    first = int(batch.seq_lens[0])
    ids[0, :first] = (ids[0, :first] + 7) % 250 + 3
    return dataclasses.replace(batch, input_ids=ids), first


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("name", MODELS)
def test_no_leakage_across_segments(packed, name, mixed):
    """Changing one segment's tokens leaves every other segment's logits as they were (in mixed precision too)."""
    _, batch = packed
    other, first = changed_first_segment(batch)
    model = MODELS[name](attn="sdpa")
    with torch.no_grad():
        for path in PATHS:
            a, b = (packed_logits(model, x, path, mixed_precision=mixed) for x in (batch, other))
            assert (a[:first] - b[:first]).abs().max() > 1e-3  # the change is visible where it belongs
            assert (a[first:] - b[first:]).abs().max().item() <= 1e-6, path


def test_position_ids_alone_leak_when_the_cache_is_on(packed):
    """The check above would catch the naive packed call: restarting positions, the default cache."""
    _, batch = packed
    other, first = changed_first_segment(batch)
    row0_len = int(batch.token_mask[0].sum())
    model = tiny_llama(attn="sdpa")
    with torch.no_grad():
        a, b = (model(input_ids=x.input_ids[:1], position_ids=batch.position_ids[:1]).logits[0] for x in (batch, other))
    assert (a[first:row0_len] - b[first:row0_len]).abs().max() > 1e-3


def test_segment_attention_refuses_calls_without_boundaries():
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match=SEGMENT_ATTENTION):
        segment_sdpa_attention(torch.nn.Module(), q, q, q, None)


def test_segment_groups_exact():
    from agentmem.training.packed_attention import segment_groups

    cu = torch.tensor([0, 5, 9, 30, 32, 33], dtype=torch.int32)
    assert segment_groups(cu, None) == [(0, 5)]
    assert segment_groups(cu, 10) == [(0, 2), (2, 3), (3, 5)]  # 5+4 | 21 alone (over budget) | 2+1
    assert segment_groups(cu, 100) == [(0, 5)]
    assert segment_groups(cu, 1) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]


@pytest.mark.parametrize("name", MODELS)
def test_cpu_segment_groups_keep_logits_and_gradients(packed, name, monkeypatch):
    """The CPU fast path runs a row as several forwards of whole segments: same logits and gradients, and the
    embedding looked up once for the row (each lookup's backward is a dense [vocab, hidden] gradient)."""
    import agentmem.training.packed_attention as pa

    by_id, batch = packed
    model = MODELS[name]()
    whole = packed_logits(model, batch, "fast")
    monkeypatch.setattr(pa, "CPU_GROUP_TOKENS", 8)  # forces several groups per row
    assert len(pa.segment_groups(batch.cu_seqlens, 8)) > 2
    lookups = []
    hook = model.get_input_embeddings().register_forward_hook(lambda module, args, out: lookups.append(out.shape))
    grouped = packed_logits(model, batch, "fast")
    hook.remove()
    assert lookups == [(batch.num_tokens, model.config.hidden_size)]
    assert (grouped - whole).abs().max().item() <= 1e-5
    expected = unpacked_logits(model, by_id, batch)
    token_logprob_sum(grouped[:-1], batch.input_ids[batch.token_mask][1:]).backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    token_logprob_sum(expected[:-1], batch.input_ids[batch.token_mask][1:]).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, atol=1e-5, rtol=1e-4, msg=n)


def alone_mixed(model, seq: Sequence) -> torch.Tensor:
    """One invocation alone, its decoder under bfloat16 autocast, the head in float32 on its hidden states."""
    ids = torch.from_numpy(seq.input_ids.astype(np.int64))[None]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[0]
    return model.get_output_embeddings()(hidden.float())


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("path", PATHS)
def test_mixed_precision_runs_the_decoder_in_bf16_and_the_head_in_float32(packed, name, path):
    by_id, batch = packed
    model = MODELS[name](attn="sdpa")
    flat_mask = batch.action_mask[batch.token_mask]
    with torch.no_grad():
        full = action_logits(model, batch, path)
        mixed = action_logits(model, batch, path, mixed_precision=True)
        alone_each = torch.cat([alone_mixed(model, by_id[i]) for i in batch.invocation_ids])[flat_mask]
    assert mixed.dtype == torch.float32 and mixed.shape == full.shape
    gap = (mixed - full).abs().max().item()
    assert 0 < gap <= 0.05 * full.abs().max().item()  # the decoder's bf16 rounding, and nothing more
    # packed under autocast is each invocation alone under autocast: exactly on the fast path (each segment's
    # own attention), within bf16 rounding on the reference path (one 4-D-masked attention over the padded row)
    apart = (mixed - alone_each).abs().max().item()
    assert apart <= (1e-6 if path == "fast" else gap), apart
    # the weights and their gradients stay float32
    model.zero_grad()
    token_logprob_sum(action_logits(model, batch, path, mixed_precision=True), batch.action_ids).backward()
    mixed_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    token_logprob_sum(action_logits(model, batch, path), batch.action_ids).backward()
    for n, p in model.named_parameters():
        assert p.dtype == mixed_grads[n].dtype == torch.float32, n
    flat = torch.cat([g.flatten() for g in mixed_grads.values()])
    ref = torch.cat([p.grad.flatten() for _, p in model.named_parameters()])
    assert torch.nn.functional.cosine_similarity(flat, ref, dim=0).item() > 0.99

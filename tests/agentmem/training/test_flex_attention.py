"""FlexAttention on packed rows (``agentmem_flex``): its mask is the reference mask, and its logits and gradients
are the reference path's, for segment packing and shared prefixes, on every device at hand (CPU here; CUDA in
``scripts/gpu_check.sh``). FlexAttention has no CPU backward, so gradients are checked where it has one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_helpers import group_sequences, make_sequences
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import agentmem.training.packed_attention as pa
from agentmem.replay import pack
from agentmem.training.collate import collate_rows
from agentmem.training.flex_attention import (
    FLEX_ATTENTION,
    bucket,
    flex_block_attention,
    token_blocks,
    visibility,
)
from agentmem.training.packed_attention import BlockLayout, attention_kernel, block_causal_mask, packed_logits

torch.set_num_threads(1)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# float32 within 1e-5 (the bar); bfloat16 within its rounding (the two paths sum in different orders)
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 5e-2}


def model_for(name: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """A tiny random Llama or Qwen2 with head_dim 16 (FlexAttention's CUDA kernels need at least 16)."""
    cls, cfg_cls = {"llama": (LlamaForCausalLM, LlamaConfig), "qwen2": (Qwen2ForCausalLM, Qwen2Config)}[name]
    torch.manual_seed(0)
    cfg = cfg_cls(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    return cls(cfg).eval().to(device=device, dtype=dtype)


def batches(device: str):
    seg_rows, _ = pack(make_sequences(), row_tokens=40)
    shared_rows, stats = pack(group_sequences(), row_tokens=90, shared_prefix=True)
    assert stats.shared_tokens > 0
    return {"segments": collate_rows(seg_rows, pad_id=0).to(device),
            "shared_prefix": collate_rows(shared_rows, pad_id=0).to(device)}


def flex_grad_supported(device: str) -> bool:
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.zeros(1, 1, 16, 16, device=device, requires_grad=True)
    try:
        flex_attention(q, q, q)
    except NotImplementedError:
        return False
    return True


def test_bucket_exact():
    assert [bucket(n) for n in (1, 128, 129, 256, 1000, 1024, 1025, 5000, 8192, 8193)] == [
        128, 128, 256, 256, 1024, 1024, 2048, 8192, 8192, 16384]


def test_token_blocks_exact():
    layout = BlockLayout((0, 3, 5, 6), (-1, 0, 0))  # a prefix of 3 tokens, two suffixes of 2 and 1
    block, prefix = token_blocks(layout, 8, torch.device("cpu"))
    assert block.tolist() == [0, 0, 0, 1, 1, 2, -2, -2]
    assert prefix.tolist() == [-1, -1, -1, 0, 0, 0, -1, -1]
    with pytest.raises(ValueError, match="shorter"):
        token_blocks(layout, 5, torch.device("cpu"))


@pytest.mark.parametrize("packing", ["segments", "shared_prefix"])
def test_flex_mask_is_the_reference_mask(packing):
    """Row by row, the BlockMask's visibility over the real tokens is the reference 4-D mask's; padding sees
    nothing and is seen by nothing."""
    from torch.nn.attention.flex_attention import create_mask

    batch = batches("cpu")[packing]
    reference = block_causal_mask(batch, torch.float32)[:, 0] == 0
    cu = batch.cu_seqlens.tolist()
    prefixes = batch.prefix_blocks.tolist() if batch.prefix_blocks is not None else [-1] * (len(cu) - 1)
    for r in range(batch.input_ids.shape[0]):
        n = int(batch.token_mask[r].sum())
        lo, hi = int(batch.segment_ids[r, 0]), int(batch.segment_ids[r, n - 1]) + 1  # the row's segments
        layout = BlockLayout(tuple(b - cu[lo] for b in cu[lo : hi + 1]),
                             tuple(c - lo if c >= 0 else -1 for c in prefixes[lo:hi]))
        dense = create_mask(visibility(layout, 128, torch.device("cpu")), None, None, 128, 128, device="cpu")[0, 0]
        assert torch.equal(dense[:n, :n], reference[r, :n, :n]), r
        assert not dense[n:].any() and not dense[:, n:].any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("packing", ["segments", "shared_prefix"])
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_flex_logits_equal_the_reference(name, packing, dtype, device):
    if device == "cpu" and dtype == torch.bfloat16 and name == "qwen2":
        pytest.skip("one bfloat16 model on CPU is enough (each compile takes seconds there)")
    model = model_for(name, device, dtype)
    batch = batches(device)[packing]
    with torch.no_grad():
        expected = packed_logits(model, batch, "reference")
        with attention_kernel("flex"):
            got = packed_logits(model, batch, "fast")
    assert got.shape == expected.shape and got.dtype == dtype
    assert (got.float() - expected.float()).abs().max().item() <= TOLERANCE[dtype]
    assert model.config._attn_implementation == "sdpa"  # restored


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("packing", ["segments", "shared_prefix"])
def test_flex_gradients_equal_the_reference(packing, device):
    if not flex_grad_supported(device):
        pytest.skip(f"this torch's FlexAttention has no backward on {device}")
    model = model_for("llama", device, torch.float32)
    batch = batches(device)[packing]
    ids = batch.input_ids[batch.token_mask]
    grads = []
    for path in ("fast", "reference"):
        model.zero_grad()
        with attention_kernel("flex"):  # the reference path ignores the kernel
            logits = packed_logits(model, batch, path)
        logits[:-1].log_softmax(-1).gather(-1, ids[1:, None]).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], atol=1e-5, rtol=1e-4, msg=n)


def test_flex_refuses_a_cpu_backward_and_a_missing_layout():
    q = torch.zeros(1, 2, 4, 16, requires_grad=True)
    with pytest.raises(NotImplementedError, match="no backward on CPU"):
        flex_block_attention(torch.nn.Module(), q, q, q, None, agentmem_layout=BlockLayout((0, 4), (-1,)))
    with pytest.raises(ValueError, match=FLEX_ATTENTION):
        flex_block_attention(torch.nn.Module(), q.detach(), q.detach(), q.detach(), None)


def test_default_kernels(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(pa.importlib.util, "find_spec", lambda name: None)  # no flash-attn
    assert pa.default_kernel(cpu, torch.float32) == "sdpa"
    assert pa.default_kernel(cuda, torch.bfloat16) == "flex" and pa.default_kernel(cuda, torch.float32, True) == "flex"
    assert pa.fast_attention_implementation(cuda) == pa.shared_attention_implementation(cuda, torch.float32) == FLEX_ATTENTION
    monkeypatch.setattr(pa.importlib.util, "find_spec", lambda name: object())  # flash-attn installed
    assert pa.default_kernel(cuda, torch.bfloat16, shared=True) == "flash"
    assert pa.default_kernel(cuda, torch.float32, shared=True) == "flex"  # flash-attn has no float32
    assert pa.fast_attention_implementation(cuda, torch.float32) == "flash_attention_2"
    with attention_kernel("flex"):
        assert pa.fast_attention_implementation(cpu) == pa.shared_attention_implementation(cpu, torch.float32) == FLEX_ATTENTION
        with attention_kernel("sdpa"):
            assert pa.shared_attention_implementation(cuda, torch.bfloat16) == pa.BLOCK_ATTENTION
    assert pa.fast_attention_implementation(cpu) == pa.SEGMENT_ATTENTION
    with pytest.raises(ValueError, match="unknown attention kernel"):
        with attention_kernel("xformers"):  # type: ignore[arg-type]
            pass


def test_flex_logits_are_finite_for_a_row_of_exactly_one_bucket():
    """A row filling its bucket has no padding: the slice is the whole output."""
    rng = np.random.default_rng(0)
    q, k, v = (torch.from_numpy(rng.standard_normal((1, 2, 128, 16)).astype(np.float32)) for _ in range(3))
    out, _ = flex_block_attention(torch.nn.Module(), q, k, v, None, agentmem_layout=BlockLayout((0, 100, 128), (-1, -1)))
    ref = torch.cat([torch.nn.functional.scaled_dot_product_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e],
                                                                      is_causal=True) for s, e in ((0, 100), (100, 128))], 2)
    assert out.shape == (1, 128, 2, 16)
    assert (out.transpose(1, 2) - ref).abs().max().item() <= 1e-5

"""Random-init models of real shapes (no download) and synthetic memory-agent calls, for bench/gpu.py.

The configs are the published ones of SmolLM2-135M, Qwen2.5-0.5B and Qwen2.5-1.5B (hidden sizes, layers,
heads, vocabulary, rope base), written out here; ``tiny`` is a 2-layer model with head_dim 16 (the smallest
FlexAttention's CUDA kernels take) for CPU dry runs.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from agentmem.replay import Sequence

SHAPES: dict[str, tuple[type, type, dict]] = {
    "smollm2-135m": (LlamaConfig, LlamaForCausalLM, dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, tie_word_embeddings=True, rope_theta=100000.0, max_position_embeddings=8192)),
    "qwen2.5-0.5b": (Qwen2Config, Qwen2ForCausalLM, dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1000000.0, max_position_embeddings=32768)),
    "qwen2.5-1.5b": (Qwen2Config, Qwen2ForCausalLM, dict(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1000000.0, max_position_embeddings=32768)),
    "tiny": (LlamaConfig, LlamaForCausalLM, dict(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=4096)),
}


def build(shape: str, device: str, dtype: torch.dtype, vocab: int | None = None, seed: int = 0,
          **overrides) -> torch.nn.Module:
    """A random-init model of ``shape`` (``vocab`` overrides the vocabulary, e.g. to a small tokenizer's)."""
    cfg_cls, model_cls, kwargs = SHAPES[shape]
    cfg = cfg_cls(**{**kwargs, **({"vocab_size": vocab} if vocab else {}), **overrides})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_cls(cfg)
    return model.to(dtype).eval()


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters of the decoder's matrix products (embeddings and norms left out)."""
    layers = model.get_decoder().layers
    return sum(p.numel() for p in layers.parameters() if p.dim() == 2)


def call(name: str, ids: np.ndarray, prompt: int, group=None) -> Sequence:
    """A call of ``len(ids)`` tokens whose last ``len(ids) - prompt`` are its output (the actions)."""
    n = len(ids)
    mask = np.zeros(n, bool)
    mask[prompt - 1 : n - 1] = True
    return Sequence(name, ids.astype(np.int32), np.arange(n, dtype=np.int32), mask, ids[prompt:].astype(np.int32),
                    np.zeros(n - prompt, np.float32), group=group)


def memagent_calls(n: int, lo: int, hi: int, vocab: int, seed: int, groups: int = 0,
                   head: int = 0) -> list[Sequence]:
    """``n`` calls of ``lo``-``hi`` tokens (uniform), outputs about a tenth of each (a rewritten memory;
    at least 8 tokens). ``groups`` > 0: the calls are dealt into that many groups whose members share
    their first ``head`` prompt tokens (the shared-prefix packing's case)."""
    rng = np.random.default_rng(seed)
    heads = [rng.integers(3, vocab, head) for _ in range(groups)]
    out = []
    for i in range(n):
        length = int(rng.integers(lo, hi + 1))
        output = max(8, int(length * rng.uniform(0.05, 0.15)))
        ids = rng.integers(3, vocab, length)
        group = None
        if groups:
            g = i % groups
            ids[:head] = heads[g]
            group = f"g{g}"
        out.append(call(f"call{i:04d}", ids, max(length - output, head + 1), group))
    return out

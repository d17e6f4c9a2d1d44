"""A decode step for llama-family models over a preallocated KV cache, without per-step allocation.

Why: transformers' generic decode step at small batch on a CPU is bound by per-op overhead and cache
handling, not by the hardware. Each step, ``DynamicCache`` concatenates every layer's keys and values
onto a new tensor (it copies the whole cache), GQA expands the keys and values to every query head
(another copy), and a 4-D mask is rebuilt. ``StaticDecoder`` keeps the cache in one buffer of
``[layers, batch, kv heads, prompt width + max new tokens, head dim]`` per keys and values, writes each
step's key and value in place, computes grouped-query attention by broadcasting the query groups against
the shared key head (no copy), and runs the layer's projections as two fused matmuls (q|k|v and
gate|up). The math is the model's own (its RMSNorm, rotary embedding and activation modules are
called), so logits equal the generic path's to float round-off.

Supported models (``unsupported_reason`` says why not): llama, qwen2 and mistral without sliding-window
attention, i.e. pre-norm decoder layers of ``q/k/v/o_proj`` + gated MLP, no q/k norms. Anything else
decodes on the generic path.

Fused weights are copies. They are rebuilt when any source weight changed since the last build (its
tensor version counter or storage moved), so a trainer that samples from its live, updated weights
never decodes with stale ones.

Not compiled: ``torch.compile`` of this step (the prepacked weights behind a custom op, since dynamo
cannot trace oneDNN's opaque tensors) measured 14.9 against 16.3 ms per bf16 step at batch 1 on the
default model, for 38-80 s of warm-up per process (docs/benchmarks.md, "Generation").

Cache layout: keys ``[layers, batch, kv heads, head dim, columns]`` (transposed, so the score matmul
reads them contiguously: 2.4x faster attention in bf16 at batch 32), values ``[layers, batch, kv heads,
columns, head dim]``. The prefill's columns ``[0, width)`` come from the transformers cache as they are
(padding included, masked by ``bias``); decode step ``s`` writes column ``width + s``. ``bias`` is the
additive attention mask (0 visible, the dtype's minimum hidden) over all columns.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

SUPPORTED = ("llama", "qwen2", "mistral")


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why ``model`` cannot take the static decode step, or None when it can."""
    config = model.config
    if config.model_type not in SUPPORTED:
        return f"model type {config.model_type!r} is not one of {', '.join(SUPPORTED)}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    if getattr(config, "pretraining_tp", 1) > 1:
        return "pretraining_tp > 1"
    layer = model.model.layers[0]
    if hasattr(layer.self_attn, "q_norm"):
        return "query/key norms"
    return None


class StaticDecoder:
    """One model's decode step over a preallocated cache. ``start`` loads a prefilled cache, ``step``
    decodes one token per live row, ``keep`` drops finished rows."""

    def __init__(self, model: PreTrainedModel) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"static decoding does not support this model: {reason}")
        self.model = model
        self.layers = list(model.model.layers)
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.heads = model.config.num_attention_heads
        self.kv_heads = model.config.num_key_value_heads
        self.scaling = attn.scaling
        self._fused: list[tuple[Linear, Linear, Linear, Linear]] = []
        self._head: Linear | None = None
        self._fused_key: tuple[Any, ...] | None = None
        self.keys = self.values = self.bias = torch.empty(0)
        self.column = 0
        self.pack_seconds = 0.0  # time spent building fused, prepacked weights (the one-off warm-up)
        self.packs = 0

    def _sources(self) -> list[torch.Tensor]:
        out = []
        for layer in self.layers:
            a, m = layer.self_attn, layer.mlp
            for lin in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj):
                out.append(lin.weight)
                if lin.bias is not None:
                    out.append(lin.bias)
        return [*out, self.model.lm_head.weight]

    def refresh(self) -> bool:
        """Rebuild the fused weights when a source weight changed; return whether it rebuilt."""
        key = tuple((t.data_ptr(), t._version, t.dtype) for t in self._sources())
        if key == self._fused_key:
            return False
        start = time.perf_counter()
        fused = []
        for layer in self.layers:
            a, m = layer.self_attn, layer.mlp
            qkv_bias = None
            if a.q_proj.bias is not None:
                qkv_bias = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
            fused.append((
                Linear(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), qkv_bias),
                Linear(a.o_proj.weight, a.o_proj.bias),
                Linear(torch.cat([m.gate_proj.weight, m.up_proj.weight]), None),
                Linear(m.down_proj.weight, m.down_proj.bias),
            ))
        head = self.model.lm_head
        self._fused, self._head, self._fused_key = fused, Linear(head.weight, head.bias), key
        self.pack_seconds += time.perf_counter() - start
        self.packs += 1
        return True

    def start(self, cache: Any, mask: torch.Tensor, new_tokens: int) -> None:
        """Copy a prefilled transformers cache (``cache.layers[i].keys``: [batch, kv heads, width, head
        dim]) and its attention mask [batch, width] into fresh buffers with room for ``new_tokens``."""
        self.refresh()
        first = cache.layers[0].keys
        batch, _, width, _ = first.shape
        shape = (len(self.layers), batch, self.kv_heads, width + new_tokens, self.head_dim)
        self.keys = first.new_empty((*shape[:3], shape[4], shape[3]))  # transposed: [..., head dim, columns]
        self.values = first.new_empty(shape)
        for i, layer in enumerate(cache.layers):
            self.keys[i, :, :, :, :width] = layer.keys.transpose(-1, -2)
            self.values[i, :, :, :width] = layer.values
        low = torch.finfo(first.dtype).min
        self.bias = first.new_full((batch, 1, 1, width + new_tokens), low)
        self.bias[:, 0, 0, :width].masked_fill_(mask.bool(), 0.0)
        self.column = width

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices into the current batch), in that order."""
        self.keys = self.keys.index_select(1, rows)
        self.values = self.values.index_select(1, rows)
        self.bias = self.bias.index_select(0, rows)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits [batch, vocab] (model dtype) of the next token after ``tokens`` [batch] at
        ``positions`` [batch]; the tokens' keys and values enter the cache."""
        col = self.column
        self.bias[:, :, :, col] = 0.0
        bias = self.bias[:, :, :, : col + 1]
        model = self.model.model
        x = model.embed_tokens(tokens)  # [batch, hidden]
        cos, sin = model.rotary_emb(x, positions[:, None])  # [batch, 1, head dim]
        batch, hd, kvh = len(tokens), self.head_dim, self.kv_heads
        groups = self.heads // kvh
        q_size, kv_size = self.heads * hd, kvh * hd
        for i, (layer, (qkv_proj, o_proj, gate_up_proj, down_proj)) in enumerate(
            zip(self.layers, self._fused, strict=True)
        ):
            h = layer.input_layernorm(x)
            qkv = qkv_proj(h)
            q = qkv[:, :q_size].view(batch, self.heads, hd)
            k = qkv[:, q_size : q_size + kv_size].view(batch, kvh, hd)
            v = qkv[:, q_size + kv_size :].view(batch, kvh, hd)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            self.keys[i, :, :, :, col] = k
            self.values[i, :, :, col] = v
            keys = self.keys[i, :, :, :, : col + 1]  # [batch, kv heads, head dim, length]
            values = self.values[i, :, :, : col + 1]  # [batch, kv heads, length, head dim]
            scores = torch.matmul(q.view(batch, kvh, groups, hd), keys) * self.scaling
            probs = torch.softmax(scores + bias, dim=-1, dtype=torch.float32).to(q.dtype)
            attn = torch.matmul(probs, values).view(batch, q_size)
            x = x + o_proj(attn)
            h = layer.post_attention_layernorm(x)
            gate, up = gate_up_proj(h).chunk(2, dim=-1)
            x = x + down_proj(layer.mlp.act_fn(gate) * up)
        self.column = col + 1
        return self._head(model.norm(x))  # type: ignore[misc]  # start() built it


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Linear:
    """``F.linear(x, weight, bias)`` with the weight prepacked for the CPU's matmul library when it can be:
    MKL's packed sgemm for float32 (about 1.8x faster for the 49k-row output head at batch 1), oneDNN's
    blocked layout for bfloat16 (1.7x at batch 8; the packing is what transformers' plain path repacks on
    every call). Falls back to ``F.linear`` where packing is unavailable or its result disagrees."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight.detach(), None if bias is None else bias.detach()
        self.packed: torch.Tensor | None = None
        self.kind = "plain"
        if weight.device.type != "cpu":
            return
        try:
            if weight.dtype == torch.float32 and torch.backends.mkl.is_available():
                self.packed, self.kind = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, _HINT), "mkl"
            elif weight.dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported():
                self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, _HINT)
                self.kind = "onednn"
        except (RuntimeError, AttributeError):
            self.packed, self.kind = None, "plain"
        if self.packed is not None:
            probe = torch.randn(2, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight.dtype)
            tol = 1e-4 if weight.dtype == torch.float32 else 5e-2
            if not torch.allclose(self(probe), F.linear(probe, self.weight, self.bias), atol=tol, rtol=tol):
                self.packed, self.kind = None, "plain"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "mkl":
            return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, _HINT)
        if self.kind == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


_HINT = 8  # the batch size the packed layouts are tuned for (any batch works)

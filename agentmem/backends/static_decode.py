"""A decode step for llama-family models over a preallocated KV cache, without per-step allocation.

Why: transformers' generic decode step at small batch on a CPU is bound by per-op overhead and cache
handling, not by the hardware. Each step, ``DynamicCache`` concatenates every layer's keys and values
onto a new tensor (it copies the whole cache), GQA expands the keys and values to every query head
(another copy), and a 4-D mask is rebuilt. ``StaticDecoder`` keeps the cache in one buffer of
``[layers, batch, kv heads, prompt width + max new tokens, head dim]`` per keys and values, writes each
step's key and value in place, computes grouped-query attention by broadcasting the query groups against
the shared key head (no copy), and runs the layer's projections as two fused matmuls (q|k|v and
gate|up). The math is the model's own (its rotary embedding and activation are used; RMSNorm is
``F.rms_norm`` in llama's order of operations, bitwise equal), so logits equal the generic path's to float
round-off.

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

import math
import time
from collections.abc import Iterable, Sequence
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
    for norm in (layer.input_layernorm, layer.post_attention_layernorm, model.model.norm):
        if not hasattr(norm, "variance_epsilon") or not type(norm).__name__.endswith("RMSNorm"):
            return f"{type(norm).__name__} is not a llama-style RMSNorm"
    return None


def version_key(tensors: Iterable[torch.Tensor]) -> tuple:
    """What changes when any of ``tensors`` is replaced (a new storage), updated in place (its version) or cast:
    a key for work derived from weights (fused weights, a prompt head's keys and values)."""
    return tuple((t.data_ptr(), t._version, t.dtype) for t in tensors)


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
        # The softmax scale folds into the queries' rotary factors exactly only when it is a power of two.
        self._scale_in_rotary = attn.scaling if math.frexp(attn.scaling)[0] == 0.5 else None
        self._norms: list[tuple[tuple[torch.Tensor, float, torch.Tensor, float], Any]] = []
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
            out += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
        return [*out, self.model.lm_head.weight]

    def refresh(self) -> bool:
        """Rebuild the fused weights when a source weight changed; return whether it rebuilt."""
        key = version_key(self._sources())
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
        self._norms = [((layer.input_layernorm.weight.detach(), layer.input_layernorm.variance_epsilon,
                         layer.post_attention_layernorm.weight.detach(),
                         layer.post_attention_layernorm.variance_epsilon),
                        F.silu if isinstance(layer.mlp.act_fn, torch.nn.SiLU) else layer.mlp.act_fn)
                       for layer in self.layers]
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

    @property
    def rows(self) -> int:
        """Rows (slots) in the buffers."""
        return self.bias.shape[0] if self.bias.dim() == 4 else 0

    def admit(self, cache: Any, mask: torch.Tensor, new_tokens: int, free: Sequence[int] = (),
              slack: int = 64) -> list[int]:
        """Put the rows of a prefilled transformers cache into the buffers (continuous batching) and return their
        slots: the ``free`` ones first (rows that left, written in place: nothing else moves), then new slots.
        Their prompt's columns end just before the current column, so their first decode step writes the same
        column as the rows already here. The buffers grow on the left when the prompt is wider than the columns
        before the current one, and on the right (by ``slack`` more) when ``new_tokens`` need more columns than
        are left; other rows never see the new rows' columns, nor the new rows theirs."""
        first = cache.layers[0].keys
        batch, _, width, _ = first.shape
        left = max(0, width - self.column)
        right = max(0, self.column + new_tokens - self.values.shape[3])
        if left or right:
            self._grow(left, right and right + slack)
        col, total = self.column, self.values.shape[3]
        slots = list(free[:batch])
        if len(slots) < batch:
            n, extra = self.rows, batch - len(slots)
            self.keys = torch.cat([self.keys, self.keys.new_zeros((self.keys.shape[0], extra, *self.keys.shape[2:]))], 1)
            self.values = torch.cat([self.values, self.values.new_zeros((self.values.shape[0], extra,
                                                                         *self.values.shape[2:]))], 1)
            self.bias = torch.cat([self.bias, self.bias.new_zeros((extra, *self.bias.shape[1:]))])
            slots += range(n, n + extra)
        bias = first.new_full((batch, total), torch.finfo(first.dtype).min)
        bias[:, col - width : col].masked_fill_(mask.bool(), 0.0)
        index = torch.tensor(slots, device=first.device)
        self.bias[index] = bias[:, None, None]
        for i, layer in enumerate(cache.layers):
            self.keys[i, index, :, :, col - width : col] = layer.keys.transpose(-1, -2)
            self.values[i, index, :, col - width : col] = layer.values
        return slots

    def _grow(self, left: int, right: int) -> None:
        """``left`` hidden columns before the first and ``right`` after the last; the current column moves with
        the left ones."""
        low = torch.finfo(self.bias.dtype).min
        self.keys = F.pad(self.keys, (left, right))
        self.values = F.pad(self.values, (0, 0, left, right))
        self.bias = F.pad(self.bias, (left, right), value=low)
        self.column += left

    def trim(self, slack: int = 64, rows: torch.Tensor | None = None) -> int:
        """Drop the leading columns that none of ``rows`` (default: all) sees, once there are at least ``slack``
        of them (so that a batch rows keep joining does not attend over ever more columns); return how many were
        dropped."""
        if self.rows == 0:
            return 0
        bias = self.bias[:, 0, 0, : self.column] if rows is None else self.bias[rows, 0, 0, : self.column]
        seen = (bias == 0).any(0).nonzero()
        first = int(seen[0]) if len(seen) else self.column
        if first < slack:
            return 0
        self.keys = self.keys[..., first:].contiguous()
        self.values = self.values[:, :, :, first:].contiguous()
        self.bias = self.bias[..., first:].contiguous()
        self.column -= first
        return first

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices into the current batch), in that order."""
        self.keys = self.keys.index_select(1, rows)
        self.values = self.values.index_select(1, rows)
        self.bias = self.bias.index_select(0, rows)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits [batch, vocab] (model dtype) of the next token after ``tokens`` [batch] at
        ``positions`` [batch]; the tokens' keys and values enter the cache.

        The per-layer work is kept to about 25 tensor ops, since at small batch each op's dispatch costs
        as much as its arithmetic: the queries and keys rotate together (one ``roll`` against a sine
        with the first half negated, instead of slicing, negating and concatenating: the same products and
        sums, so the same values); the softmax scale rides on the queries' rotary factors when it is a
        power of two (exact); norms are ``F.rms_norm`` (llama's RMSNorm in one call in float32, three in bfloat16, bitwise);
        and the cache's per-layer views are taken once per step."""
        col = self.column
        self.bias[:, :, :, col] = 0.0
        bias = self.bias[:, :, :, : col + 1]
        model = self.model.model
        x = model.embed_tokens(tokens)  # [batch, hidden]
        cos, sin = model.rotary_emb(x, positions[:, None])  # [batch, 1, head dim]
        batch, hd, kvh, heads = len(tokens), self.head_dim, self.kv_heads, self.heads
        groups = heads // kvh
        half = hd // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        scale_scores = self._scale_in_rotary is None
        if not scale_scores:  # q x (cos s) + roll(q) x (sin s) == (q x cos + roll(q) x sin) x s, s = 2^k
            s = self.scaling
            cos = torch.cat((cos.expand(batch, heads, hd) * s, cos.expand(batch, kvh, hd)), dim=1)
            sin = torch.cat((sin.expand(batch, heads, hd) * s, sin.expand(batch, kvh, hd)), dim=1)
        key_cols = self.keys[:, :, :, :, col].unbind(0)  # per layer [batch, kv heads, head dim]
        value_cols = self.values[:, :, :, col].unbind(0)
        key_views = self.keys[:, :, :, :, : col + 1].unbind(0)  # per layer [batch, kv heads, head dim, length]
        value_views = self.values[:, :, :, : col + 1].unbind(0)  # per layer [batch, kv heads, length, head dim]
        q_size, qk_heads = heads * hd, heads + kvh
        for i, (norms, (qkv_proj, o_proj, gate_up_proj, down_proj)) in enumerate(
            zip(self._norms, self._fused, strict=True)
        ):
            (w_in, eps_in, w_post, eps_post), act = norms
            h = _rms_norm(x, w_in, eps_in)
            qk, v = qkv_proj(h).view(batch, qk_heads + kvh, hd).split((qk_heads, kvh), dim=1)
            qk = qk * cos + torch.roll(qk, half, dims=-1) * sin
            q, k = qk.split((heads, kvh), dim=1)
            key_cols[i].copy_(k)
            value_cols[i].copy_(v)
            scores = torch.matmul(q.view(batch, kvh, groups, hd), key_views[i])
            if scale_scores:
                scores = scores * self.scaling
            probs = torch.softmax(scores + bias, dim=-1, dtype=torch.float32).to(q.dtype)
            x = x + o_proj(torch.matmul(probs, value_views[i]).view(batch, q_size))
            h = _rms_norm(x, w_post, eps_post)
            gate, up = gate_up_proj(h).chunk(2, dim=-1)
            x = x + down_proj(act(gate) * up)
        self.column = col + 1
        return self._head(_rms_norm(x, model.norm.weight, model.norm.variance_epsilon))  # type: ignore[misc]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm in one or three ops, bitwise: normalised in float32, cast back to the input's dtype,
    then scaled by the weight in that dtype (``F.rms_norm`` with the weight would scale before the cast)."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    return weight * F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype)


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

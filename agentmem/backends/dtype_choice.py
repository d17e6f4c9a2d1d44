"""``--dtype auto``: the weights dtype that generates faster on this CPU, chosen by a quick measurement.

bf16 is only worth measuring where the CPU multiplies bf16 natively (``avx512_bf16`` or ``amx_bf16`` in
``/proc/cpuinfo``): on an AVX2-only CPU every bf16 matmul converts to fp32 inside the kernel and
measured 0.07-0.22x fp32 (``bench/dtype.py``), so there the choice is float32 without measuring. With
native bf16, one prefill of 4 x 128 tokens and 8 decode steps at batch 8 run in both dtypes through the
backend's own path, and the faster total wins. fp32 stays the choice on a tie (within 5%): its sampler
log-probs equal the fp32 training recompute, bf16's differ by about 0.03.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from agentmem.backends.transformers_backend import TransformersBackend
from agentmem.backends.types import SamplingParams

BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class DTypeChoice:
    dtype: str  # "float32" or "bfloat16"
    reason: str  # one line for people: what was measured


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The feature flags of the first CPU in ``/proc/cpuinfo`` (empty where there is none)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.exists() else ""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def native_bf16(flags: set[str]) -> bool:
    return any(f in flags for f in BF16_FLAGS)


def unmeasured_choice(flags: set[str] | None = None) -> DTypeChoice | None:
    """float32 where the CPU has no native bf16 (nothing to measure, so no model needs to load), else None."""
    flags = cpu_flags() if flags is None else flags
    return None if native_bf16(flags) else DTypeChoice("float32", "no native bf16 (avx512_bf16/amx_bf16) on this CPU")


def choose_dtype(model: PreTrainedModel, flags: set[str] | None = None, repeats: int = 2) -> DTypeChoice:
    """float32 or bfloat16 for generating with ``model`` (any dtype; measured on a copy) on the CPU."""
    flags = cpu_flags() if flags is None else flags
    if model.device.type != "cpu":
        return DTypeChoice("float32", f"device {model.device.type}: not measured")
    if (choice := unmeasured_choice(flags)) is not None:
        return choice
    seconds = {d: _generation_seconds(model, d, repeats) for d in ("float32", "bfloat16")}
    faster = "bfloat16" if seconds["bfloat16"] < 0.95 * seconds["float32"] else "float32"
    what = ", ".join(f"{d} {s * 1000:.0f} ms" for d, s in seconds.items())
    return DTypeChoice(faster, f"native bf16; prefill 4x128 + 8 decode steps at batch 8: {what}")


def _generation_seconds(model: PreTrainedModel, dtype: str, repeats: int) -> float:
    same = model.dtype == getattr(torch, dtype)
    candidate = model if same else copy.deepcopy(model).to(getattr(torch, dtype))
    backend = TransformersBackend.from_model(candidate, _NoTokenizer(), share_prefix=False)  # type: ignore[arg-type]
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prefill = torch.randint(0, vocab, (4, 128), generator=gen).tolist()
    decode = torch.randint(0, vocab, (8, 16), generator=gen).tolist()
    params = SamplingParams(temperature=0, max_new_tokens=9)
    backend.generate(decode, params)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        backend.generate(prefill, SamplingParams(temperature=0, max_new_tokens=1))
        backend.generate(decode, params)
        best = min(best, time.perf_counter() - t0)
    return best


class _NoTokenizer:
    """The backend needs a tokenizer only for its eos and pad ids; the measurement decodes to the end."""

    eos_token_id = -1
    pad_token_id = 0


"""Packed vs padded teacher scoring and training steps (bench/gpu.py's speed part).

A step is ``calls`` memory-agent calls. ``padded``: arrival order, micro-batches right-padded to their
longest call with as many calls as fit ``row_tokens`` slots (at least one), the model's SDPA with a 2-D
padding mask. ``packed-KERNEL``: the calls packed into rows of ``row_tokens`` (one micro-batch each), the
fast path with that attention kernel. Every method computes logits at the action positions only, the loss
is the mean action log-prob, training adds backward and one AdamW step. Each method runs once untimed
(FlexAttention compiles its shape buckets there), then ``reps`` times; the fastest counts. MFU: the
useful FLOPs (real tokens only: 2 x matmul params per token, causal attention per call, the head at the
actions; x3 with backward) over the time, against the card's dense bf16 peak.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from agentmem.replay import Sequence
from agentmem.training.collate import collate_rows
from agentmem.training.forward import plan
from agentmem.training.packed_attention import Kernel, action_logits, attention_kernel
from bench.common.shapes import matmul_params


def padded_batches(seqs: list[Sequence], row_tokens: int) -> list[list[Sequence]]:
    """Arrival order; a micro-batch grows while its calls x its longest call fit ``row_tokens``."""
    out: list[list[Sequence]] = []
    for s in seqs:
        if out and (len(out[-1]) + 1) * max(len(s), *(len(t) for t in out[-1])) <= row_tokens:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def padded_tensors(batch: list[Sequence], device: str) -> tuple[torch.Tensor, ...]:
    width = max(len(s) for s in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    keep = torch.zeros(len(batch), width, dtype=torch.long)
    acts = torch.zeros(len(batch), width, dtype=torch.bool)
    for b, s in enumerate(batch):
        ids[b, : len(s)] = torch.from_numpy(s.input_ids.astype(np.int64))
        keep[b, : len(s)] = 1
        acts[b, : len(s)] = torch.from_numpy(s.action_mask)
    targets = torch.from_numpy(np.concatenate([s.action_ids for s in batch]).astype(np.int64))
    return ids.to(device), keep.to(device), acts.to(device), targets.to(device)


def flops(model: torch.nn.Module, seqs: list[Sequence], train: bool) -> float:
    cfg = model.config
    q_dim = cfg.num_attention_heads * (getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    lengths = np.array([len(s) for s in seqs], dtype=np.float64)
    actions = sum(s.num_actions for s in seqs)
    forward = (2 * matmul_params(model) * lengths.sum() + 2 * cfg.num_hidden_layers * q_dim * (lengths ** 2).sum()
               + 2 * cfg.hidden_size * cfg.vocab_size * actions)
    return forward * (3 if train else 1)


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return -logits.float().log_softmax(-1).gather(-1, targets[:, None]).mean()


def method_step(model, seqs: list[Sequence], method: str, row_tokens: int, device: str,
                train: bool, optimizer) -> Callable[[], None]:
    """The step of ``method`` (``padded`` or ``packed-KERNEL``), its inputs prepared on ``device``."""
    if method == "padded":
        micro = [padded_tensors(b, device) for b in padded_batches(seqs, row_tokens)]

        def forward(unit):
            ids, keep, acts, targets = unit
            hidden = model.get_decoder()(input_ids=ids, attention_mask=keep, use_cache=False).last_hidden_state
            return model.get_output_embeddings()(hidden[acts]), targets
    else:
        kernel: Kernel = method.removeprefix("packed-")  # type: ignore[assignment]
        micro = [collate_rows(rows, pad_id=0).to(device) for rows in plan(seqs, row_tokens).batches]

        def forward(unit):
            with attention_kernel(kernel):
                return action_logits(model, unit, "fast"), unit.action_ids

    def step() -> None:
        with torch.inference_mode(not train):
            for unit in micro:
                loss = _loss(*forward(unit))
                if train:
                    loss.backward()
        if train:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(step: Callable[[], None], device: str, reps: int) -> tuple[float, float | None]:
    """(fastest wall seconds of ``reps`` runs after one untimed run, peak GiB allocated on CUDA)."""
    step()
    _sync(device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        step()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None
    return best, peak


def measure(model, seqs: list[Sequence], methods: list[str], row_tokens: int, device: str, train: bool,
            reps: int, peak_flops: float | None, optimizer, log: Callable[[str], None],
            time_left: Callable[[], float]) -> list[dict]:
    """One row per method: tokens/s, peak memory, MFU (``peak_flops`` None: not reported)."""
    tokens = sum(len(s) for s in seqs)
    work = flops(model, seqs, train)
    rows = []
    for method in methods:
        if time_left() <= 0:
            log(f"  {method}: skipped (out of time)")
            continue
        try:
            seconds, peak = timed(method_step(model, seqs, method, row_tokens, device, train, optimizer), device, reps)
        except torch.OutOfMemoryError as err:
            rows.append({"method": method, "error": f"out of memory: {str(err)[:200]}"})
            log(f"  {method}: out of memory")
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            continue
        row = {"method": method, "seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
               "peak_gib": peak, "mfu": work / seconds / peak_flops if peak_flops else None}
        rows.append(row)
        mfu = f"{row['mfu']:.3f}" if row["mfu"] is not None else "n/a"
        peak_s = f"{peak:.1f} GiB" if peak is not None else "n/a"
        log(f"  {method:<13} {seconds:8.3f} s  {row['tokens_per_s']:10.0f} tokens/s  peak {peak_s}  mfu {mfu}")
    return rows

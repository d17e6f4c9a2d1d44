"""The one pack -> collate -> forward path shared by scoring, distillation and every teacher.

``plan`` packs rebuilt sequences into batches of rows (``replay.pack``: whole sequences, positions
restarting per segment, over-budget handling named explicitly; with ``Packing.shared_prefix`` the
calls of one ``Sequence.group`` share their common prompt prefix, placed and computed once); a
``PackedModel`` collates rows onto its device and returns logits at the action positions only, per
invocation, cut to the tokenizer's vocabulary. Scoring, the online teacher, the frozen anchor reference
and the student's training forward all go through ``PackedModel.action_logits``, so a packed row means
the same thing everywhere.

Several processes (``PackedModel.for_training`` with a runtime of world size > 1): the packed forward is
one module, ``ActionLogits`` (batch -> logits at the actions), and that module is what DDP (or FSDP2 with
``runtime.fsdp``) wraps, so every training forward runs through the wrapper and its gradient
hooks. The wrapper *sums* the processes' gradients (DDP: a summing communication hook; FSDP2: divide
factor 1 on NCCL, the average times ``grad_scale`` = world size on gloo): each process's loss is already its share of the global step loss (``objective``), so the
summed gradient is the one-process gradient of the same step. Gradients are reduced once per step, on
the last micro-batch (``micro_batch(last=...)``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentmem.config import AttentionPath, Packing
from agentmem.replay import OverBudget, PackingStats, Row, pack
from agentmem.replay import Sequence as Rebuilt
from agentmem.runtime import CPU, Runtime
from agentmem.training.collate import PackedBatch, collate_rows
from agentmem.training.lora import base_model
from agentmem.training.packed_attention import action_logits
from agentmem.training.vocab import vocab_size


@dataclass(frozen=True)
class RowBatches:
    """Packed rows grouped ``rows_per_batch`` at a time (one forward pass each), and the packing stats."""

    batches: list[list[Row]]
    stats: PackingStats

    @property
    def rows(self) -> list[Row]:
        return [r for b in self.batches for r in b]


def plan(sequences: Sequence[Rebuilt], row_tokens: int, rows_per_batch: int = 1,
         over_budget: OverBudget = "error", packing: Packing = Packing.segments) -> RowBatches:
    rows, stats = pack(sequences, row_tokens, over_budget=over_budget,
                       shared_prefix=Packing(packing) is Packing.shared_prefix)
    return RowBatches([rows[i : i + rows_per_batch] for i in range(0, len(rows), rows_per_batch)], stats)


def split_actions(batch: PackedBatch, values: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """Split a tensor with one leading entry per action into per-invocation slices."""
    return zip(batch.invocation_ids, torch.split(values, list(batch.action_counts)), strict=True)


class ActionLogits(torch.nn.Module):
    """The packed forward as one module: ``forward(batch)`` is ``action_logits`` of ``model`` (logits at the
    batch's actions, in the model's dtype). DDP and FSDP2 wrap this module, so their hooks see the forward
    (calling the decoder and the head directly would bypass them)."""

    def __init__(self, model: PreTrainedModel, path: AttentionPath, mixed_precision: bool = False):
        super().__init__()
        self.model, self.path, self.mixed_precision = model, AttentionPath(path), mixed_precision

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        return action_logits(self.model, batch, self.path.value, self.mixed_precision)


@dataclass(frozen=True)
class PackedModel:
    """A causal LM with what it takes to run packed rows: its vocabulary (logits are cut to it, dropping
    rows of an embedding padded past the tokenizer), its pad id, the attention path and the device every
    batch is moved to. ``module``: what the forward calls (``ActionLogits`` of ``model``, wrapped by DDP or
    FSDP2 when training over several processes)."""

    model: PreTrainedModel
    vocab: int
    pad_id: int
    path: AttentionPath = AttentionPath.fast
    device: str = "cpu"
    # None only until __post_init__ sets it (ActionLogits of ``model``)
    module: torch.nn.Module = field(default=None, repr=False, compare=False)
    wrapper: str | None = None  # "ddp" or "fsdp" when ``module`` is wrapped for several processes
    # what the loss is multiplied by before backward: the world size under FSDP2 on gloo, which averages the
    # processes' gradients (gloo has no pre-multiplied sum, so the divide factor cannot be set to 1)
    grad_scale: float = 1.0
    # the decoder under bfloat16 autocast, the head in the weights' dtype (``packed_attention.action_logits``)
    mixed_precision: bool = False

    def __post_init__(self):
        if self.module is None:
            object.__setattr__(self, "module", ActionLogits(self.model, self.path, self.mixed_precision))

    @classmethod
    def create(cls, model: PreTrainedModel | torch.nn.Module, tokenizer: PreTrainedTokenizerBase,
               path: AttentionPath | str = AttentionPath.fast, runtime: Runtime = CPU,
               mixed_precision: bool = False) -> PackedModel:
        """``model``: a transformers model, or one wrapped with LoRA adapters (peft), of which the packed
        forward runs the transformers model inside: the adapters are injected into it, so they apply.
        ``mixed_precision``: the decoder in bfloat16 autocast (``packed_attention.action_logits``)."""
        model = base_model(model)
        return cls(model, vocab_size(model, tokenizer), tokenizer.pad_token_id or 0, AttentionPath(path),
                   runtime.device, mixed_precision=mixed_precision)

    @classmethod
    def for_training(cls, model: PreTrainedModel | torch.nn.Module, tokenizer: PreTrainedTokenizerBase,
                     path: AttentionPath | str = AttentionPath.fast, runtime: Runtime = CPU,
                     mixed_precision: bool = False) -> PackedModel:
        """``create``, with the forward wrapped for several processes: DDP (summing gradients), or FSDP2
        with ``runtime.fsdp`` (the student's parameters become sharded). One process: unwrapped."""
        plain = cls.create(model, tokenizer, path, runtime, mixed_precision)
        if runtime.world_size == 1:
            return plain
        runtime.require_group()
        summed_by_hook = runtime.device.startswith("cuda")
        wrapped = _fsdp(plain.module, summed_by_hook) if runtime.fsdp else _ddp(plain.module)
        scale = float(runtime.world_size) if runtime.fsdp and not summed_by_hook else 1.0
        return cls(plain.model, plain.vocab, plain.pad_id, plain.path, plain.device, wrapped,
                   "fsdp" if runtime.fsdp else "ddp", scale, mixed_precision)

    def micro_batch(self, last: bool):
        """Context of one micro-batch's forward and backward: gradients are reduced over the processes on
        the ``last`` one only (earlier ones accumulate locally)."""
        if self.wrapper == "fsdp":
            self.module.set_requires_gradient_sync(last)
        if self.wrapper == "ddp" and not last:
            return self.module.no_sync()
        return contextlib.nullcontext()

    def collate(self, rows: Sequence[Row]) -> PackedBatch:
        return collate_rows(rows, self.pad_id).to(self.device)

    def action_logits(self, batch: PackedBatch) -> torch.Tensor:
        """Float32 logits ``[A, vocab]`` at the batch's actions, in ``batch.action_ids`` order (gradient as
        the caller's mode allows)."""
        return self.module(batch)[:, : self.vocab].float()

    def empty_batch(self) -> PackedBatch:
        """One pad token and no action: a process with no row this step runs it, so that it still takes
        part in the step's gradient reduction (adding zero)."""
        z = torch.zeros(1, 1, dtype=torch.long)
        return PackedBatch(input_ids=z + self.pad_id, position_ids=z, token_mask=z == 0, action_mask=z != 0,
                           segment_ids=z, cu_seqlens=torch.tensor([0, 1], dtype=torch.int32),
                           seq_lens=torch.tensor([1], dtype=torch.int32), max_seqlen=1,
                           action_ids=torch.zeros(0, dtype=torch.long),
                           sampler_logprobs=torch.zeros(0, dtype=torch.float32), invocation_ids=(),
                           action_counts=()).to(self.device)

    def logits_by_invocation(self, batches: Sequence[Sequence[Row]]) -> dict[str, torch.Tensor]:
        """Without gradient: ``{invocation id: [O, vocab]}`` float32 logits, one forward pass per batch."""
        out: dict[str, torch.Tensor] = {}
        with torch.inference_mode():
            for rows in batches:
                batch = self.collate(rows)
                out.update((k, v.clone()) for k, v in split_actions(batch, self.action_logits(batch)))
        return out


def _sum_gradients(group, bucket):
    """DDP communication hook: the processes' gradients summed (DDP's default divides by the world size)."""
    import torch.distributed as dist

    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def _ddp(module: ActionLogits) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(module)
    ddp.register_comm_hook(None, _sum_gradients)
    return ddp


def _fsdp(module: ActionLogits, sum_gradients: bool) -> torch.nn.Module:
    """FSDP2: each decoder layer sharded on its own, the rest (embeddings, final norm, head) with the root.
    ``sum_gradients`` (NCCL): divide factor 1, so the reduction sums; on gloo (no pre-multiplied sum) it
    averages and ``PackedModel.grad_scale`` multiplies the loss by the world size instead. Tested with gloo on
    CPU (equal to one process, save and resume); NCCL on CUDA not yet run here."""
    from torch.distributed.fsdp import fully_shard

    for layer in module.model.get_decoder().layers:
        fully_shard(layer)
    fully_shard(module)
    if sum_gradients:
        module.set_gradient_divide_factor(1.0)
    return module

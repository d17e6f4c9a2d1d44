"""The sft job (``agentmem sft``): supervised fine-tuning on stored calls.

SFT is distillation with one loss term: cross-entropy on the action tokens (the stored outputs) given the
stored prompt, and nothing at the prompt positions. It runs the distill ``Trainer`` on the same rebuild ->
pack -> forward path, with ``SftConfig.distill_config()`` (cross-entropy weight 1, no teacher, no RL), on
the calls ``select`` keeps: those of the given runs (oracle runs, a teacher's runs, or the student's own),
of the given kinds, of episodes with ``f1 >= min_f1`` when given. Its runs are of kind ``sft``.

Order of work, as in distill: the config, the run ids, the selection and the student reference are
checked before any weights load; then the run is opened, the student loads, and each step's metrics go to
``train_steps``. Checkpoints are plain model folders registered in ``checkpoints`` with their parent.

LoRA (``lora_rank``): adapters are trained on the starting weights and merged into each saved checkpoint;
the adapters and their optimizer state go into the checkpoint's trainer state. ``--resume`` re-wraps the
starting weights, reloads the adapters and the optimizer: the same model and state as the uninterrupted
run, so the next steps are the same (exact resume; the starting model must still be where it was).
Without LoRA, resume reloads the checkpoint's weights and optimizer, as distill does.

Disk: a checkpoint is the model in the dtype it trained in (538 MB for the default model in float32); only the
run's latest checkpoint keeps the optimizer state (twice that) while the job runs, and the finished run's last one
only with ``keep_optimizer`` (``--resume --steps N`` past a finished run, or a later ``--carry-optimizer``, needs
it). ``keep_last`` deletes all but the last N checkpoint folders.

Several processes (torchrun): as in distill, each rank trains on its share of each step and rank 0 alone
writes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agentmem import model_refs
from agentmem.config import SftConfig
from agentmem.errors import ConfigError
from agentmem.jobs.training_shell import DistillResult, prepare, register_start, train
from agentmem.model_refs import ModelRef
from agentmem.records import Checkpoint, RunKind, TrainStep
from agentmem.runtime import CPU, Runtime
from agentmem.tracking import TrackerKind, check_installed
from store.engine import Store

if TYPE_CHECKING:  # torch loads inside the job, after its ids and flags are checked (a fast error)
    from agentmem.training.trainer import Models


def load_student(store: Store, config: SftConfig, runtime: Runtime, ref: ModelRef,
                 resume_from: Checkpoint | None = None) -> Models:
    """The trainable student on the runtime's device: with LoRA, the starting weights wrapped with
    adapters (restored from ``resume_from``); without, the starting or the resumed weights. With
    ``anchor_weight``, also a frozen copy of the starting weights (the anchor's reference)."""
    from agentmem.training import lora
    from agentmem.training.checkpoints import load_adapters
    from agentmem.training.trainer import Models

    start = register_start(store, ref, runtime)
    reference = model_refs.load(ref.path, config.dtype, runtime)[0] if config.anchor_weight else None
    if config.lora_rank is None:
        model, tokenizer = model_refs.load(resume_from.path if resume_from else ref.path, config.dtype, runtime,
                                           trainable=True)
        return Models(model, tokenizer, start, reference=reference)
    base, tokenizer = model_refs.load(ref.path, config.dtype, runtime, trainable=True)
    model = lora.wrap(base, config.lora_rank, config.lora_alpha, config.lora_dropout, config.lora_targets,
                      config.seed, base_ref=ref.adapter_base)
    if resume_from is not None:
        load_adapters(Path(resume_from.path), model)
    return Models(model, tokenizer, start, reference=reference)


def run_sft(
    store: Store,
    config: SftConfig | None,
    runtime: Runtime = CPU,
    *,
    resume: str | None = None,
    steps: int | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_step: Callable[[TrainStep], None] | None = None,
    report_to: Sequence[TrackerKind] = (),
) -> DistillResult:
    """Train for ``config.optim.steps`` steps, or with ``resume`` (an sft run id; ``config`` may be None)
    continue a stored run from its last checkpoint, up to ``steps`` when given. ``report_to``: trackers that
    also log each step (``agentmem.tracking``), under ``<config.out>/<run id>``."""
    config, resumed = prepare(store, RunKind.sft, SftConfig, config, resume, steps)
    from agentmem.training.selection import select

    # before any weights load: an empty filter or a bad student reference fails here
    selection = select(store, config.run_ids, kinds=config.kinds, min_f1=config.min_f1)
    ref = model_refs.resolve(store, config.student)
    check_installed(report_to)
    if runtime.fsdp and config.lora_rank is not None:
        raise ConfigError("--fsdp with --lora-rank is not supported: train LoRA with DDP (leave out --fsdp)")
    return train(store, RunKind.sft, config, runtime, resumed,
                 lambda: load_student(store, config, runtime, ref, resumed.checkpoint), config.distill_config(),
                 selection=selection, carry_optimizer=config.optim.carry_optimizer,
                 carry_first_moment=config.optim.carry_first_moment, student_context=config.context,
                 on_start=on_start, on_step=on_step, report_to=report_to, keep_last=config.keep_last,
                 keep_optimizer=config.keep_optimizer)

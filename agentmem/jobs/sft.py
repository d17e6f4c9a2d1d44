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

Several processes (torchrun): as in distill, each rank trains on its share of each step and rank 0 alone
writes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agentmem import models as model_refs
from agentmem.agent.registry import check_kinds
from agentmem.config import SftConfig
from agentmem.errors import ConfigError
from agentmem.jobs.distill import DistillResult, register_start, train_steps
from agentmem.jobs.runs import check_runs, job_run, load_run
from agentmem.models import ModelRef
from agentmem.records import Checkpoint, RunKind, TrainStep
from agentmem.runtime import CPU, Runtime
from agentmem.tracking import TrackerKind, check_installed, reporting, run_folder
from store import repository as repo
from store.engine import Store

if TYPE_CHECKING:  # torch loads inside the job, after its ids and flags are checked (a fast error)
    from agentmem.training.distill import Models


def load_sft_run(store: Store, run_id: str) -> tuple[str, SftConfig, Checkpoint | None]:
    """(full run id, stored config, latest checkpoint or None) of an sft run."""
    run = load_run(store, run_id, RunKind.sft)
    with store.session() as s:
        ckpts = repo.list_checkpoints(s, run.id)
    return run.id, SftConfig.model_validate(run.config), (ckpts[-1] if ckpts else None)


def load_student(store: Store, config: SftConfig, runtime: Runtime, ref: ModelRef,
                 resume_from: Checkpoint | None = None) -> Models:
    """The trainable student on the runtime's device: with LoRA, the starting weights wrapped with
    adapters (restored from ``resume_from``); without, the starting or the resumed weights. With
    ``anchor_weight``, also a frozen copy of the starting weights (the anchor's reference)."""
    from agentmem.training import lora
    from agentmem.training.checkpoints import load_adapters
    from agentmem.training.distill import Models

    start = register_start(store, ref, runtime)
    reference = model_refs.load(ref.path, config.dtype, runtime)[0] if config.anchor_weight else None
    if config.lora_rank is None:
        model, tokenizer = model_refs.load(resume_from.path if resume_from else ref.path, config.dtype, runtime,
                                           trainable=True)
        return Models(model, tokenizer, start, reference=reference)
    base, tokenizer = model_refs.load(ref.path, config.dtype, runtime, trainable=True)
    model = lora.wrap(base, config.lora_rank, config.lora_alpha, config.lora_dropout, config.lora_targets,
                      config.seed)
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
    """Train for ``config.steps`` steps, or with ``resume`` (an sft run id; ``config`` may be None)
    continue a stored run from its last checkpoint, up to ``steps`` when given. ``report_to``: trackers that
    also log each step (``agentmem.tracking``), under ``<config.out>/<run id>``."""
    resumed, resume_from = None, None
    if resume is not None:
        resumed, stored, resume_from = load_sft_run(store, resume)
        config = stored if steps is None else stored.model_copy(update={"steps": steps})
    if config is None:
        raise ConfigError("run_sft needs a config or a run to resume")
    config = config.model_copy(update={"run_ids": check_runs(store, config.run_ids)})
    check_kinds(config.kinds)
    from agentmem.training.checkpoints import load_trainer_state
    from agentmem.training.distill import Trainer
    from agentmem.training.selection import select

    # before any weights load: an empty filter or a bad student reference fails here
    selection = select(store, config.run_ids, kinds=config.kinds, min_f1=config.min_f1)
    ref = model_refs.resolve(store, config.student)
    check_installed(report_to)
    if runtime.fsdp and config.lora_rank is not None:
        raise ConfigError("--fsdp with --lora-rank is not supported: train LoRA with DDP (leave out --fsdp)")
    report_to = report_to if runtime.is_main else ()
    with job_run(store, RunKind.sft, config, runtime, resume=resumed) as run:
        models = load_student(store, config, runtime, ref, resume_from)
        trainer = Trainer(store, config.distill_config(), models, run.id, runtime, selection=selection)
        done, parent = 0, models.student_checkpoint
        if resume_from is not None:
            done, parent = load_trainer_state(Path(resume_from.path), trainer.optimizer, models.student), resume_from
        if on_start:
            on_start(config.steps, done)
        with reporting(report_to, run_folder(config.out, run.id), run.id, config.model_dump(mode="json")) as report:
            history, last = train_steps(store, run, trainer, config.steps, config.save_every, done, parent, on_step,
                                        report)
    return DistillResult(run.id, config.steps, last or resume_from, history)

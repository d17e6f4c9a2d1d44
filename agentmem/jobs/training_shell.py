"""The shell the training jobs (``agentmem distill``, ``agentmem sft``) share around the ``Trainer``.

A job calls ``prepare`` (the config it runs with: the stored one when it resumes, its run ids checked,
its call kinds checked), makes its own checks, then ``train``: the run is opened (``job_run``), the job's
models load, the ``Trainer`` is built, its state restored from the checkpoint it resumes from, and
``train_steps`` runs the steps left, each stored in ``train_steps`` as it finishes.

Resume: a checkpoint keeps the step count, the optimizer and the objective's state (``Trainer.save``);
``--resume`` continues from the run's last checkpoint and draws exactly the steps an uninterrupted run
would have drawn. A job that asks for it (distill's ``carry_optimizer``) starts a new run with the
optimizer state its starting checkpoint kept, at step 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pydantic import ValidationError

from agentmem import model_refs
from agentmem.agent.registry import check_kinds
from agentmem.config import DistillConfig, SftConfig
from agentmem.errors import ConfigError, RunError
from agentmem.jobs.runs import RunHandle, check_runs, job_run, load_run
from agentmem.model_refs import ModelRef
from agentmem.records import Checkpoint, RunKind, SamplingContext, TrainStep
from agentmem.runtime import Runtime
from agentmem.tracking import TrackerKind, reporting, run_folder
from store import repository as repo
from store.engine import Store

if TYPE_CHECKING:  # torch loads inside the job, after its ids and flags are checked (a fast error)
    from agentmem.training.selection import Selection
    from agentmem.training.trainer import Models, Trainer

JobConfig = TypeVar("JobConfig", DistillConfig, SftConfig)


@dataclass(frozen=True)
class DistillResult:
    run_id: str
    steps_done: int
    last_checkpoint: Checkpoint | None
    history: list[TrainStep]

    def _total(self, key: str) -> int:
        return int(sum(s.metrics.get(key, 0.0) for s in self.history))

    @property
    def skipped_calls(self) -> int:
        """Calls left out because they exceed the row budget (``oversize=skip``), over the steps run."""
        return self._total("skipped_calls")

    @property
    def teacher_truncated_calls(self) -> int:
        return self._total("teacher_truncated_calls")


@dataclass(frozen=True)
class Resumed:
    """What a job continues: the run it takes over and that run's last checkpoint (None, None: a new run;
    a run id with no checkpoint: a run killed before its first save, started again from step 0)."""

    run_id: str | None = None
    checkpoint: Checkpoint | None = None


def load_train_run(store: Store, run_id: str, kind: RunKind,
                   model: type[JobConfig]) -> tuple[str, JobConfig, Checkpoint | None]:
    """(full run id, stored config read through ``model``, latest checkpoint or None) of a ``kind`` run."""
    run = load_run(store, run_id, kind)
    with store.session() as s:
        ckpts = repo.list_checkpoints(s, run.id)
    try:
        config = model.model_validate(run.config)
    except ValidationError as err:  # a run stored by another version
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "config"
        raise RunError(f"run {run.id}: its stored config does not read in this version ({where}: {first['msg']}): "
                       f"start a new {kind.value} run") from None
    return run.id, config, (ckpts[-1] if ckpts else None)


def prepare(store: Store, kind: RunKind, model: type[JobConfig], config: JobConfig | None, resume: str | None,
            steps: int | None) -> tuple[JobConfig, Resumed]:
    """The config a ``kind`` job runs with and what it resumes: ``config``, or with ``resume`` (a run id)
    the run's stored config (up to ``steps`` when given); its run ids resolved to full ids, its kinds
    checked against the policy registry. Raises before any weights load."""
    resumed = Resumed()
    if resume is not None:
        run_id, stored, checkpoint = load_train_run(store, resume, kind, model)
        resumed = Resumed(run_id, checkpoint)
        config = stored if steps is None else with_steps(stored, steps)
    if config is None:
        raise ConfigError(f"run_{kind.value} needs a config or a run to resume")
    config = config.model_copy(update={"run_ids": check_runs(store, config.run_ids)})
    check_kinds(config.kinds)
    with store.session() as s:  # rows it could not read or train on: one line naming them, before any run opens
        repo.check_stored_rows(s, config.run_ids)
    return config, resumed


def with_steps(config: JobConfig, steps: int) -> JobConfig:
    """``config`` run for ``steps`` steps in all."""
    return config.model_copy(update={"optim": config.optim.model_copy(update={"steps": steps})})


def register_start(store: Store, ref: ModelRef, runtime: Runtime) -> Checkpoint:
    """The starting model's checkpoint row: registered by rank 0, handed to the other ranks."""
    return runtime.broadcast(model_refs.register(store, ref) if runtime.is_main else None)


def train(
    store: Store,
    kind: RunKind,
    config: JobConfig,
    runtime: Runtime,
    resumed: Resumed,
    load: Callable[[], Models],
    trainer_config: DistillConfig,
    *,
    selection: Selection | None = None,
    carry_optimizer: bool = False,
    carry_first_moment: bool = True,
    student_context: SamplingContext = SamplingContext.aligned,
    on_start: Callable[[int, int], None] | None = None,
    on_step: Callable[[TrainStep], None] | None = None,
    report_to: Sequence[TrackerKind] = (),
    keep_last: int | None = None,
    keep_optimizer: bool = False,
) -> DistillResult:
    """Open the ``kind`` run (``resumed.run_id``'s, or a new one storing ``config``), ``load`` the models,
    build a ``Trainer`` on ``trainer_config`` (and ``selection``: the calls, when the job chose them), restore
    its state from ``resumed.checkpoint`` (``load`` must give the student with its weights), and run steps
    ``done + 1 .. trainer_config.optim.steps``. ``carry_optimizer``: a new run takes the optimizer state its starting
    checkpoint kept, when it kept a full-parameter one (``carry_trainer_state``), its first moment zeroed unless
    ``carry_first_moment``. ``student_context``: the
    prompt the student trains under (``SftConfig.context``). ``on_start(steps, done)`` and ``on_step`` report progress;
    ``report_to`` are trackers (rank 0 only), under ``<config.out>/<run id>``. ``keep_last`` and ``keep_optimizer``:
    what the run's checkpoints keep (``train_steps``)."""
    from agentmem.training.checkpoints import (
        carry_trainer_state,
        has_optimizer_state,
        load_objective_state,
        load_trainer_state,
    )
    from agentmem.training.trainer import Trainer

    if resumed.checkpoint is not None and not Path(resumed.checkpoint.path).is_dir():
        raise RunError(f"run {resumed.run_id}: its last checkpoint {resumed.checkpoint.id} is gone (no folder "
                       f"{resumed.checkpoint.path}), so the run cannot go on: start a new run")
    if resumed.checkpoint is not None and not has_optimizer_state(Path(resumed.checkpoint.path)):
        raise ConfigError(f"run {resumed.run_id} finished and its last checkpoint {resumed.checkpoint.id} kept no "
                          f"optimizer state (--keep-optimizer keeps it), so it cannot go on exactly: start a new "
                          f"run from the checkpoint (--student {resumed.checkpoint.id})")
    report_to = report_to if runtime.is_main else ()
    with job_run(store, kind, config, runtime, resume=resumed.run_id) as run:
        models = load()
        trainer = Trainer(store, trainer_config, models, run.id, runtime, selection=selection,
                          student_context=student_context)
        done, parent = 0, models.student_checkpoint
        if resumed.checkpoint is not None:
            folder = Path(resumed.checkpoint.path)
            done = load_trainer_state(folder, trainer.optimizer, models.student)
            trainer.objective.load_state_dict(load_objective_state(folder))
            parent = resumed.checkpoint
        elif carry_optimizer:
            carry_trainer_state(Path(models.student_checkpoint.path), trainer.optimizer, models.student,
                                first_moment=carry_first_moment)
        if on_start:
            on_start(trainer_config.optim.steps, done)
        with reporting(report_to, run_folder(config.out, run.id), run.id, config.model_dump(mode="json")) as report:
            history, saved = train_steps(store, run, trainer, trainer_config.optim.steps, config.save_every, done,
                                         parent, on_step, report, keep_last=keep_last, keep_optimizer=keep_optimizer)
    return DistillResult(run.id, trainer_config.optim.steps, saved or resumed.checkpoint, history)


def train_steps(store: Store, run: RunHandle, trainer: Trainer, steps: int, save_every: int | None, done: int,
                parent: Checkpoint, on_step: Callable[[TrainStep], None] | None = None,
                report: Callable[[TrainStep], None] | None = None, *, keep_last: int | None = None,
                keep_optimizer: bool = False) -> tuple[list[TrainStep], Checkpoint | None]:
    """Steps ``done + 1 .. steps`` of a trainer (distill's or sft's), each stored in ``train_steps`` as it
    finishes, then handed to ``report`` (experiment trackers) and ``on_step`` (progress); a checkpoint (child
    of the previous one, first of ``parent``) every ``save_every`` steps and at the end. Returns the steps run
    and the last checkpoint saved (None when none was). A handle that does not write (ranks other than 0)
    stores nothing; every rank saves (``Trainer.save`` writes on rank 0 only).

    What the checkpoints keep (``prune``): once a checkpoint is saved, the run's earlier ones lose their
    optimizer state (a resume starts from the last one), and only the last ``keep_last`` folders stay; at the
    end the last one loses it too unless ``keep_optimizer``."""
    history, last = [], None
    for step in range(done, steps):
        record = trainer.step(step)
        if run.writes:
            with store.session() as s:
                repo.insert_train_step(s, record)
                s.commit()
        run.beat()
        history.append(record)
        if report:
            report(record)
        if on_step:
            on_step(record)
        steps_done = step + 1
        if steps_done == steps or (save_every and steps_done % save_every == 0):
            last = parent = trainer.save(steps_done, parent)
            if run.writes:
                prune(store, run.id, keep_last, keep_optimizer or steps_done < steps)
    return history, last


def prune(store: Store, run_id: str, keep_last: int | None, keep_optimizer: bool) -> None:
    """After a save: the optimizer state dropped from every checkpoint of ``run_id`` but the last (from the last
    too unless ``keep_optimizer``), and the folders of all but the last ``keep_last`` deleted (their rows stay,
    so the lineage is whole; evaluating one names the missing folder)."""
    import shutil

    from agentmem.training.checkpoints import drop_optimizer_state

    with store.session() as s:
        ckpts = repo.list_checkpoints(s, run_id)
    for i, ckpt in enumerate(ckpts):
        folder = Path(ckpt.path)
        last = i == len(ckpts) - 1
        if not folder.is_dir():
            continue
        if keep_last is not None and i < len(ckpts) - keep_last:
            shutil.rmtree(folder, ignore_errors=True)
        elif not last or not keep_optimizer:
            drop_optimizer_state(folder)

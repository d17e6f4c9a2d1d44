"""The distill job (``agentmem distill``): train a student from stored calls with the ``Trainer``.

Order of work: the config, the run ids and the model references are checked first (no weights load for a
bad flag or an unknown id); then the run is opened, the models load onto the runtime's device, and each
step's metrics go to ``train_steps`` as it finishes. Checkpoints are model folders registered in
``checkpoints`` with their parent; ``--resume`` continues from the last one and draws exactly the steps an
uninterrupted run would have drawn. Disk, as in sft: a checkpoint is the model alone, but the running run's latest,
which keeps the optimizer state (twice the model) so a killed run resumes; the finished run's last one keeps it
only with ``keep_optimizer``, or when its learning-rate schedule goes on after it (a train round but the last,
whose next round carries it); ``keep_last`` deletes all but the last N checkpoint folders. The run, the restore and the steps loop are the shell it shares with
sft (``agentmem.jobs.training_shell``); this module owns distill's checks and its models.

Several processes (torchrun; ``runtime.world_size > 1``): every rank reads the store, loads the models and
the same trainer state, and trains on its share of each step; rank 0 alone writes (the run row, the
registered starting model, ``train_steps``, checkpoints, trackers), the others take the records it
writes from it (``runtime.broadcast``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from agentmem import model_refs
from agentmem.agent.registry import check_kinds
from agentmem.config import DistillConfig, EvalConfig, PolicySource, PsdMode, RolloutConfig, TeacherSourceKind
from agentmem.errors import ConfigError
from agentmem.jobs.training_shell import DistillResult, prepare, register_start, train
from agentmem.model_refs import ModelRef
from agentmem.records import Checkpoint, Run, RunKind, SamplingContext, TrainStep
from agentmem.runtime import CPU, Runtime
from agentmem.tracking import TrackerKind, check_installed
from agentmem.training.term_registry import check_loss_terms
from store import repository as repo
from store.engine import Store
from store.repository import serve as serve_repo

if TYPE_CHECKING:  # torch loads inside the job, after its ids and flags are checked (a fast error)
    from agentmem.training.trainer import Models


def resolve_models(store: Store, config: DistillConfig) -> tuple[ModelRef, ModelRef | None]:
    """The student's and the teacher's references, resolved without loading weights."""
    return (model_refs.resolve(store, config.student),
            model_refs.resolve(store, config.teacher.model) if config.teacher.model else None)


def load_models(store: Store, config: DistillConfig, runtime: Runtime = CPU,
                resume_from: Checkpoint | None = None,
                refs: tuple[ModelRef, ModelRef | None] | None = None) -> Models:
    """Student (trainable; from ``resume_from`` when resuming), frozen teacher (when the teacher source is a
    model) and frozen reference (when the anchor term is on), on the runtime's device. ``refs``: the
    references ``resolve_models`` gave (resolved here when absent)."""
    from agentmem.training.trainer import Models

    start_ref, teacher_ref = refs or resolve_models(store, config)
    start = register_start(store, start_ref, runtime)
    student, tokenizer = model_refs.load(resume_from.path if resume_from else start_ref.path, config.dtype, runtime,
                                         trainable=True)
    teacher = teacher_tok = reference = None
    if teacher_ref and config.teacher.source is TeacherSourceKind.model and config.effective_kd_weight:
        teacher, teacher_tok = model_refs.load(teacher_ref.path, config.dtype, runtime)
    if config.loss.anchor_weight or config.monitor_start_kl:
        reference, _ = model_refs.load(start_ref.path, config.dtype, runtime)
    return Models(student, tokenizer, start, teacher, teacher_tok, teacher_ref.path if teacher_ref else None,
                  reference)


def _sampled(run: Run) -> RolloutConfig | None:
    """The stored config of a rollout or evaluation run, read through its model (None for other runs)."""
    if run.kind is RunKind.rollout:
        return RolloutConfig.stored(run.config)
    if run.kind is RunKind.eval:
        return EvalConfig.stored(run.config)
    return None


def _privileged_rollout(run: Run) -> str | None:
    """For a rollout whose calls were sampled under a prompt the student does not see, that prompt ("the
    privileged prompt": PSD's off-policy samples; "the hint prompt": a hint teacher's, ``rollout --context
    hint``); None for any other run."""
    sampled = _sampled(run)
    if run.kind is not RunKind.rollout or sampled is None or sampled.context is SamplingContext.aligned:
        return None
    return f"the {sampled.context.value} prompt"


def check_rl_runs(store: Store, config: DistillConfig) -> None:
    """Refuse the RL term, before any weights load, on runs whose calls are not the student's samples with
    a reward: oracle runs (no sampler log-probs), privileged rollouts (the log-probs are the privileged
    sampler's) and replay runs (one call branched from a teacher's episode: no reward)."""
    if not config.effective_rl_weight:
        return
    fix = "the RL term cannot train on it; use rl_weight 0 / --rl none"
    with store.session() as s:
        for rid in config.run_ids:
            run = repo.get_run(s, rid)
            sampled = _sampled(run)
            if sampled is not None and sampled.policy is PolicySource.oracle:
                raise ConfigError(f"run {rid} is an oracle rollout (no sampler log-probs): {fix}, or agentmem sft")
            if (prompt := _privileged_rollout(run)) is not None:
                raise ConfigError(f"run {rid} was sampled under {prompt} (its log-probs are not the student's): "
                                  f"{fix}")
            if run.kind is RunKind.replay:
                raise ConfigError(f"run {rid} is a replay run (single calls branched from a teacher's episodes carry "
                                  f"no reward): {fix}")


def check_replayable(store: Store, config: DistillConfig) -> None:
    """Refuse, before any weights load, runs with served calls that are not replayable: a gateway stored a
    provider's text tokenized locally, without the sampler's ids or log-probs (sft trains on them)."""
    with store.session() as s:
        found = serve_repo.unreplayable_calls(s, config.run_ids)
    if found:
        rid, n = next(iter(found.items()))
        raise ConfigError(f"run {rid} has {n} calls recorded as text from a provider that returns no token ids "
                          "(tokenized locally, not replayable): distill needs the sampled ids and log-probs; "
                          "train on them with agentmem sft")


def check_psd_runs(store: Store, config: DistillConfig) -> None:
    """Refuse, before any weights load, runs that do not match ``config.teacher.psd``: ``on_policy`` trains on the
    student's own samples (no privileged rollout), ``off_policy`` only on privileged rollouts, ``mixed``
    on at least one of each."""
    if config.teacher.psd is PsdMode.none:
        return
    with store.session() as s:
        privileged = {rid: _privileged_rollout(repo.get_run(s, rid)) for rid in config.run_ids}
    names = {True: [r for r, p in privileged.items() if p], False: [r for r, p in privileged.items() if not p]}
    hint = "(`agentmem rollout --context privileged` samples under the privileged prompt)"
    if config.teacher.psd is PsdMode.on_policy and names[True]:
        raise ConfigError(f"psd=on_policy scores the student's own samples, but run {names[True][0]} was sampled "
                          f"under {privileged[names[True][0]]}: use --psd off_policy or mixed")
    if config.teacher.psd is PsdMode.off_policy and names[False]:
        raise ConfigError(f"psd=off_policy scores the privileged sampler's tokens, but run {names[False][0]} is "
                          f"not a privileged rollout {hint}")
    if config.teacher.psd is PsdMode.mixed and not (names[True] and names[False]):
        raise ConfigError("psd=mixed trains on a normal rollout and a privileged rollout together: give one of each "
                          f"with --run {hint}")


def run_distill(
    store: Store,
    config: DistillConfig | None,
    runtime: Runtime = CPU,
    *,
    resume: str | None = None,
    steps: int | None = None,
    models: Models | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_step: Callable[[TrainStep], None] | None = None,
    report_to: Sequence[TrackerKind] = (),
) -> DistillResult:
    """Train for ``config.optim.steps`` steps, or with ``resume`` (a distill run id; ``config`` may be None)
    continue a stored run from its last checkpoint, up to ``steps`` when given. ``models`` injects loaded
    models (tests); ``models.student`` must then already hold the resumed weights. ``report_to``: trackers
    that also log each step (``agentmem.tracking``), under ``<config.out>/<run id>``."""
    config, resumed = prepare(store, RunKind.distill, DistillConfig, config, resume, steps)
    check_kinds(config.teacher.aligned_kinds)
    check_loss_terms(config.loss.terms)
    check_rl_runs(store, config)
    check_psd_runs(store, config)
    check_replayable(store, config)
    check_installed(report_to)
    refs = resolve_models(store, config) if models is None else None  # before any weights load
    return train(store, RunKind.distill, config, runtime, resumed,
                 lambda: models or load_models(store, config, runtime, resumed.checkpoint, refs), config,
                 carry_optimizer=config.optim.carry_optimizer, carry_first_moment=config.optim.carry_first_moment,
                 on_start=on_start, on_step=on_step, report_to=report_to, keep_last=config.keep_last,
                 keep_optimizer=config.keep_optimizer or config.optim.schedule_goes_on)

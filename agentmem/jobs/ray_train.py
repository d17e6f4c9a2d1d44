"""A training job's data-parallel group under Ray Train: ``agentmem distill --ray`` and ``sft --ray``, and each
round's distill of ``agentmem train --ray``, run their processes as one ``TorchTrainer`` group instead of a
``torchrun`` one.

``fit`` connects to the cluster (``ray_rollout.connect``: the same address rules, checks and one-line errors as
``rollout --ray``), then starts ``placement.workers`` Ray Train workers, each with ``cpus`` CPUs and ``gpus`` GPUs.
Ray Train starts the process group (gloo without GPUs, NCCL with them) and sets torchrun's variables (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``) before each worker runs ``_worker``, which is a
torchrun rank's code: ``Runtime.create`` reads the variables and adopts the group, rank 0 opens the store read-write
and the others read-only, and the job (``run_distill``, ``run_sft``) runs the same steps. So the gradients, losses
and checkpoints are those of a torchrun group of the same size, and ``--resume RUN_ID`` is unchanged.

Rank 0 alone writes the store and the checkpoints under ``out``: with workers on several nodes, ``out`` (and the
student and teacher folders) must be on a filesystem every node shares, and the database one every node reaches
(Postgres; a SQLite file serves only workers on its own machine). Ray Train keeps nothing of its own: no Ray
checkpoint, and a failed group is not restarted (``max_failures=0``; resume the run instead). Rank 0's result
comes back through a small actor (``_Mailbox``; Ray Train keeps only the metrics of reports with a checkpoint).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from agentmem.errors import AgentmemError, ConfigError, RunError
from agentmem.jobs.ray_rollout import RAY_MISSING, Placement, connect, disconnect
from agentmem.tracking import TrackerKind


def check_device(device: str, placement: Placement) -> None:
    """A ``ConfigError`` for a CUDA ``device`` on workers that hold no GPU (Ray hides the GPUs from them)."""
    if device.startswith("cuda") and not placement.gpus:
        raise ConfigError(f"--device {device} under --ray needs GPUs on each worker: add --worker-gpus 1")


def check_installed() -> None:
    """A ``ConfigError`` unless Ray Train imports (the ``ray`` extra: ray[train], with its pandas and pyarrow)."""
    try:
        import ray.train.torch  # noqa: F401
    except ImportError:
        raise ConfigError(RAY_MISSING) from None


def fit(job: Callable[..., Any], db_url: str, placement: Placement, *, config: Any, resume: str | None = None,
        steps: int | None = None, device: str = "auto", threads: int | None = None, fsdp: bool = False,
        report_to: Sequence[TrackerKind] = ()) -> Any:
    """Run ``job`` (``run_distill`` or ``run_sft``: a module-level function, which each worker imports) with
    ``config`` or ``resume`` on a Ray Train group of ``placement.workers`` processes, and return rank 0's result.
    Raises ``ConfigError``/``RunError`` in one line: Ray missing, the cluster unreachable or short of resources
    (before anything is written), or the job failing on a worker (its own message when it is one of ours)."""
    check_device(device, placement)
    check_installed()
    started = connect(placement)
    storage = tempfile.mkdtemp(prefix="agentmem-ray-train-")  # Ray Train's own bookkeeping: nothing of ours
    import ray

    mailbox = ray.remote(_Mailbox).options(num_cpus=0).remote()
    try:
        trainer = _trainer(placement, storage, {
            "job": f"{job.__module__}:{job.__qualname__}", "db_url": db_url, "config": config, "resume": resume,
            "steps": steps, "device": device, "threads": threads, "fsdp": fsdp, "report_to": list(report_to),
            "cwd": os.getcwd(), "mailbox": mailbox})
        try:
            trainer.fit()
        except Exception as exc:  # noqa: BLE001 - Ray wraps the worker's error in its own
            raise _job_error(exc) from None
        return ray.get(mailbox.take.remote())
    finally:
        with contextlib.suppress(Exception):
            ray.kill(mailbox)
        if started:
            disconnect()
        shutil.rmtree(storage, ignore_errors=True)


def launcher(db_url: str, placement: Placement, *, device: str = "auto", threads: int | None = None,
             fsdp: bool = False) -> Callable[..., Any]:
    """A train loop's ``Launch`` (``jobs.train``): each training job on a Ray Train group (``fit``); ``on_step`` gets
    the job's steps once it has finished (the group's steps happen on the cluster)."""

    def launch(job: Callable[..., Any], store: Any, config: Any, runtime: Any, *, resume: str | None = None,
               on_step: Callable[[Any], None] | None = None, report_to: Sequence[TrackerKind] = ()) -> Any:
        result = fit(job, db_url, placement, config=config, resume=resume, device=device, threads=threads,
                     fsdp=fsdp, report_to=report_to)
        for step in result.history if on_step else ():
            on_step(step)
        return result

    return launch


class _Mailbox:
    """Holds rank 0's result until the caller takes it."""

    def __init__(self) -> None:
        self.result: Any = None

    def put(self, result: Any) -> None:
        self.result = result

    def take(self) -> Any:
        return self.result


def _trainer(placement: Placement, storage: str, args: dict) -> Any:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    scaling = ScalingConfig(num_workers=placement.workers, use_gpu=placement.gpus > 0,
                            resources_per_worker={"CPU": placement.cpus, "GPU": placement.gpus})
    return TorchTrainer(_worker, train_loop_config=args, scaling_config=scaling,
                        torch_config=TorchConfig(backend="nccl" if placement.gpus > 0 else "gloo"),
                        run_config=RunConfig(name="agentmem", storage_path=storage,
                                             failure_config=FailureConfig(max_failures=0)))


def _worker(args: dict) -> None:
    """One rank of the group, in a Ray Train worker: the job as a torchrun rank runs it (``cli.training_command``),
    then rank 0's result to the caller's mailbox."""
    import ray

    from agentmem.runtime import Runtime
    from store.engine import open_read_only, open_store

    if os.path.isdir(args["cwd"]):  # relative paths (--out, --db, model folders) mean what they mean to the caller
        os.chdir(args["cwd"])
    module, name = args["job"].split(":")
    job = getattr(importlib.import_module(module), name)
    with Runtime.create(device=args["device"], threads=args["threads"], fsdp=args["fsdp"]) as rt:
        store = open_store(args["db_url"]) if rt.is_main else open_read_only(args["db_url"])
        try:
            result = job(store, args["config"], rt, resume=args["resume"], steps=args["steps"],
                         report_to=args["report_to"] if rt.is_main else ())
        finally:
            store.dispose()
        if rt.is_main:
            ray.get(args["mailbox"].put.remote(result))


def _job_error(exc: BaseException) -> AgentmemError:
    """The worker's own error when it is one of ours (Ray hands it back unpickled; raised as it was, so a
    ``NotFound`` or ``ConfigError`` keeps its class and line), else a ``RunError`` naming Ray's first line."""
    seen: set[int] = set()
    todo: list[Any] = [exc]
    while todo:
        err = todo.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, AgentmemError):
            return err.with_traceback(None)
        todo.extend([err.__cause__, err.__context__, getattr(err, "cause", None)])
        with contextlib.suppress(Exception):
            todo.extend(getattr(err, "worker_failures", {}).values())
    text = str(exc).strip()
    return RunError(f"the Ray Train group failed: {text.splitlines()[0] if text else type(exc).__name__}")

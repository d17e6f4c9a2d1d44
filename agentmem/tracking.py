"""Experiment trackers for training steps (``--report-to tensorboard|mlflow|wandb``).

The store stays the source of truth: a job writes each ``TrainStep`` to ``train_steps`` first, then hands
it to the trackers, which log the same fields (``step_scalars``) against the step. Trackers write offline,
into a folder under the run's output (``<out>/<run id>/``, next to its checkpoints):

- tensorboard: ``tensorboard/`` event files (``tensorboardX``; view with ``tensorboard --logdir``);
- mlflow: ``mlflow/mlflow.db``, a local SQLite tracking store (``mlflow ui --backend-store-uri sqlite:///...``);
  a resumed run continues the MLflow run tagged with its id;
- wandb: ``wandb/offline-run-*`` (``WANDB_MODE=offline`` unless the environment sets another mode; upload
  later with ``wandb sync``).

Each tracker's package is an optional extra, imported only when its tracker opens; ``check_installed``
names the extra to install and is called before any model loads.
"""

from __future__ import annotations

import contextlib
import enum
import importlib.util
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from agentmem.errors import ConfigError
from agentmem.records import TrainStep


class TrackerKind(str, enum.Enum):
    tensorboard = "tensorboard"
    mlflow = "mlflow"
    wandb = "wandb"


# tracker -> (module that must be importable, extra that installs it)
PACKAGES = {TrackerKind.tensorboard: ("tensorboardX", "tensorboard"), TrackerKind.mlflow: ("mlflow", "mlflow"),
            TrackerKind.wandb: ("wandb", "wandb")}


def parse_report_to(values: Sequence[str]) -> list[TrackerKind]:
    """Trackers from repeated and/or comma-separated ``--report-to`` values, in order, without repeats;
    ``none`` (alone) means no tracker."""
    names = [n.strip().lower() for v in values for n in v.split(",") if n.strip()]
    if names == ["none"]:
        return []
    allowed = [k.value for k in TrackerKind]
    kinds: list[TrackerKind] = []
    for name in names:
        if name not in allowed:
            raise ConfigError(f"--report-to {name!r}: choose from {', '.join(allowed)} or none")
        if TrackerKind(name) not in kinds:
            kinds.append(TrackerKind(name))
    return kinds


def check_installed(kinds: Sequence[TrackerKind]) -> None:
    """Raise ConfigError naming the extra to install for the first tracker whose package is missing."""
    for kind in kinds:
        module, extra = PACKAGES[TrackerKind(kind)]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"--report-to {kind.value} needs the {module} package: pip install 'agentmem[{extra}]'")


def step_scalars(step: TrainStep) -> dict[str, float]:
    """The numbers of a train step, by name: the record's fields, tokens/s, and ``metrics/<key>`` for each
    entry of its metrics (every loss term's value among them, ``metrics/<term>_loss``)."""
    scalars = {"loss": step.loss, "tokens": float(step.tokens), "lr": step.lr, "seconds": step.seconds}
    if step.seconds > 0:
        scalars["tokens_per_s"] = step.tokens / step.seconds
    scalars.update({f"metrics/{k}": float(v) for k, v in sorted(step.metrics.items())})
    return {k: float(v) for k, v in scalars.items()}


class Tracker(Protocol):
    """Logs the scalars of each train step against its step; ``close`` flushes and ends the tracker's run."""

    def log(self, step: TrainStep) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    def __init__(self, folder: Path):
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(logdir=str(folder))

    def log(self, step: TrainStep) -> None:
        for name, value in step_scalars(step).items():
            self.writer.add_scalar(name, value, step.step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MlflowTracker:
    TAG = "agentmem_run_id"

    def __init__(self, folder: Path, run_id: str, config: dict[str, Any]):
        from mlflow.tracking import MlflowClient

        folder.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
        experiment = self.client.get_experiment_by_name("agentmem")
        exp_id = experiment.experiment_id if experiment else self.client.create_experiment("agentmem")
        found = self.client.search_runs([exp_id], filter_string=f"tags.{self.TAG} = '{run_id}'", max_results=1)
        if found:
            self.run_id = found[0].info.run_id
        else:
            self.run_id = self.client.create_run(exp_id, run_name=run_id, tags={self.TAG: run_id}).info.run_id
            for key, value in _flat(config).items():
                self.client.log_param(self.run_id, key, value)

    def log(self, step: TrainStep) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step.step) for k, v in step_scalars(step).items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class WandbTracker:
    def __init__(self, folder: Path, run_id: str, config: dict[str, Any]):
        import wandb

        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project="agentmem", name=run_id, dir=str(folder), config=config,
                              mode=os.environ.get("WANDB_MODE", "offline"), settings=wandb.Settings(silent=True))

    def log(self, step: TrainStep) -> None:
        self.run.log(step_scalars(step), step=step.step)

    def close(self) -> None:
        self.run.finish()


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)[:500]
    return out


def open_tracker(kind: TrackerKind, folder: Path, run_id: str, config: dict[str, Any]) -> Tracker:
    """One tracker writing under ``folder`` (the run's output folder)."""
    if kind is TrackerKind.tensorboard:
        return TensorBoardTracker(folder / "tensorboard")
    if kind is TrackerKind.mlflow:
        return MlflowTracker(folder / "mlflow", run_id, config)
    return WandbTracker(folder, run_id, config)


def run_folder(out: str, run_id: str) -> Path:
    """Where a training run writes (its checkpoints, and its trackers' files): ``<out>/<run id>``."""
    return Path(out).expanduser().resolve() / run_id


@contextlib.contextmanager
def reporting(kinds: Sequence[TrackerKind], folder: Path, run_id: str,
              config: dict[str, Any]) -> Iterator[Callable[[TrainStep], None] | None]:
    """A callback that logs a train step to every tracker of ``kinds`` (None when there are none); the
    trackers are closed on exit, whatever happens."""
    check_installed(kinds)
    with contextlib.ExitStack() as stack:
        trackers = []
        for kind in kinds:
            tracker = open_tracker(TrackerKind(kind), folder, run_id, config)
            stack.callback(tracker.close)
            trackers.append(tracker)

        def log(step: TrainStep) -> None:
            for tracker in trackers:
                tracker.log(step)

        yield log if trackers else None

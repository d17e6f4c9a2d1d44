"""`--report-to`: a 2-step sft run logs every step's TrainStep fields to each installed tracker, offline,
in a folder under the run's output, and reading the tracker's files back gives the stored values; a bad or
missing tracker fails with one line naming the extra, before any model loads."""

from __future__ import annotations

import glob
import importlib.util
import json
import struct
import time
from pathlib import Path

import pytest
from helpers import agentmem
from job_fixtures import sft_config

from agentmem.errors import ConfigError
from agentmem.jobs.sft import run_sft
from agentmem.records import RunKind, TrainStep
from agentmem.tracking import PACKAGES, TrackerKind, parse_report_to, step_scalars
from store import repository as repo


def installed(kind: TrackerKind):
    module, extra = PACKAGES[kind]
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"{module} is not installed (pip install 'agentmem[{extra}]')")


def read_tensorboard(folder: Path) -> dict[str, dict[int, float]]:
    """Scalars of every event file under ``folder``: TFRecord framing (length, crc, event, crc)."""
    from tensorboardX.proto import event_pb2

    out: dict[str, dict[int, float]] = {}
    for path in sorted(glob.glob(str(folder / "events.out.tfevents.*"))):
        data, pos = Path(path).read_bytes(), 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[pos + 12 : pos + 12 + n])
            pos += 12 + n + 4
            for value in event.summary.value:
                out.setdefault(value.tag, {})[event.step] = value.simple_value
    return out


def read_mlflow(folder: Path, run_id: str) -> dict[str, dict[int, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    exp = client.get_experiment_by_name("agentmem")
    (run,) = client.search_runs([exp.experiment_id], filter_string=f"tags.agentmem_run_id = '{run_id}'")
    assert run.info.status == "FINISHED" and run.info.run_name == run_id
    return {key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)} for key in run.data.metrics}


def read_wandb(folder: Path, steps: int) -> dict[str, dict[int, float]]:
    """History records of the offline run file, waiting up to 20 s for ``steps`` of them: wandb's service
    process writes the file and can still be flushing it just after ``finish()`` returned (seen once under
    load)."""
    deadline = time.monotonic() + 20
    while True:
        (path,) = glob.glob(str(folder / "wandb" / "offline-run-*" / "run-*.wandb"))
        out = _wandb_history(Path(path).read_bytes())
        if len(out.get("loss", {})) >= steps or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def _wandb_history(data: bytes) -> dict[str, dict[int, float]]:
    """LevelDB-log framing of wandb Record protobufs: 7-byte file header, 32 KiB blocks, 7-byte record headers."""
    from wandb.proto import wandb_internal_pb2 as pb

    pos, buf = 7, b""
    out: dict[str, dict[int, float]] = {}
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (kind == 0 and length == 0):
            pos += left
            continue
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last fragment of one
            record = pb.Record()
            record.ParseFromString(buf)
            buf = b""
            if record.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                for key, value in items.items():
                    if not key.startswith("_"):
                        out.setdefault(key, {})[items["_step"]] = value
    return out


READERS = {TrackerKind.tensorboard: lambda folder, rid: read_tensorboard(folder / "tensorboard"),
           TrackerKind.mlflow: lambda folder, rid: read_mlflow(folder / "mlflow", rid),
           TrackerKind.wandb: lambda folder, rid: read_wandb(folder, steps=2)}


@pytest.mark.parametrize("kind", [pytest.param(k, marks=installed(k)) for k in TrackerKind])
def test_sft_steps_reach_the_tracker_with_the_stored_values(stored, tmp_path, monkeypatch, kind):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline by default
    monkeypatch.setenv("WANDB_SILENT", "true")
    store, run_id, folder = stored
    result = run_sft(store, sft_config(run_id, folder, tmp_path, optim=dict(steps=2)), report_to=[kind])
    with store.session() as s:
        steps = repo.list_train_steps(s, result.run_id)
    assert [t.step for t in steps] == [1, 2]
    run_folder = tmp_path / "ckpt" / result.run_id
    logged = READERS[kind](run_folder, result.run_id)
    expected = {key: {t.step: step_scalars(t)[key] for t in steps} for key in step_scalars(steps[0])}
    assert set(logged) == set(expected)
    for key, values in expected.items():
        if kind is TrackerKind.tensorboard:  # event files hold float32
            assert logged[key] == pytest.approx(values, rel=1e-6), key
        else:
            assert logged[key] == values, key
    assert logged["loss"] != {}  # the loss values themselves, per step
    if kind is TrackerKind.mlflow:  # a resumed run continues the same MLflow run
        resumed = run_sft(store, None, resume=result.run_id, steps=3, report_to=[kind])
        assert read_mlflow(run_folder / "mlflow", resumed.run_id)["loss"] == {
            t.step: t.loss for t in [*steps, *resumed.history]}


def test_report_to_parsing_and_scalars():
    assert parse_report_to(["tensorboard,mlflow", "wandb", "mlflow"]) == [TrackerKind.tensorboard,
                                                                          TrackerKind.mlflow, TrackerKind.wandb]
    assert parse_report_to([]) == [] and parse_report_to(["none"]) == []
    with pytest.raises(ConfigError, match=r"--report-to 'neptune': choose from tensorboard, mlflow, wandb or none"):
        parse_report_to(["neptune"])
    step = TrainStep(run_id="r", step=3, loss=1.5, tokens=300, lr=1e-5, seconds=2.0,
                     metrics={"kd_loss": 0.5, "rl_loss": -0.25, "clip_fraction": 0.125, "approx_kl": 0.01})
    assert step_scalars(step) == {"loss": 1.5, "tokens": 300.0, "lr": 1e-5, "seconds": 2.0, "tokens_per_s": 150.0,
                                  "metrics/approx_kl": 0.01, "metrics/clip_fraction": 0.125,
                                  "metrics/kd_loss": 0.5, "metrics/rl_loss": -0.25}


def test_a_missing_tracker_fails_before_any_model_loads(stored, tmp_path, monkeypatch):
    store, run_id, folder = stored

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("agentmem.model_refs.load", no_load)
    monkeypatch.setitem(PACKAGES, TrackerKind.wandb, ("no_such_module_xyz", "wandb"))
    with pytest.raises(ConfigError, match=r"--report-to wandb needs the no_such_module_xyz package: "
                                          r"pip install 'agentmem\[wandb\]'"):
        run_sft(store, sft_config(run_id, folder, tmp_path), report_to=[TrackerKind.wandb])
    with store.session() as s:
        assert [r.run.kind for r in repo.list_runs(s)] == [RunKind.rollout]


def test_cli_report_to_flag(tmp_path):
    for command in ("sft", "distill", "train"):
        assert "--report-to" in agentmem(command, "--help-all").stdout
    db = tmp_path / "x.db"
    bad = agentmem("sft", "--run", "r", "--report-to", "tensorboard,neptune", "--db", str(db))
    assert bad.returncode == 2  # a bad flag value is a usage error (cli.command)
    assert bad.stderr.strip() == "error: --report-to 'neptune': choose from tensorboard, mlflow, wandb or none"
    assert not db.exists()

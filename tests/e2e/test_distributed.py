"""Several processes: `torchrun --nproc-per-node 2 -m agentmem distill` (gloo, CPU) gives the same stored
losses and the same saved weights as one process on the same global batch, and rank 0 alone writes: the
other ranks read the store read-only, and the store ends with exactly the rows of a one-process run."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import SYNTH, register_policy
from safetensors.torch import load_file

from agentmem.backends.transformers_backend import TransformersBackend
from agentmem.config import AgentConfig, RolloutConfig
from agentmem.errors import ConfigError
from agentmem.jobs.rollout import run_rollout
from agentmem.runtime import Runtime
from agentmem.testing.tiny_models import save_tiny, tiny_llama, tiny_tokenizer
from store import repository as repo

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")
ENV = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                         "MASTER_PORT")}
ENV |= {"AGENTMEM_DB": "", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
TOLERANCE = 1e-5


@pytest.fixture
def seeded(sqlite_store, tmp_path):
    """A SQLite file holding a tiny sampled rollout (4 episodes, rewards 0/1), a student and a teacher folder."""
    config = RolloutConfig(model="tiny", episodes=2, group_size=2, chunk_tokens=48, env_knobs=SYNTH,
                           agent=AgentConfig(memory_tokens=8, answer_max_new_tokens=4, temperature=1.0, seed=7))
    policy = register_policy(sqlite_store, "/models/tiny", "tiny")
    backend = TransformersBackend.from_model(tiny_llama(seed=3), tiny_tokenizer())
    result = run_rollout(sqlite_store, config, backend=backend, policy=policy)
    with sqlite_store.session() as s:
        for i, ep in enumerate(repo.list_episodes(s, result.run_id)):
            repo.update_episode(s, ep.model_copy(update={"reward": float(i % 2), "f1": float(i % 2)}))
        s.commit()
    sqlite_store.engine.dispose()
    student = save_tiny(tmp_path / "student", tiny_llama(seed=0))
    teacher = save_tiny(tmp_path / "teacher", tiny_llama(seed=1))
    return tmp_path / "agentmem.db", result.run_id, student, teacher


def distill(launcher: list[str], db: Path, run_id: str, student: str, teacher: str, out: Path, *extra: str) -> str:
    args = ["distill", *extra, "--run", run_id, "--student", student, "--teacher", teacher, "--teacher-context", "privileged",
            "--steps", "2", "--invocations-per-step", "4", "--lr", "1e-3", "--device", "cpu", "--threads", "1",
            "--out", str(out), "--db", f"sqlite:///{db}"]
    proc = subprocess.run([*launcher, *args], cwd=ROOT, env=ENV | ray_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def ray_env() -> dict[str, str]:
    """The Ray settings of this process (the ``ray_cluster`` fixture's cluster sets ``RAY_AUTH_MODE=token`` when it
    starts), which a command connecting to that cluster needs."""
    return {k: v for k, v in os.environ.items() if k.startswith("RAY_")}


def rows(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def test_two_gloo_processes_match_one_process_and_only_rank_0_writes(seeded, tmp_path):
    db, run_id, student, teacher = seeded
    one, two = tmp_path / "one.db", tmp_path / "two.db"
    for copy in (one, two):
        with sqlite3.connect(db) as src, sqlite3.connect(copy) as dst:
            src.backup(dst)  # the WAL included
    out1 = distill([sys.executable, "-m", "agentmem"], one, run_id, student, teacher, tmp_path / "ck1")
    torchrun = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "agentmem", "--"]
    out2 = distill(torchrun, two, run_id, student, teacher, tmp_path / "ck2")
    assert out1.count("distill_run_id=") == 1 and out2.count("distill_run_id=") == 1  # rank 0 alone reports

    losses = [rows(d, "select step, loss, kd_loss, rl_loss, tokens from train_steps order by step") for d in (one, two)]
    assert [r[0] for r in losses[0]] == [r[0] for r in losses[1]] == [1, 2]
    for a, b in zip(*losses, strict=True):
        assert a[4] == b[4]  # the same tokens: the global batch is the same
        for x, y in zip(a[1:4], b[1:4], strict=True):
            assert abs(x - y) <= TOLERANCE, (a, b)

    paths = [rows(d, "select path from checkpoints where step = 2")[0][0] for d in (one, two)]
    w1, w2 = (load_file(str(Path(p) / "model.safetensors")) for p in paths)
    assert w1.keys() == w2.keys()
    start = load_file(str(Path(student) / "model.safetensors"))
    print("max |loss diff|", max(abs(x - y) for a, b in zip(*losses, strict=True) for x, y in zip(a[1:4], b[1:4], strict=True)),
          "max |weight diff|", max((w1[n] - w2[n]).abs().max().item() for n in w1))
    for name in w1:
        assert not torch.equal(w1[name], start[name]), name  # both runs trained every weight
        assert (w1[name] - w2[name]).abs().max().item() <= TOLERANCE, name

    # rank 1 read the store read-only (a write would have failed the job): the two stores hold the same rows
    tables = [t for (t,) in rows(one, "select name from sqlite_master where type = 'table'")]
    for table in tables:
        assert rows(one, f"select count(*) from {table}") == rows(two, f"select count(*) from {table}"), table
    assert rows(two, "select kind, status from runs where kind = 'distill'") == [("distill", "finished")]


def test_other_ranks_get_a_store_that_refuses_writes(seeded):
    from cli.common import training_store

    db, run_id, _, _ = seeded
    url = f"sqlite:///{db}"
    store = training_store(url, Runtime(rank=1, world_size=2))
    with store.session() as s:
        assert repo.list_episodes(s, run_id)  # it reads
    with pytest.raises(Exception, match="(?i)read.?only|readonly|query_only|attempt to write"):
        register_policy(store, "/models/other", "other")
    writable = training_store(url, Runtime())
    assert register_policy(writable, "/models/other", "other").path == "/models/other"


def test_fsdp_in_one_process_is_refused_before_any_model_loads():
    with pytest.raises(ConfigError, match="--fsdp shards the student over several processes"):
        Runtime.create(device="cpu", fsdp=True)


def _copy(db: Path, to: Path) -> Path:
    with sqlite3.connect(db) as src, sqlite3.connect(to) as dst:
        src.backup(dst)  # the WAL included
    return to


def _kill_job(pid: int) -> None:
    """SIGKILL a torchrun job and its workers: torchrun starts each worker in a session of its own, so killing
    torchrun's process group leaves the workers running (they would go on and finish the run)."""
    import signal

    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _weights(db: Path, step: int) -> dict[str, torch.Tensor]:
    (path,) = rows(db, f"select path from checkpoints where step = {step}")[0]
    return load_file(str(Path(path) / "model.safetensors"))


def test_sft_under_torchrun_matches_one_process(seeded, tmp_path):
    db, run_id, student, _ = seeded
    one, two = _copy(db, tmp_path / "one.db"), _copy(db, tmp_path / "two.db")
    args = ["sft", "--run", run_id, "--student", student, "--steps", "2", "--invocations-per-step", "4", "--lr",
            "1e-3", "--device", "cpu", "--threads", "1"]
    torchrun = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "agentmem", "--"]
    for launcher, d, out in (([sys.executable, "-m", "agentmem"], one, "ck1"), (torchrun, two, "ck2")):
        proc = subprocess.run([*launcher, *args, "--out", str(tmp_path / out), "--db", f"sqlite:///{d}"], cwd=ROOT,
                              env=ENV, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
    losses = [rows(d, "select step, loss, tokens from train_steps order by step") for d in (one, two)]
    assert [r[0] for r in losses[1]] == [1, 2]
    for a, b in zip(*losses, strict=True):
        assert a[2] == b[2] and abs(a[1] - b[1]) <= TOLERANCE, (a, b)
    w1, w2 = _weights(one, 2), _weights(two, 2)
    for name in w1:
        assert (w1[name] - w2[name]).abs().max().item() <= TOLERANCE, name


def test_a_killed_torchrun_distill_resumes_to_the_one_process_weights(seeded, tmp_path):
    """kill -9 of the whole torchrun job once step 1 is saved, then `torchrun ... distill --resume RUN_ID`: the
    step-3 weights equal an uninterrupted one-process run's (to 1e-5)."""
    import time

    db, run_id, student, teacher = seeded
    one, two = _copy(db, tmp_path / "one.db"), _copy(db, tmp_path / "two.db")
    args = ["distill", "--run", run_id, "--student", student, "--teacher", teacher, "--teacher-context", "privileged",
            "--steps", "3", "--save-every", "1", "--invocations-per-step", "4", "--lr", "1e-3", "--device", "cpu",
            "--threads", "1"]
    proc = subprocess.run([sys.executable, "-m", "agentmem", *args, "--out", str(tmp_path / "ck1"), "--db",
                           f"sqlite:///{one}"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    torchrun = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "agentmem", "--"]
    job = subprocess.Popen([*torchrun, *args, "--out", str(tmp_path / "ck2"), "--db", f"sqlite:///{two}"], cwd=ROOT,
                           env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while job.poll() is None and time.monotonic() < deadline:
        if rows(two, "select count(*) from checkpoints where run_id in (select id from runs where kind = 'distill')"
                )[0][0] >= 1:
            break
        time.sleep(0.05)
    assert job.poll() is None, "the job ended before it could be killed"
    _kill_job(job.pid)
    job.wait()
    (killed,) = rows(two, "select id from runs where kind = 'distill'")[0]
    steps_before = rows(two, "select count(*) from train_steps")[0][0]
    assert steps_before < 3
    proc = subprocess.run([*torchrun, "distill", "--resume", killed, "--device", "cpu", "--threads", "1", "--db",
                           f"sqlite:///{two}"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [r[0] for r in rows(two, "select step from train_steps order by step")] == [1, 2, 3]
    w1, w2 = _weights(one, 3), _weights(two, 3)
    for name in w1:
        assert (w1[name] - w2[name]).abs().max().item() <= TOLERANCE, name


def test_fsdp_on_gloo_matches_one_process_and_resumes(seeded, tmp_path):
    """`torchrun --nproc-per-node 2 ... distill --fsdp` (FSDP2 on gloo): the same losses and step-2 weights as one
    process; checkpoints hold the whole model (gathered on rank 0); a run stopped after step 2 and resumed
    under FSDP to step 3 equals the one-process step 3."""
    db, run_id, student, teacher = seeded
    one, two = _copy(db, tmp_path / "one.db"), _copy(db, tmp_path / "two.db")
    args = ["distill", "--run", run_id, "--student", student, "--teacher", teacher, "--teacher-context", "privileged",
            "--save-every", "1", "--invocations-per-step", "4", "--lr", "1e-3", "--device", "cpu", "--threads", "1"]
    torchrun = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "agentmem", "--"]

    def run(launcher, d, *extra):
        proc = subprocess.run([*launcher, *extra, "--db", f"sqlite:///{d}"], cwd=ROOT, env=ENV, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]

    run([sys.executable, "-m", "agentmem"], one, *args, "--steps", "3", "--out", str(tmp_path / "ck1"))
    run(torchrun, two, *args, "--steps", "2", "--fsdp", "--keep-optimizer", "--out", str(tmp_path / "ck2"))
    losses = [rows(d, "select step, loss, tokens from train_steps where step <= 2 order by step") for d in (one, two)]
    for a, b in zip(*losses, strict=True):
        assert a[2] == b[2] and abs(a[1] - b[1]) <= TOLERANCE, (a, b)
    w1, w2 = _weights(one, 2), _weights(two, 2)
    assert set(w2) <= set(w1) and "model.embed_tokens.weight" in w2
    for name in w2:
        assert (w1[name] - w2[name]).abs().max().item() <= TOLERANCE, name
    (killed,) = rows(two, "select id from runs where kind = 'distill'")[0]
    run(torchrun, two, "distill", "--resume", killed, "--steps", "3", "--device", "cpu", "--threads", "1", "--fsdp")
    w1, w2 = _weights(one, 3), _weights(two, 3)
    for name in w2:
        assert (w1[name] - w2[name]).abs().max().item() <= TOLERANCE, name


@pytest.mark.ray
def test_a_ray_train_group_of_two_matches_one_process_and_only_rank_0_writes(seeded, tmp_path, ray_cluster):
    """`agentmem distill --ray --train-workers 2` (Ray Train's TorchTrainer, gloo) on the session's local cluster:
    the losses and step-2 weights of one process, to 1e-5; then `--resume` of that run under Ray extends it to
    step 3, which equals the one-process run's step 3."""
    import time

    pytest.importorskip("ray.train.torch")
    db, run_id, student, teacher = seeded
    one, two = _copy(db, tmp_path / "one.db"), _copy(db, tmp_path / "two.db")
    out1 = distill([sys.executable, "-m", "agentmem"], one, run_id, student, teacher, tmp_path / "ck1",
                   "--keep-optimizer")
    start = time.monotonic()
    ray = ["--ray", "--ray-address", ray_cluster, "--train-workers", "2"]
    out2 = distill([sys.executable, "-m", "agentmem"], two, run_id, student, teacher, tmp_path / "ck2", *ray,
                   "--keep-optimizer")
    seconds = time.monotonic() - start
    assert out1.count("distill_run_id=") == 1 and out2.count("distill_run_id=") == 1

    losses = [rows(d, "select step, loss, kd_loss, rl_loss, tokens from train_steps order by step") for d in (one, two)]
    assert [r[0] for r in losses[1]] == [1, 2]
    loss_diff = max(abs(x - y) for a, b in zip(*losses, strict=True) for x, y in zip(a[1:4], b[1:4], strict=True))
    assert all(a[4] == b[4] for a, b in zip(*losses, strict=True))  # the same global batch
    w1, w2 = _weights(one, 2), _weights(two, 2)
    assert w1.keys() == w2.keys()
    start_weights = load_file(str(Path(student) / "model.safetensors"))
    weight_diff = max((w1[n] - w2[n]).abs().max().item() for n in w1)
    print(f"ray_train_2 max|loss diff|={loss_diff:.2e} max|weight diff|={weight_diff:.2e} wall_s={seconds:.1f}")
    assert loss_diff <= TOLERANCE and weight_diff <= TOLERANCE
    assert all(not torch.equal(w1[n], start_weights[n]) for n in w1)  # both runs trained every weight
    tables = [t for (t,) in rows(one, "select name from sqlite_master where type = 'table'")]
    for table in tables:  # rank 1 wrote nothing
        assert rows(one, f"select count(*) from {table}") == rows(two, f"select count(*) from {table}"), table

    # --resume under Ray is the resume of one process: both runs extended to step 3 end with the same weights
    runs = [rows(d, "select id from runs where kind = 'distill'")[0][0] for d in (one, two)]
    for d, rid, extra in ((one, runs[0], []), (two, runs[1], ray)):
        proc = subprocess.run([sys.executable, "-m", "agentmem", "distill", *extra, "--resume", rid, "--steps", "3",
                               "--device", "cpu", "--threads", "1", "--db", f"sqlite:///{d}"], cwd=ROOT,
                              env=ENV | ray_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
    w1, w2 = _weights(one, 3), _weights(two, 3)
    assert max((w1[n] - w2[n]).abs().max().item() for n in w1) <= TOLERANCE


@pytest.mark.ray
def test_ray_train_refusals_are_one_line_before_anything_is_written(seeded, tmp_path, ray_cluster, capsys,
                                                                     monkeypatch):
    from helpers import run_main

    from agentmem.testing.serving import free_port

    db, run_id, student, teacher = seeded
    args = ["distill", "--run", run_id, "--student", student, "--teacher", teacher, "--steps", "1", "--device", "cpu",
            "--out", str(tmp_path / "ck"), "--db", f"sqlite:///{db}"]
    unreachable = subprocess.run([sys.executable, "-m", "agentmem", *args, "--ray", "--ray-address",
                                  f"127.0.0.1:{free_port()}", "--train-workers", "2"], cwd=ROOT, env=ENV,
                                 capture_output=True, text=True, timeout=120)
    assert unreachable.returncode == 1 and unreachable.stderr.strip().count("\n") == 0, unreachable.stderr
    assert "cannot reach the Ray cluster at 127.0.0.1:" in unreachable.stderr
    code, _, err = run_main(capsys, monkeypatch, *args, "--ray", "--train-workers", "8")  # the cluster has 4 CPUs
    assert code == 1 and err.strip().count("\n") == 0, err
    assert "has 4 CPUs (at most 4 on one node): --train-workers 8 x --worker-cpus 1 needs 8" in err
    code, _, err = run_main(capsys, monkeypatch, *args, "--train-workers", "2")
    assert code == 2 and "--train-workers place(s) Ray workers: add --ray" in err, err
    code, _, err = run_main(capsys, monkeypatch, *args, "--ray", "--fsdp")
    assert code == 2 and "--fsdp shards the student over several processes: give --train-workers N" in err, err
    assert rows(db, "select count(*) from runs where kind = 'distill'") == [(0,)]
    assert not (tmp_path / "ck").exists()

    # an error the job raises on a worker comes back as itself, in one line
    from agentmem.jobs import ray_rollout, ray_train
    from agentmem.jobs.distill import run_distill
    from store.errors import NotFound

    with pytest.raises(NotFound, match="^no run with id '0123456789abcdef' \\(see `agentmem runs`\\)$"):
        ray_train.fit(run_distill, f"sqlite:///{db}", ray_rollout.Placement(workers=1), config=None,
                      resume="0123456789abcdef", device="cpu", threads=1)

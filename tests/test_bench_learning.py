"""The learning benchmark (``bench/learning/``): arm-seeds trained side by side (``--jobs``) give the same phases
as one process; the plan's task order and flag checks; what each flag reaches in the stored configs and in the
report's values (``learning.json``); adding seeds to a folder; a deleted teacher checkpoint; the momentum arm's
``coast``."""

from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
       "AGENTMEM_DB": "", "PYTHONPATH": str(REPO)}
LEARNING = [sys.executable, "-m", "bench.learning"]


def _bench(work: Path, *extra: str, arms: str = "opd_aligned,grpo,seqkd") -> subprocess.CompletedProcess:
    """``python -m bench.learning --smoke`` on ``arms`` with 2 calls per step."""
    return subprocess.run([*LEARNING, "--smoke", "--work", str(work), "--arms", arms, "--calls-per-step", "2", *extra],
                          env=ENV, capture_output=True, text=True, timeout=600)


def _values(work: Path) -> dict:
    """The report's values (``WORK/learning.json``)."""
    return json.loads((work / "learning.json").read_text())


def _run(work: Path, *extra: str, arms: str = "opd_aligned,grpo,seqkd") -> dict:
    """``_bench``, which must succeed; the finished phases."""
    proc = _bench(work, *extra, arms=arms)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((work / "state.json").read_text())["phases"]


@pytest.mark.bench_smoke
def test_jobs_give_the_phases_of_one_process(tmp_path):
    one = _run(tmp_path / "one", "--teacher-min-confidence", "0.5")
    two = _run(tmp_path / "two", "--jobs", "2", "--teacher-min-confidence", "0.5")
    evals = sorted(k for k in one if k.startswith("eval/"))
    assert evals == sorted(k for k in two if k.startswith("eval/"))
    assert {"eval/base/0/11", "eval/warm/0/11", "eval/momentum/0/10", "eval/opd_aligned/0/11", "eval/grpo/0/10",
            "eval/seqkd/0/10"} <= set(evals)
    for k in evals:  # the same greedy F1 per question, and the same output statistics
        assert one[k]["scores"] == two[k]["scores"], k
        assert one[k]["length"] == two[k]["length"], k
    # --calls-per-step sets the methods' batch; the warm start and the teacher keep warm_calls_per_step (4)
    with sqlite3.connect(tmp_path / "two" / "learning.db") as db:
        batch = {(kind, (json.loads(config).get("batch") or json.loads(config))["invocations_per_step"])
                 for kind, config in db.execute("select kind, config from runs where kind in ('sft', 'distill')")}
        # seqkd: cross-entropy on the teacher's own samples (no teacher term), each round's rollout by the teacher
        seqkd = [json.loads(c) for (c,) in db.execute("select config from runs where kind = 'distill'")
                 if json.loads(c)["loss"]["ce_weight"] == 1.0]
        teacher = two["teacher/ladder/pick"]["teacher"]
        policies = {p for (p,) in db.execute(
            "select distinct i.policy_version from invocations i join episodes e on e.id = i.episode_id "
            "where e.run_id in (" + ",".join("?" * len(seqkd)) + ")", [r for c in seqkd for r in c["run_ids"]])}
        # --teacher-min-confidence reaches the teacher term only, which logs the share it left out
        gates = {(c["loss"]["kd_weight"], c["teacher"]["min_confidence"]) for (c,) in
                 ((json.loads(c),) for (c,) in db.execute("select config from runs where kind = 'distill'"))}
        gated = [json.loads(m) for (m,) in db.execute(
            "select t.metrics from train_steps t join runs r on r.id = t.run_id where r.kind = 'distill' "
            "and json_extract(r.config, '$.loss.kd_weight') > 0")]
    assert gates == {(1.0, 0.5), (0.0, 0.0)}
    assert gated and all(0.0 <= m["kd_gated_fraction"] <= 1.0 for m in gated)
    # the report's teacher gated value: the mean of those shares for the gated arm, none for the others
    arms = _values(tmp_path / "two")["arms"]
    assert arms["opd_aligned"]["teacher_gated"] == pytest.approx(
        sum(m["kd_gated_fraction"] for m in gated) / len(gated), rel=1e-9)
    assert arms["grpo"]["teacher_gated"] is None and arms["seqkd"]["teacher_gated"] is None
    # first reads: per evaluated ladder arm, the evidence and other shares for its one seed
    assert {"base", "warm", "opd_aligned", "grpo", "seqkd"} <= set(arms)
    for arm, values in arms.items():
        (reads,) = values["first_reads"]
        assert 0.0 <= reads["evidence"] <= 1.0 and 0.0 <= reads["other"] <= 1.0, arm
    # the picked ladder teacher's own first reads on its validation episodes
    teachers = _values(tmp_path / "two")["teachers"]
    assert set(teachers) == {"ladder"} and teachers["ladder"]["step"] == two["teacher/ladder/pick"]["step"]
    reads = teachers["ladder"]["first_reads"]
    assert set(reads) <= {"evidence", "other"} and reads and all(0.0 <= v <= 1.0 for v in reads.values())
    assert batch == {("sft", 4), ("distill", 2)}
    assert len(seqkd) == 2 and all(c["teacher"]["model"] is None and c["loss"]["kd_weight"] == 0.0 for c in seqkd)
    assert policies == {teacher}
    ids = {"teacher", "eval_run_id"}
    pick = "teacher/ladder/pick"  # the same teacher check, in its own process
    assert {x: v for x, v in one[pick].items() if x not in ids} == {x: v for x, v in two[pick].items() if x not in ids}


def test_run_order_covers_every_arm_once():
    import bench.learning as learning

    assert sorted(learning.RUN_ORDER) == sorted(a for a in learning.ARMS if a != "base")
    assert len(set(learning.RUN_ORDER)) == len(learning.RUN_ORDER)


def test_task_order_starts_what_every_method_waits_for_and_puts_the_base_evaluation_mid_list():
    import argparse

    import bench.learning as learning

    ns = argparse.Namespace(**{a: None for a in (
        "lr", "seeds", "steps", "heldout_per_level", "heldout_real", "eval_dtype", "warm_steps", "warm_lr", "loss",
        "teacher_val", "group", "calls_per_step", "teacher_temperature", "teacher_min_confidence", "rl_kd_weight",
        "privileged_teacher_sft", "carry_warm_optimizer", "carry_warm_first_moment", "mixed_precision",
        "teacher_steps", "arms", "hotpot", "squad")}, smoke=False, quick=False)
    plan = learning.make_plan(ns, "default")
    order = learning.task_order(plan)
    seeds = list(range(plan.seeds))
    assert order[:plan.seeds] == [("warm", s) for s in seeds]
    # the teachers next, T_rl (the longest) first
    teachers = [("teacher", f"rl-{s}") for s in seeds] + [("teacher", "ladder"), ("teacher", "ladder-hint")]
    assert order[plan.seeds:2 * plan.seeds + 2] == teachers
    rest = 3 * plan.seeds + 2 + bool(plan.squad)
    assert set(order[2 * plan.seeds + 2:rest]) == {("teacher", f"t0-{s}") for s in seeds} | (
        {("teacher", "squad")} if plan.squad else set())
    assert order[rest][0] != "teacher"
    # the base evaluation right after the last line's ladder arms (every seed of them), before the rest
    at = order.index(("base", 0))
    assert order[at - 1] == ("opd_persistent", plan.seeds - 1)
    assert {t[0] for t in order[:at]} >= set(learning.BASE_AFTER)
    assert not {t[0] for t in order[at + 1:]} & set(learning.BASE_AFTER)
    assert order[at + 1:] and order[-1][0] != "base"
    assert len(order) == len(set(order))
    assert set(plan.arms) == set(learning.ARMS) - (set() if plan.squad else {"squad_warm", "squad_opd"})
    trained = {(a, s) for a in plan.arms if a != "base" for s in learning.arm_seeds(plan, a)}
    assert set(order) == trained | {("base", 0)} | {("teacher", k) for k in learning.teacher_keys(plan)}
    quick = learning.make_plan(argparse.Namespace(**{**vars(ns), "quick": True}), "default")
    assert quick.arms == [a for a in learning.ARMS if a in learning.QUICK_ARMS and (plan.squad or not a.startswith("squad"))]
    assert set(learning.QUICK_ARMS) <= set(learning.ARMS)
    assert {"opd_t0", "opd_aligned", "opd_rl", "opd_hint", "sft_more", "seqkd_rl", "grpo", "opd_grpo_hint",
            "opd_persistent", "teacher_rl", "teacher_hint"} <= set(quick.arms)
    assert learning.task_order(quick)[:2] == [("warm", 0), ("teacher", "rl-0")]
    assert learning.task_order(quick)[-2:] == [("opd_persistent", 0), ("base", 0)]
    subset = learning.make_plan(argparse.Namespace(**{**vars(ns), "quick": True, "arms": "sft_more"}), "default")
    assert learning.task_order(subset)[-2:] == [("sft_more", 0), ("base", 0)]  # none of BASE_AFTER: base last


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--group", "1", "--group: at least 2 samples per task"),
    ("--teacher-val", "0", "--teacher-val: a positive number of episodes"),
    ("--calls-per-step", "0", "--calls-per-step: a positive number of stored calls"),
    ("--teacher-temperature", "0", "--teacher-temperature: a positive number"),
    ("--teacher-min-confidence", "1", "--teacher-min-confidence: a probability in [0, 1)"),
    ("--rl-kd-weight", "0", "--rl-kd-weight: a positive weight"),
    ("--steps", "2002", "--steps: at most 1000 rounds of 2 steps"),
])
def test_bad_plan_flags_exit_before_anything_runs(tmp_path, flag, value, message):
    work = tmp_path / "work"
    proc = subprocess.run([*LEARNING, "--work", str(work), flag, value], capture_output=True, text=True, timeout=300,
                          env=ENV)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert not (work / "state.json").exists() and not (work / "learning.db").exists()


@pytest.mark.bench_smoke
def test_rl_kd_weight_reaches_only_the_arm_with_both_terms(tmp_path):
    work = tmp_path / "w"
    _run(work, "--rl-kd-weight", "0.25", arms="opd_aligned,opd_grpo")
    with sqlite3.connect(work / "learning.db") as db:
        weights = {(c["loss"]["kd_weight"], c["loss"]["rl_weight"]) for c in (json.loads(c) for (c,) in db.execute(
            "select config from runs where kind = 'distill'"))}
    assert weights == {(1.0, 0.0), (0.25, 1.0)}  # opd_aligned keeps 1 (alone a weight is moot); opd_grpo 0.25


@pytest.mark.bench_smoke
def test_centred_arms_centre_the_teacher_term_and_report_the_shared_push(tmp_path):
    work = tmp_path / "w"
    _run(work, arms="opd_aligned,opd_centered,opd_grpo_centered,opd_centered_memory,opd_grpo_centered_memory")
    with sqlite3.connect(work / "learning.db") as db:
        configs = {(c["loss"]["teacher_centering"], c["loss"]["rl_weight"]) for c in (json.loads(c) for (c,) in db.execute(
            "select config from runs where kind = 'distill'"))}
        shared = [json.loads(m).get("kd_shared_fraction") for (m,) in db.execute(
            "select s.metrics from train_steps s join runs r on r.id = s.run_id "
            "where r.kind = 'distill' and json_extract(r.config, '$.loss.teacher_centering') != 'none'")]
    assert configs == {("none", 0.0), ("first_token", 0.0), ("first_token", 1.0), ("first_token_memory", 0.0),
                       ("first_token_memory", 1.0)}
    assert shared and all(v is not None and 0.0 <= v <= 1.0 + 1e-9 for v in shared)
    values = _values(work)
    for arm in ("opd_centered", "opd_grpo_centered", "opd_centered_memory", "opd_grpo_centered_memory"):
        assert 0.0 <= values["arms"][arm]["push_shared"] <= 1.0 + 1e-9, arm  # the mean shared fraction of its steps
    assert values["arms"]["opd_aligned"]["push_shared"] is None
    # the paired difference of the centred and the plain teacher term: mean, low, high, all measured
    assert len(values["differences"]["centered_minus_aligned"]) == 3
    assert all(math.isfinite(x) for x in values["differences"]["centered_minus_aligned"])


@pytest.mark.bench_smoke
def test_a_later_run_adds_seeds_without_touching_the_earlier_ones(tmp_path):
    """``--seeds 2`` on a folder made with one seed trains and evaluates seed 1 only: seed 0's phases (its warm
    start, checkpoints and scores) are left as they were, seed 1 rolls out tasks of its own, and the report then
    covers both seeds. Fewer seeds than the folder has report the first ones."""
    one = _run(tmp_path, arms="opd_aligned")
    two = _run(tmp_path, "--seeds", "2", arms="opd_aligned")
    assert {k: v for k, v in two.items() if k in one} == one
    added = sorted(set(two) - set(one))
    assert {"warm/ladder/1", "arm/warm/1", "arm/opd_aligned/1", "eval/warm/1/11", "eval/opd_aligned/1/11"} <= set(added)
    assert not [k for k in added if k.split("/")[-1] == "0" or "/0/" in k]
    rollouts = {k.split("/")[2] for k in two if k.startswith("rollout/")}
    assert rollouts == {"100", "101", "110", "111"}  # 100 + 10 x seed + round
    assert _values(tmp_path)["arms"]["opd_aligned"]["seeds"] == 2
    assert len(_values(tmp_path)["arms"]["opd_aligned"]["first_reads"]) == 2
    _run(tmp_path, "--seeds", "1", "--report-partial", arms="opd_aligned")
    assert _values(tmp_path)["arms"]["opd_aligned"]["seeds"] == 1


@pytest.mark.bench_smoke
def test_a_deleted_teacher_checkpoint_is_named_with_the_phases_that_made_it(tmp_path):
    """A folder whose picked teacher's checkpoint was deleted (to free disk) still holds the teacher's phases as
    done: a later run that distils from it stops with the folder and the phases to re-make, not a loader error;
    with those phases removed from the state file the run makes the teacher again and goes on."""
    one = _run(tmp_path, arms="opd_aligned")
    pick = one["teacher/ladder/pick"]["teacher"]
    path = next(c["path"] for c in one["teacher/ladder/candidates"] if c["id"] == pick)
    shutil.rmtree(path)
    proc = _bench(tmp_path, "--seeds", "2", arms="opd_aligned")
    assert proc.returncode != 0
    assert "MissingCheckpoint" in proc.stderr and path in proc.stderr and "teacher/ladder/*" in proc.stderr
    state = json.loads((tmp_path / "state.json").read_text())
    assert "arm/opd_aligned/1" not in state["phases"]
    state["phases"] = {k: v for k, v in state["phases"].items() if not k.startswith("teacher/ladder/")}
    (tmp_path / "state.json").write_text(json.dumps(state))
    two = _run(tmp_path, "--seeds", "2", arms="opd_aligned")
    assert "arm/opd_aligned/1" in two
    remade = next(c["path"] for c in two["teacher/ladder/candidates"] if c["id"] == two["teacher/ladder/pick"]["teacher"])
    assert remade != path and Path(remade).is_dir()
    # the same config re-makes the same teacher here: its validation report is the deleted one's
    measured = ("f1", "empty_by_kind", "out_len_by_kind", "eos_first_by_kind", "empty_after_evidence", "step")
    assert {k: two["teacher/ladder/pick"][k] for k in measured} == {k: one["teacher/ladder/pick"][k] for k in measured}


@pytest.mark.bench_smoke
def test_privileged_teacher_sft_trains_and_validates_the_privileged_teacher_under_its_prompt(tmp_path):
    """``--privileged-teacher-sft``: opd_privileged distils from a teacher fine-tuned under the privileged prompt
    (an sft run with context privileged) and validated under it (eval runs sampled under the splice), and so do
    opd_privileged_grpo beside the RL term and opd_privileged_centered_memory with its push centred by kind and
    memory state, while opd_aligned keeps the plain ladder teacher."""
    work = tmp_path / "w"
    phases = _run(work, "--privileged-teacher-sft", "--jobs", "2",
                  arms="opd_aligned,opd_privileged,opd_privileged_grpo,opd_privileged_centered_memory")
    picks = {key: phases[f"teacher/{key}/pick"]["teacher"] for key in ("ladder", "ladder-privileged")}
    assert picks["ladder"] != picks["ladder-privileged"]
    with sqlite3.connect(work / "learning.db") as db:
        sft = {json.loads(c)["out"].rsplit("/", 1)[-1]: json.loads(c)["context"] for (c,) in db.execute(
            "select config from runs where kind = 'sft'")}
        distills = {json.loads(c)["out"].rsplit("/", 1)[-1]: json.loads(c) for (c,) in db.execute(
            "select config from runs where kind = 'distill'")}
        teacher_of = {name: c["teacher"]["model"] for name, c in distills.items()}
        evals = [(json.loads(c)["context"], r) for (c, r) in db.execute(
            "select config, id from runs where kind = 'eval'")]
        privileged_calls = {r: n for (r, n) in db.execute(
            "select e.run_id, count(*) from invocations i join episodes e on e.id = i.episode_id "
            "where i.privileged_ids is not null group by e.run_id")}
    assert sft["teacher-ladder-privileged"] == "privileged" and sft["teacher-ladder"] == "aligned"
    assert all(context == "aligned" for name, context in sft.items() if name.startswith("warm"))
    assert (teacher_of["opd_privileged-0"] == teacher_of["opd_privileged_grpo-0"]
            == teacher_of["opd_privileged_centered_memory-0"] == picks["ladder-privileged"])
    assert {name: (c["teacher"]["context"], c["loss"]["teacher_centering"]) for name, c in distills.items()} == {
        "opd_aligned-0": ("aligned", "none"), "opd_privileged-0": ("privileged", "none"),
        "opd_privileged_grpo-0": ("privileged", "none"),
        "opd_privileged_centered_memory-0": ("privileged", "first_token_memory")}
    assert teacher_of["opd_aligned-0"] == picks["ladder"]
    privileged_evals = [r for context, r in evals if context == "privileged"]
    assert len(privileged_evals) == 2  # the smoke plan's two candidates, each validated under the splice
    assert all(privileged_calls.get(r, 0) > 0 for r in privileged_evals)
    assert not any(privileged_calls.get(r, 0) for context, r in evals if context == "aligned")


@pytest.mark.bench_smoke
def test_without_the_first_moment_momentum_is_the_warm_start(tmp_path):
    """``--no-carry-warm-first-moment``: the methods' first round carries the warm start's AdamW without its first
    moment (later rounds carry their own), and the momentum arm, which would not move, is the warm start's
    checkpoint with the warm start's own scores (evaluated once), the warm start's optimizer state kept."""
    phases = _run(tmp_path, "--jobs", "2", "--no-carry-warm-first-moment")
    warm = phases["warm/ladder/0"]
    assert phases["arm/momentum/0"] == [warm]
    assert (Path(warm["path"]) / "trainer_state.pt").is_file()
    levels = phases["eval/momentum/0/10"]
    assert set(levels["scores"]) == {"level1", "level2"}
    for part, values in levels.items():
        assert values == {k: v for k, v in phases["eval/warm/0/11"][part].items() if k in levels["scores"]}, part
    with sqlite3.connect(tmp_path / "learning.db") as db:
        carried = sorted((json.loads(c)["optim"]["schedule_offset"], json.loads(c)["optim"]["carry_optimizer"],
                          json.loads(c)["optim"]["carry_first_moment"])
                         for (c,) in db.execute("select config from runs where kind = 'distill'"))
    # three on-policy arms, two rounds each: round 1 (offset 0) without the first moment, round 2 with its own
    assert carried == [(0, True, False)] * 3 + [(1, True, True)] * 3
    assert _values(tmp_path)["momentum"] == "warm_start"


def test_coast_moves_the_weights_by_the_carried_adam_moments_alone():
    """``coast`` (the momentum arm): with every gradient zero, AdamW step t moves a weight by
    -lr_t * (beta1^t m / (1 - beta1^(s+t))) / (sqrt(beta2^t v / (1 - beta2^(s+t))) + eps) from the carried state
    (m, v, s steps): exact in float64. A fresh optimizer (no state) does not move at all."""
    import torch

    import bench.learning as learning

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    opt = torch.optim.AdamW([w], lr=1e-2, weight_decay=0.0)
    for _ in range(3):  # a carried state: three real steps
        w.grad = torch.randn(5, dtype=torch.float64)
        opt.step()
    state = opt.state[w]
    m, v, s = state["exp_avg"].clone(), state["exp_avg_sq"].clone(), int(state["step"])
    start = w.detach().clone()
    lrs = [2e-5, 1.5e-5, 1e-5, 2e-6]
    learning.coast(opt, lrs)
    (b1, b2), eps = opt.param_groups[0]["betas"], opt.param_groups[0]["eps"]
    want = start.clone()
    for t, lr in enumerate(lrs, start=1):
        mt, vt = m * b1**t, v * b2**t
        want -= lr * (mt / (1 - b1 ** (s + t))) / ((vt / (1 - b2 ** (s + t))).sqrt() + eps)
    assert torch.allclose(w.detach(), want, rtol=1e-12, atol=0)
    assert not torch.equal(w.detach(), start) and w.grad is None
    fresh = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    before = fresh.detach().clone()
    learning.coast(torch.optim.AdamW([fresh], lr=1e-2, weight_decay=0.0), lrs)
    assert torch.equal(fresh.detach(), before)


@pytest.mark.bench_smoke
def test_mixed_precision_reaches_every_training_job(tmp_path):
    """``--mixed-precision on``: the warm start, the teacher and every method round (SFT-like seqkd included)
    train with the decoders in bf16 autocast (their stored configs say so), and the report says so."""
    _run(tmp_path, "--mixed-precision", "on")
    with sqlite3.connect(tmp_path / "learning.db") as db:
        kinds = [(k, json.loads(c)["mixed_precision"]) for (k, c) in db.execute(
            "select kind, config from runs where kind in ('sft', 'distill')")]
    assert {k for k, _ in kinds} == {"sft", "distill"} and all(mixed for _, mixed in kinds)
    assert json.loads((tmp_path / "state.json").read_text())["plan"]["mixed_precision"] == "on"
    assert _values(tmp_path)["mixed_precision"] is True

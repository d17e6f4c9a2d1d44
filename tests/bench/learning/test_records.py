"""The learning plan's pure parts: the teacher gate on known measurements (``bench/learning/teacher_fit.py``),
and the summary, last line and pilot built from a list of records (``bench/learning/records.py``), against the
paired bootstrap on the same arrays."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.learning import records
from bench.learning.teacher_fit import GateLimits, decision_gap, gate, judge, paired_interval
from envs.metrics import cluster_bootstrap

CHECK = {"f1": 0.45, "empty_by_kind": {"memory_update": 0.0, "answer": 0.01},
         "eos_first_by_kind": {"memory_update": 0.002, "answer": 0.0}, "first_reads": {"evidence": 0.2, "other": 0.8}}


def test_decision_gap_is_other_minus_evidence():
    assert decision_gap({"evidence": 0.25, "other": 0.875}) == 0.625
    assert decision_gap({"other": 0.9}) is None and decision_gap(None) is None


def test_gate_passes_a_teacher_with_headroom_and_a_decision():
    g = gate(CHECK, warm_f1=0.30)
    assert g["passed"] and g["fails"] == []
    assert g["headroom"] == pytest.approx(0.15) and g["decision_gap"] == pytest.approx(0.6)
    assert (g["max_empty"], g["max_eos_first"]) == (0.01, 0.002)


@pytest.mark.parametrize(("change", "warm", "reason"), [
    ({}, 0.40, "validation F1 0.450 is +0.050 over the warm start's 0.400 (needs +0.10)"),
    ({"first_reads": {"evidence": 0.5, "other": 0.9}}, 0.30, "first-read decision gap 0.40 (needs 0.50)"),
    ({"first_reads": None}, 0.30, "no first-read decision gap measured"),
    ({"empty_by_kind": {"answer": 0.05}}, 0.30, "empty-output rate 0.050 (at most 0.02)"),
    ({"eos_first_by_kind": {"answer": 0.2}}, 0.30, "first-token EOS mass 0.200 (at most 0.05)"),
])
def test_gate_names_each_failing_measurement(change, warm, reason):
    g = gate({**CHECK, **change}, warm_f1=warm)
    assert not g["passed"] and g["fails"] == [reason]


def test_gate_limits_are_the_documented_thresholds():
    assert GateLimits() == GateLimits(f1_margin=0.10, min_gap=0.5, max_empty=0.02, max_eos_first=0.05)
    assert gate(CHECK, warm_f1=0.35)["passed"]  # exactly +0.10 passes


def _arm(arm: str, seed: int, scores: dict[str, list[float]], teacher: str | None = None, once: bool = False) -> dict:
    return {"kind": "arm", "arm": arm, "seed": seed, "once": once, "teacher": teacher, "scores": scores,
            "config_hash": "h"}


def _records(rng: np.random.Generator) -> tuple[list[dict], dict[str, np.ndarray]]:
    """Two seeds, two levels of 4 questions: every arm's scores, and the arrays behind them [arm][seed, q]."""
    means = {"warm": 0.2, "momentum": 0.2, "sft_more": 0.25, "teacher_hint": 0.5, "opd_hint": 0.35,
             "seqkd_hint": 0.28, "grpo": 0.3, "opd_grpo_hint": 0.4}
    out, arrays = [], {}
    for arm, mean in means.items():
        # a fixed mean per cell plus noise that sums to zero over each seed's questions, so means are exact
        noise = rng.normal(0, 0.1, size=(2, 2, 4))
        noise -= noise.mean(axis=2, keepdims=True)
        cells = mean + noise
        arrays[arm] = cells
        teacher = "hint" if "hint" in arm else None
        out += [_arm(arm, s, {f"level{lv + 1}": cells[s, lv].tolist() for lv in range(2)}, teacher) for s in range(2)]
    out += [{"kind": "unit", "seed": s, "minutes": m, "arms": [], "config_hash": "h"} for s, m in ((0, 90.0), (1, 80.0))]
    return out, arrays


def _pair(arrays: dict[str, np.ndarray], a: str, b: str) -> tuple[float, float, float]:
    comps = lambda arm: {f"level{lv + 1}": arrays[arm][:, lv] for lv in range(2)}  # noqa: E731
    return cluster_bootstrap(comps(a), comps(b), n=2000)


def test_summary_is_the_paired_bootstrap_of_the_records_arrays():
    recs, arrays = _records(np.random.default_rng(0))
    s = records.summarize(recs)
    assert s["gap_hint"] == _pair(arrays, "teacher_hint", "warm") and s["gap_hint"][0] == pytest.approx(0.3)
    assert s["recovery_hint"] == pytest.approx(0.15 / 0.3)
    assert s["opd_minus_sft_more"] == _pair(arrays, "opd_hint", "sft_more")
    assert s["opd_minus_seqkd"] == _pair(arrays, "opd_hint", "seqkd_hint")
    assert s["opd_rl_minus_rl"] == _pair(arrays, "opd_grpo_hint", "grpo")
    assert (s["seeds"], s["minutes_per_seed"]) == (2, 85.0)
    line = records.last_line(s)
    assert line.split()[0] == f"gap_hint={s['gap_hint'][0]:.3f}" and line.endswith(" seeds=2 minutes_per_seed=85.000")
    assert [kv.split("=")[0] for kv in line.split()] == list(records.LAST_LINE)


def test_missing_records_read_na():
    recs, _ = _records(np.random.default_rng(1))
    recs = [r for r in recs if r.get("arm") not in ("opd_grpo_hint", "teacher_hint") and r["kind"] != "unit"]
    s = records.summarize(recs)
    assert s["gap_hint"] is None and s["recovery_hint"] is None and s["opd_rl_minus_rl"] is None
    assert s["opd_minus_sft_more"] is not None and s["minutes_per_seed"] is None
    line = records.last_line(s)
    assert "gap_hint=na" in line and "opd_rl_minus_rl=na" in line and line.endswith("seeds=0 minutes_per_seed=na")


def test_a_model_evaluated_once_pairs_with_every_seed():
    warm = [_arm("warm", s, {"level1": [0.0, 1.0]}) for s in range(3)]
    teacher = [_arm("teacher_hint", 0, {"level1": [1.0, 1.0]}, once=True)]
    s = records.summarize(warm + teacher)
    assert s["gap_hint"][0] == pytest.approx(0.5) and s["seeds"] == 0  # no seed's unit finished


def test_only_seeds_whose_unit_finished_are_counted():
    recs, _ = _records(np.random.default_rng(2))
    partial = [_arm("warm", 2, {"level1": [0.0] * 4, "level2": [0.0] * 4})]
    s = records.summarize([r for r in recs if not (r["kind"] == "unit" and r["seed"] == 1)] + partial)
    assert (s["seeds"], s["minutes_per_seed"]) == (1, 90.0)


def test_a_resumed_units_minutes_are_left_out_of_minutes_per_seed():
    recs, _ = _records(np.random.default_rng(3))
    recs = [{**r, "whole": False} if r["kind"] == "unit" and r["seed"] == 1 else r for r in recs]
    s = records.summarize(recs)
    assert (s["seeds"], s["minutes_per_seed"]) == (2, 90.0)  # seed 1 finished, but its 80 min miss a killed part
    assert records.unit_record({"steps": 8}, 1, ["warm"], 4.3, whole=False)["whole"] is False


def test_records_are_written_by_config_hash_and_loaded_back(tmp_path):
    plan = {"steps": 8, "eval_steps": [8], "host": "float32"}
    rec = records.arm_record(plan, "warm", 1, teacher=None, scores={"level1": [0.5]}, dynamics={}, ledger={"steps": 0})
    assert rec["config"] == plan and rec["config_hash"] == records.config_hash(plan)
    assert records.config_hash({"host": "float32", "eval_steps": [8], "steps": 8}) == rec["config_hash"]
    assert records.config_hash({**plan, "host": "bf16"}) != rec["config_hash"]  # bf16 hosts keep their own table
    path = records.write(tmp_path, rec)
    assert path == tmp_path / rec["config_hash"] / "warm-1.json"
    unit = records.write(tmp_path, records.unit_record(plan, 1, ["warm"], 42.04))
    assert unit == tmp_path / rec["config_hash"] / "unit-1.json" and json.loads(unit.read_text())["minutes"] == 42.0
    assert records.load(tmp_path, rec["config_hash"])[1] == json.loads(json.dumps(rec))
    assert isinstance(rec["cpu"]["flags"], list) and rec["commit"]


def test_the_pilot_fixes_s_at_the_first_step_with_30_percent_recovery():
    def along(arm: str, values: dict[int, float]) -> dict:
        return {**_arm(arm, 0, {"level1": [values[24]] * 2}), "along": {str(s): {"level1": [v] * 2}
                                                                         for s, v in values.items()}}
    recs = [_arm("warm", 0, {"level1": [0.2, 0.2]}), _arm("teacher_hint", 0, {"level1": [0.6, 0.6]}, once=True),
            along("opd_hint", {8: 0.24, 16: 0.36, 24: 0.5}), along("sft_more", {8: 0.2, 16: 0.22, 24: 0.3}),
            along("seqkd_hint", {8: 0.21, 16: 0.25, 24: 0.3})]
    out = records.pilot(recs, [8, 16, 24])
    assert out["gap"] == pytest.approx(0.4)
    assert out["curve"]["opd_hint"] == {8: pytest.approx(0.1), 16: pytest.approx(0.4), 24: pytest.approx(0.75)}
    assert out["curve"]["sft_more"][24] == pytest.approx(0.25) and "grpo" not in out["curve"]
    assert (out["S"], out["stop"]) == (16, False)
    slow = [r if r["arm"] != "opd_hint" else along("opd_hint", {8: 0.21, 16: 0.25, 24: 0.31}) for r in recs]
    assert (records.pilot(slow, [8, 16, 24])["S"], records.pilot(slow, [8, 16, 24])["stop"]) == (24, True)
    no_gap = [r if r["arm"] != "teacher_hint" else _arm("teacher_hint", 0, {"level1": [0.1, 0.1]}, once=True)
              for r in recs]
    assert records.pilot(no_gap, [8, 16, 24]) == {"gap": None, "curve": {}, "S": 24, "stop": True}


def test_a_candidate_passes_only_with_its_paired_interval_above_zero():
    warm = {"f1": 0.30, "scores": {f"t{i}": 0.0 for i in range(8)}}
    check = {**CHECK, "f1": 0.45, "scores": {f"t{i}": 1.0 if i < 4 else 0.0 for i in range(8)}}
    mean, lo, hi = paired_interval(check["scores"], warm["scores"])
    assert mean == 0.5 and 0.0 < lo <= hi <= 1.0
    assert judge(check, warm, GateLimits())["passed"]
    tied = {**check, "scores": {f"t{i}": 0.0 for i in range(8)}}  # the same F1 per task: the interval is [0, 0]
    result = judge(tied, warm, GateLimits())
    assert not result["passed"] and result["fails"] == ["paired F1 gain +0.000 [+0.000, +0.000] does not exclude 0"]
    assert judge(tied, warm, GateLimits(None, None, 1.0, 1.0))["passed"]  # --smoke: no F1 check, no interval


def test_a_rewritten_record_keeps_the_commit_that_made_it(tmp_path, monkeypatch):
    plan = {"steps": 8, "eval_steps": [8], "host": "float32"}
    make = lambda scores: records.arm_record(plan, "warm", 1, teacher=None, scores=scores, dynamics={},  # noqa: E731
                                             ledger={"steps": 0})
    monkeypatch.setattr(records, "commit", lambda: "a" * 40)
    path = records.write(tmp_path, make({"level1": [0.5]}))
    monkeypatch.setattr(records, "commit", lambda: "b" * 40)
    records.write(tmp_path, make({"level1": [0.5]}))
    assert json.loads(path.read_text())["commit"] == "a" * 40  # the same record from a later commit: unchanged
    records.write(tmp_path, make({"level1": [0.25]}))
    assert json.loads(path.read_text())["commit"] == "b" * 40 and records.load(tmp_path)[0]["scores"] == {
        "level1": [0.25]}

"""The learning benchmark's pure parts: the teacher gate on known measurements, and the summary and last line
built from a list of records (``bench/learning/records.py``), against the paired bootstrap on the same arrays."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.learning import records
from bench.learning.teachers import GateLimits, decision_gap, gate
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
    means = {"warm": 0.2, "momentum": 0.2, "sft_more": 0.25, "teacher_rl": 0.6, "teacher_hint": 0.5,
             "opd_rl": 0.3, "opd_hint": 0.35, "seqkd_rl": 0.28, "opd_t0": 0.2, "grpo": 0.3, "opd_grpo_hint": 0.4,
             "opd_persistent": 0.25}
    out, arrays = [], {}
    for arm, mean in means.items():
        # a fixed mean per cell plus noise that sums to zero over each seed's questions, so means are exact
        noise = rng.normal(0, 0.1, size=(2, 2, 4))
        noise -= noise.mean(axis=2, keepdims=True)
        cells = mean + noise
        arrays[arm] = cells
        teacher = {"opd_rl": "rl", "seqkd_rl": "rl", "opd_hint": "hint", "opd_t0": "t0", "opd_grpo_hint": "hint",
                   "opd_persistent": "rl"}.get(arm)
        out += [_arm(arm, s, {f"level{lv + 1}": cells[s, lv].tolist() for lv in range(2)}, teacher) for s in range(2)]
    out += [{"kind": "teacher", "teacher": t, "seed": s, "gate": {"passed": True}} for t in ("rl", "hint")
            for s in range(2)]
    return out, arrays


def _pair(arrays: dict[str, np.ndarray], a: str, b: str) -> tuple[float, float, float]:
    comps = lambda arm: {f"level{lv + 1}": arrays[arm][:, lv] for lv in range(2)}  # noqa: E731
    return cluster_bootstrap(comps(a), comps(b), n=2000)


def test_summary_is_the_paired_bootstrap_of_the_records_arrays():
    recs, arrays = _records(np.random.default_rng(0))
    s = records.summarize(recs)
    assert s["best"] == "rl"  # both passed the gate; T_rl's gap (0.4) is larger than T_hint's (0.3)
    assert s["gap_rl"] == _pair(arrays, "teacher_rl", "warm") and s["gap_rl"][0] == pytest.approx(0.4)
    assert s["gap_hint"][0] == pytest.approx(0.3)
    assert s["recovery_rl"] == pytest.approx(0.1 / 0.4) and s["recovery_hint"] == pytest.approx(0.15 / 0.3)
    assert s["opd_minus_sft_more"] == _pair(arrays, "opd_rl", "sft_more")
    assert s["opd_minus_seqkd"] == _pair(arrays, "opd_rl", "seqkd_rl")
    assert s["t0_minus_momentum"] == _pair(arrays, "opd_t0", "momentum")
    assert s["opd_rl_minus_rl"] == _pair(arrays, "opd_grpo_hint", "grpo")
    assert s["aligned_minus_persistent"] == _pair(arrays, "opd_rl", "opd_persistent")
    # dose: (gap, gain) = (0, 0), (0.4, 0.1), (0.3, 0.15) -> least-squares slope
    x, y = np.array([0.0, 0.4, 0.3]), np.array([0.0, 0.1, 0.15])
    want = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
    assert s["dose_slope"] == pytest.approx(want, abs=1e-12) and s["seeds"] == 2
    line = records.last_line(s)
    assert line.split()[0] == f"gap_rl={s['gap_rl'][0]:.3f}" and line.endswith(" seeds=2")
    assert [kv.split("=")[0] for kv in line.split()] == list(records.LAST_LINE)


def test_missing_records_read_na_and_a_failed_gate_leaves_its_teacher_out():
    recs, _ = _records(np.random.default_rng(1))
    recs = [r for r in recs if r.get("arm") not in ("opd_t0", "opd_grpo_hint", "teacher_hint", "opd_hint")]
    recs = [{**r, "gate": {"passed": False}} if r["kind"] == "teacher" and r["teacher"] == "rl" else r for r in recs]
    s = records.summarize(recs)
    assert s["best"] is None and s["opd_minus_sft_more"] is None and s["opd_minus_seqkd"] is None
    assert s["gap_hint"] is None and s["recovery_hint"] is None and s["t0_minus_momentum"] is None
    assert s["dose_slope"] is None  # one teacher with a gap and a gain: no slope
    line = records.last_line(s)
    assert "gap_hint=na" in line and "opd_minus_sft_more=na" in line and "t0_minus_momentum=na" in line
    assert "dose_slope=na" in line and line.endswith("seeds=2")


def test_a_model_evaluated_once_pairs_with_every_seed():
    warm = [_arm("warm", s, {"level1": [0.0, 1.0]}) for s in range(3)]
    teacher = [_arm("teacher_rl", 0, {"level1": [1.0, 1.0]}, once=True)]
    s = records.summarize(warm + teacher)
    assert s["gap_rl"][0] == pytest.approx(0.5)


def test_records_are_written_by_config_hash_and_loaded_back(tmp_path):
    plan = {"seeds": 3, "arms": ["warm"], "steps": 8, "lr": 2e-5, "hotpot": None, "squad": None}
    rec = records.arm_record(plan, "warm", 1, teacher=None, scores={"level1": [0.5]}, dynamics={}, ledger={"steps": 0})
    assert rec["config"] == {"lr": 2e-5, "steps": 8}  # seeds and arms do not change what a record measures
    assert rec["config_hash"] == records.config_hash({"lr": 2e-5, "steps": 8})
    assert records.config_hash({"steps": 8, "lr": 2e-5}) == rec["config_hash"]
    assert records.config_hash({"steps": 9, "lr": 2e-5}) != rec["config_hash"]
    path = records.write(tmp_path, rec)
    assert path == tmp_path / rec["config_hash"] / "warm-1.json"
    assert records.load(tmp_path, rec["config_hash"]) == [json.loads(json.dumps(rec))]
    assert isinstance(rec["cpu"]["flags"], list) and rec["commit"]


def test_the_pilot_fixes_s_at_the_first_step_with_30_percent_recovery():
    def along(arm: str, values: dict[int, float]) -> dict:
        return {**_arm(arm, 0, {"level1": [values[64]] * 2}), "along": {str(s): {"level1": [v] * 2}
                                                                         for s, v in values.items()}}
    recs = [_arm("warm", 0, {"level1": [0.2, 0.2]}), _arm("teacher_rl", 0, {"level1": [0.6, 0.6]}),
            _arm("teacher_hint", 0, {"level1": [0.1, 0.1]}),  # no gap: left out
            along("opd_rl", {8: 0.24, 24: 0.36, 64: 0.5}), along("sft_more", {8: 0.2, 24: 0.22, 64: 0.3}),
            along("grpo", {8: 0.21, 24: 0.25, 64: 0.3})]
    out = records.pilot(recs, [8, 24, 64])
    assert out["gap"] == {"rl": pytest.approx(0.4)}
    assert out["curve"]["opd_rl/rl"] == {8: pytest.approx(0.1), 24: pytest.approx(0.4), 64: pytest.approx(0.75)}
    assert out["curve"]["sft_more/rl"][64] == pytest.approx(0.25) and "opd_hint/hint" not in out["curve"]
    assert (out["S"], out["stop"]) == (24, False)
    slow = [r if r["arm"] != "opd_rl" else along("opd_rl", {8: 0.21, 24: 0.25, 64: 0.31}) for r in recs]
    assert (records.pilot(slow, [8, 24, 64])["S"], records.pilot(slow, [8, 24, 64])["stop"]) == (64, True)


def test_each_teachers_best_arm_on_the_ladder_goes_to_real_text():
    recs = [_arm("opd_rl", 0, {"level1": [0.4, 0.6], "level2": [0.5, 0.5]}, "rl"),
            _arm("opd_rl", 1, {"level1": [0.2, 0.2], "level2": [0.2, 0.2]}, "rl"),  # opd_rl: 0.35 over seeds
            _arm("seqkd_rl", 0, {"level1": [0.3, 0.3], "level2": [0.4, 0.4]}, "rl"),  # 0.35 -> 0.3 with seed 1
            _arm("seqkd_rl", 1, {"level1": [0.3, 0.3], "level2": [0.2, 0.2]}, "rl"),
            _arm("opd_hint", 0, {"level1": [0.1, 0.1], "level2": [0.1, 0.1]}, "hint"),
            _arm("opd_hint@real", 0, {"hotpotqa": [0.9, 0.9]}, "hint"),  # an evaluation, never a candidate
            _arm("sft_more", 0, {"level1": [0.9, 0.9], "level2": [0.9, 0.9]})]  # no teacher
    assert records.best_arms(recs) == {"hint": "opd_hint", "rl": "opd_rl"}


def test_the_real_text_table_pairs_the_best_arms_with_sft_more_and_base():
    real = {"hotpotqa": [0.5, 0.0, 1.0, 0.5], "ruler10": [0.25, 0.25, 0.0, 0.5]}
    recs = [_arm("base", 0, {"level1": [0.0] * 4, **{c: [x - 0.25 for x in v] for c, v in real.items()}}, once=True),
            _arm("sft_more", 0, {"level1": [0.2] * 4, **real}),
            _arm("opd_rl", 0, {"level1": [0.5] * 4}, "rl"),
            _arm("opd_rl@real", 0, {c: [x + 0.125 for x in v] for c, v in real.items()}, "rl")]
    base, sft_more, best = records.real_text(recs, n=200)
    assert [r["arm"] for r in (base, sft_more, best)] == ["base", "sft_more", "opd_rl@real"]
    assert best["teacher"] == "rl" and best["f1"] == {"hotpotqa": 0.625, "ruler10": 0.375}
    assert sft_more["f1"] == {"hotpotqa": 0.5, "ruler10": 0.25} and sft_more["minus_sft_more"] is None
    assert best["minus_sft_more"] == pytest.approx((0.125, 0.125, 0.125))  # the same shift on every question
    assert best["minus_base"] == pytest.approx((0.375, 0.375, 0.375)) and base["minus_base"] is None

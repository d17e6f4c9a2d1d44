"""Results that outlive a machine: one small JSON record per finished arm-seed (and per validated teacher), and
the last line built from a list of them.

A record holds the plan's config and its hash (records of one hash add up to one table, whatever day or machine
made them), the commit, the CPU's model and flags (``/proc/cpuinfo``: a seed's arms must share them for their
pairing to hold), the per-question held-out F1 (sorted by task id, so arms pair up), the dynamics summary and
the two ledgers (student steps; compute: rollout, teacher-forward and student tokens and wall seconds).
``summarize`` and ``last_line`` are pure functions of the records: the report reads nothing else.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from envs.metrics import cluster_bootstrap

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "bench" / "results" / "learning" / "records"
# the last line's terms (issue: gap_hint= recovery_hint= opd_minus_sft_more= opd_minus_seqkd= opd_rl_minus_rl= seeds=
# minutes_per_seed=)
LAST_LINE = ("gap_hint", "recovery_hint", "opd_minus_sft_more", "opd_minus_seqkd", "opd_rl_minus_rl", "seeds",
             "minutes_per_seed")


def config_of(plan: dict) -> dict:
    """The part of a plan (``asdict(campaign.Plan)``) that sets what an arm-seed measures: all of it."""
    return dict(sorted(plan.items()))


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:12]


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def cpu() -> dict:
    """The CPU's model name and flags (the first processor of ``/proc/cpuinfo``; empty elsewhere)."""
    model, flags = "", []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() == "flags":
                flags = sorted(value.split())
                break
    except OSError:
        pass
    return {"model": model, "flags": flags}


def arm_record(plan: dict, arm: str, seed: int, *, teacher: str | None, scores: dict[str, list[float]],
               dynamics: dict, ledger: dict, once: bool = False, extra: dict | None = None) -> dict:
    """One finished arm-seed. ``scores``: held-out F1 per question per component; ``once``: a model that no
    training seed changes (base, a teacher trained from the base model), paired with every seed."""
    config = config_of(plan)
    return {"kind": "arm", "arm": arm, "seed": seed, "once": once, "teacher": teacher, "config": config,
            "config_hash": config_hash(config), "commit": commit(), "cpu": cpu(), "scores": scores,
            "dynamics": dynamics, "ledger": ledger, **(extra or {})}


def unit_record(plan: dict, seed: int, arms: list[str], minutes: float, whole: bool = True) -> dict:
    """One seed's unit of work: its arms and its wall minutes on this machine. ``whole``: one process ran it from
    its warm start to its last arm; a unit resumed after a kill counts only the minutes of its last process."""
    config = config_of(plan)
    return {"kind": "unit", "seed": seed, "arms": arms, "minutes": round(minutes, 1), "whole": whole,
            "config": config, "config_hash": config_hash(config), "commit": commit(), "cpu": cpu()}


def write(folder: Path, record: dict) -> Path:
    """``folder/HASH/ARM-SEED.json``, or ``unit-SEED.json`` for a seed's unit. A rerun of the same arm-seed
    replaces its record, unless only the commit differs: a resumed unit rewrites its finished arms from its state,
    and their commit stays the one whose code made them."""
    name = record["arm"] if record["kind"] == "arm" else "unit"
    path = folder / record["config_hash"] / f"{name}-{record['seed']}.json"
    text = json.dumps(record, indent=1, sort_keys=True, default=float) + "\n"
    if path.exists():
        old = json.loads(path.read_text())
        if {**old, "commit": None} == json.loads(json.dumps({**record, "commit": None}, default=float)):
            return path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def load(folder: Path, config_hash: str | None = None) -> list[dict]:
    """Every record under ``folder`` (of one config hash when given)."""
    root = folder / config_hash if config_hash else folder
    return [json.loads(p.read_text()) for p in sorted(root.rglob("*.json"))]


def dynamics(steps: list[dict]) -> dict:
    """What a record keeps of an arm's training steps (their ``metrics``): the steps, the share of live GRPO
    groups, the last KL to the teacher, the largest KL to the round's start, the largest first-token EOS mass
    and the mean output length over call kinds (None where no step logged it)."""
    def values(key: str) -> list[float]:
        return [v for m in steps for k, v in m.items() if (k.startswith(key) if key.endswith("/") else k == key)]
    groups = sum(m.get("rl_groups", 0.0) for m in steps)
    kl_teacher, kl_start, eos, length = values("kl_teacher"), values("kl_start"), values("eos_first/"), values("out_len/")
    return {"steps": len(steps),
            "rl_live": sum(m.get("rl_groups_live", 0.0) for m in steps) / groups if groups else None,
            "kl_teacher_last": kl_teacher[-1] if kl_teacher else None, "kl_start_max": max(kl_start, default=None),
            "eos_first_max": max(eos, default=None), "out_len_mean": float(np.mean(length)) if length else None}


# -- the summary: a pure function of the records ---------------------------------------------------------

Interval = tuple[float, float, float]


def _by_arm(records: Iterable[dict]) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    for r in records:
        if r["kind"] == "arm":
            out.setdefault(r["arm"], {})[int(r["seed"])] = r
    return out


def _matrix(arm: dict[int, dict], seeds: list[int], real: bool = False) -> dict[str, np.ndarray]:
    """[seeds, questions] per held-out ladder component (``real``: per real-text component); one row for a model
    evaluated once."""
    rows = [next(iter(arm.values()))] if _once(arm) else [arm[s] for s in seeds]
    comps = sorted(c for c in rows[0]["scores"] if c.startswith("level") != real)
    return {c: np.array([r["scores"][c] for r in rows], dtype=np.float64) for c in comps}


def _once(arm: dict[int, dict]) -> bool:
    return any(r.get("once") for r in arm.values())


def paired(arms: dict[str, dict[int, dict]], a: str, b: str, n: int = 2000, real: bool = False) -> Interval | None:
    """``a - b`` over the seeds both have (a model evaluated once pairs with every seed), paired by question
    and seed (``cluster_bootstrap``), on the held-out ladder (``real``: on real text); None when either arm has no
    record."""
    if a not in arms or b not in arms:
        return None
    once_a, once_b = _once(arms[a]), _once(arms[b])
    seeds = sorted(arms[b] if once_a else arms[a]) if once_a != once_b else sorted(set(arms[a]) & set(arms[b]))
    if not seeds:
        return None
    return cluster_bootstrap(_matrix(arms[a], seeds, real), _matrix(arms[b], seeds, real), n=n)


def summarize(records: list[dict], n: int = 2000) -> dict:
    """The last line's terms (each ``(mean, lo, hi)``, a number, or None where its records are missing): the hint
    teacher's gap over the warm start, the share of it OPD recovers, OPD against SFT continued and against SeqKD,
    the RL term with the teacher in its advantage against the RL term alone, the seeds whose unit finished (every
    arm recorded; a seed with only some arms adds its records to the comparisons but is not counted) and the mean
    minutes of a finished unit run whole (a resumed unit's minutes miss its killed part)."""
    arms = _by_arm(records)
    gap = paired(arms, "teacher_hint", "warm", n)
    gain = paired(arms, "opd_hint", "warm", n)
    units = [r["minutes"] for r in records if r["kind"] == "unit" and r.get("whole", True)]
    return {"gap_hint": gap, "recovery_hint": gain[0] / gap[0] if gap and gain and gap[0] > 0 else None,
            "opd_minus_sft_more": paired(arms, "opd_hint", "sft_more", n),
            "opd_minus_seqkd": paired(arms, "opd_hint", "seqkd_hint", n),
            "opd_rl_minus_rl": paired(arms, "opd_grpo_hint", "grpo", n),
            "seeds": len({int(r["seed"]) for r in records if r["kind"] == "unit"}), "minutes_per_seed": float(np.mean(units)) if units else None}


def last_line(summary: dict) -> str:
    """``gap_rl= ... seeds=``: each term's mean to 3 decimals, ``na`` where its records are missing."""
    def value(v: object) -> str:
        if v is None:
            return "na"
        if isinstance(v, tuple | list):
            v = v[0]
        return str(v) if isinstance(v, int) else f"{float(v):.3f}"  # type: ignore[arg-type]
    return " ".join(f"{k}={value(summary[k])}" for k in LAST_LINE)


def _mean(scores: dict[str, list[float]]) -> float | None:
    values = [v for c, xs in scores.items() if c.startswith("level") for v in xs]
    return float(np.mean(values)) if values else None


def pilot(records: list[dict], steps: list[int], threshold: float = 0.3) -> dict:
    """The gap-recovery pilot from its records: the hint teacher's gap (held-out F1 over the warm start's) and
    per arm the recovery ``(arm - warm) / (teacher - warm)`` at each step its run was evaluated at (``curve``).
    ``S``: the first step where ``opd_hint`` recovers at least ``threshold`` of the gap, else the last step;
    ``stop``: it never did (the stopping rule: run nothing more)."""
    arms = _by_arm(records)
    warm = [m for r in arms.get("warm", {}).values() if (m := _mean(r["scores"])) is not None]
    out: dict = {"gap": None, "curve": {}, "S": max(steps), "stop": True}
    gap = paired(arms, "teacher_hint", "warm")
    if not warm or gap is None or gap[0] <= 0:
        return out
    out["gap"] = gap[0]

    def at(arm: str, step: int) -> float | None:
        values = [m for r in arms.get(arm, {}).values() if (m := _mean(r.get("along", {}).get(str(step), {})))
                  is not None]
        return float(np.mean(values)) if values else None

    for arm in ("opd_hint", "sft_more", "seqkd_hint", "grpo", "opd_grpo_hint", "momentum"):
        points = {s: (m - float(np.mean(warm))) / gap[0] for s in steps if (m := at(arm, s)) is not None}
        if points:
            out["curve"][arm] = points
    reached = [s for s in steps if out["curve"].get("opd_hint", {}).get(s, -1.0) >= threshold]
    if reached:
        out["S"], out["stop"] = min(reached), False
    return out

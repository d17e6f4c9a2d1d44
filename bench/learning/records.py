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
# plan fields that do not change what a record measures: more seeds and arms add records to the same table
UNHASHED = ("arms", "seeds", "hotpot", "squad")
# the OPD arm of each teacher (T0: the warm start itself; sft: the teacher SFT'd longer on oracle calls)
OPD_ARM = {"t0": "opd_t0", "sft": "opd_aligned", "rl": "opd_rl", "hint": "opd_hint"}
SEQKD_ARM = {"sft": "seqkd", "rl": "seqkd_rl", "hint": "seqkd_hint"}
TEACHER_ARM = {"sft": "teacher_ladder", "rl": "teacher_rl", "hint": "teacher_hint"}
LAST_LINE = ("gap_rl", "gap_hint", "recovery_rl", "recovery_hint", "opd_minus_sft_more", "opd_minus_seqkd",
             "t0_minus_momentum", "opd_rl_minus_rl", "aligned_minus_persistent", "dose_slope", "seeds")


def config_of(plan: dict) -> dict:
    """The part of a plan (``asdict(Plan)``) that sets what an arm-seed measures."""
    return {k: v for k, v in sorted(plan.items()) if k not in UNHASHED}


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


def teacher_record(plan: dict, teacher: str, seed: int, gate: dict) -> dict:
    """One validated teacher: its gate (``teachers.gate``) on validation, passed or not."""
    config = config_of(plan)
    return {"kind": "teacher", "teacher": teacher, "seed": seed, "config": config, "config_hash": config_hash(config),
            "commit": commit(), "cpu": cpu(), "gate": gate}


def write(folder: Path, record: dict) -> Path:
    """``folder/HASH/ARM-SEED.json``, or ``gate_TEACHER-SEED.json`` for a teacher's gate (a rerun of the same
    arm-seed replaces its record)."""
    name = record["arm"] if record["kind"] == "arm" else f"gate_{record['teacher']}"
    path = folder / record["config_hash"] / f"{name}-{record['seed']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, sort_keys=True, default=float) + "\n")
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


REAL = "@real"  # the record of an arm's real-text evaluation: ARM@real (its ladder record stays ARM)


def best_arms(records: Iterable[dict]) -> dict[str, str]:
    """Per teacher, the arm that learns from it with the highest held-out ladder F1 (mean over its seeds and
    questions): the one evaluated on real text for that teacher."""
    scored: dict[str, list[tuple[float, str]]] = {}
    for arm, seeds in _by_arm(records).items():
        teacher = next(iter(seeds.values())).get("teacher")
        means = [m for r in seeds.values()
                 if (m := _mean({c: v for c, v in r["scores"].items() if c.startswith("level")})) is not None]
        if teacher is not None and not arm.endswith(REAL) and means:
            scored.setdefault(teacher, []).append((float(np.mean(means)), arm))
    return {t: max(v)[1] for t, v in sorted(scored.items())}


def real_text(records: Iterable[dict], n: int = 2000) -> list[dict]:
    """The real-text table: base, ``sft_more`` and each teacher's best arm (``best_arms``), each with its mean F1
    per real-text component and its difference to ``sft_more`` and to base (paired, with intervals)."""
    records = list(records)
    arms = _by_arm(records)
    rows = []
    for name, teacher in [("base", None), ("sft_more", None), *((a + REAL, t) for t, a in best_arms(records).items())]:
        if name not in arms:
            continue
        seeds = sorted(arms[name])
        means = {c: float(m.mean()) for c, m in _matrix(arms[name], seeds, real=True).items()}
        rows.append({"arm": name, "teacher": teacher, "seeds": len(seeds), "f1": means,
                     "minus_sft_more": None if name == "sft_more" else paired(arms, name, "sft_more", n, real=True),
                     "minus_base": None if name == "base" else paired(arms, name, "base", n, real=True)})
    return rows


def _passed(records: Iterable[dict], teacher: str) -> bool:
    """Whether every stored gate of ``teacher`` passed (no record: not gated, so not passed)."""
    gates = [r["gate"]["passed"] for r in records if r["kind"] == "teacher" and r["teacher"] == teacher]
    return bool(gates) and all(gates)


def summarize(records: list[dict], n: int = 2000) -> dict:
    """The last line's terms (each ``(mean, lo, hi)``, a number, or None where its records are missing) and
    the teacher the comparisons use. ``best``: of ``T_rl`` and ``T_hint``, the one whose gate passed with
    the larger pre-measured gap (its held-out F1 over the warm start's, measured before any student trains)."""
    arms = _by_arm(records)
    gaps: dict[str, Interval | None] = {"t0": (0.0, 0.0, 0.0) if "opd_t0" in arms else None}
    gaps |= {t: paired(arms, TEACHER_ARM[t], "warm", n) for t in ("sft", "rl", "hint")}
    gains = {t: paired(arms, OPD_ARM[t], "warm", n) for t in OPD_ARM}
    recovery = {t: (gains[t][0] / gaps[t][0]) if gains[t] and gaps[t] and gaps[t][0] > 0 else None
                for t in ("rl", "hint")}
    usable = [t for t in ("rl", "hint") if gaps[t] and OPD_ARM[t] in arms and _passed(records, t)]
    best = max(usable, key=lambda t: gaps[t][0]) if usable else None  # type: ignore[index]
    points = [(gaps[t][0], gains[t][0]) for t in OPD_ARM if gaps[t] and gains[t]]  # type: ignore[index]
    slope = float(np.polyfit(*zip(*points, strict=True), 1)[0]) if len({x for x, _ in points}) >= 2 else None
    persistent = next(iter(arms.get("opd_persistent", {}).values()), {}).get("teacher")
    return {
        "gap_rl": gaps["rl"], "gap_hint": gaps["hint"], "recovery_rl": recovery["rl"],
        "recovery_hint": recovery["hint"],
        "opd_minus_sft_more": paired(arms, OPD_ARM[best], "sft_more", n) if best else None,
        "opd_minus_seqkd": paired(arms, OPD_ARM[best], SEQKD_ARM[best], n) if best else None,
        "t0_minus_momentum": paired(arms, "opd_t0", "momentum", n),
        "opd_rl_minus_rl": paired(arms, "opd_grpo_hint", "grpo", n),
        "aligned_minus_persistent": (paired(arms, OPD_ARM[persistent], "opd_persistent", n)
                                     if persistent in OPD_ARM else None),
        "dose_slope": slope, "seeds": len(arms.get("warm", {})), "best": best,
        "dose": {t: [gaps[t][0], gains[t][0]] for t in OPD_ARM if gaps[t] and gains[t]},  # type: ignore[index]
    }


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
    """The gap-recovery pilot from its records: per teacher (T_rl, T_hint) its gap (held-out F1 over the warm
    start's), and per arm the recovery ``(arm - warm) / (teacher - warm)`` at each step its run was evaluated at
    (``curve``, keyed ``ARM/TEACHER``: OPD from that teacher, and sft_more and grpo against the same gap). ``S``:
    the first step where OPD recovers at least ``threshold`` of a teacher's gap, else the last step; ``stop``:
    no teacher reached it (the stopping rule: run nothing more)."""
    arms = _by_arm(records)
    warm = [m for r in arms.get("warm", {}).values() if (m := _mean(r["scores"])) is not None]
    out: dict = {"gap": {}, "curve": {}, "S": max(steps), "stop": True}
    if not warm:
        return out

    def at(arm: str, step: int) -> float | None:
        values = [m for r in arms.get(arm, {}).values() if (m := _mean(r.get("along", {}).get(str(step), {})))
                  is not None]
        return float(np.mean(values)) if values else None

    for t in ("rl", "hint"):
        gap = paired(arms, TEACHER_ARM[t], "warm")
        if gap is None or gap[0] <= 0:
            continue
        out["gap"][t] = gap[0]
        for arm in (OPD_ARM[t], "sft_more", "grpo"):
            points = {s: (m - float(np.mean(warm))) / gap[0] for s in steps if (m := at(arm, s)) is not None}
            if points:
                out["curve"][f"{arm}/{t}"] = points
    reached = [s for s in steps for t in out["gap"] if out["curve"].get(f"{OPD_ARM[t]}/{t}", {}).get(s, -1.0)
               >= threshold]
    if reached:
        out["S"], out["stop"] = min(reached), False
    return out

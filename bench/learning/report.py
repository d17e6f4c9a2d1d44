"""``bench/results/learning/REPORT.md``: built from the committed records alone (``records``), never from a
work folder. The last line and its intervals, the held-out table, the recovery curve, the dynamics, the two
ledgers (equal steps, equal compute), the teacher's fit and the units' minutes. Records of one config hash make
one table; bf16 and float32 hosts never share one (the host kind is in the hash)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bench.learning import records, suite
from envs.metrics import cluster_bootstrap

RESULTS = records.ROOT / "bench" / "results" / "learning"


def fmt(v: object) -> str:
    if v is None:
        return "na"
    if isinstance(v, tuple | list):
        return f"{v[0]:+.3f} [{v[1]:+.3f}, {v[2]:+.3f}]"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _arm_order(names: set[str]) -> list[str]:
    return [a.name for a in suite.ARMS if a.name in names]


def heldout_table(recs: list[dict]) -> str:
    arms = records._by_arm(recs)
    rows = ["| arm | seeds | held-out F1 [95%] | per level | minus warm (paired) | max empty rate | (empty) after "
            "evidence | first reads, evidence / other |", "|---|---:|---|---|---|---:|---:|---|"]
    for name in _arm_order(set(arms)):
        seeds = sorted(arms[name])
        m = records._matrix(arms[name], seeds)
        mean = cluster_bootstrap(m, n=2000)
        per = ", ".join(f"{c[5:]}: {v.mean():.3f}" for c, v in m.items())
        vs = fmt(records.paired(arms, name, "warm")) if name != "warm" and "warm" in arms else ""
        empty = max((v for r in arms[name].values() for comp in r.get("empty", {}).values() for v in comp.values()),
                    default=0.0)
        forgot = [v for r in arms[name].values() for v in r.get("empty_after_evidence", {}).values() if v is not None]
        reads = [d for r in arms[name].values() for d in r.get("first_reads", {}).values() if d]
        ev = [d["evidence"] for d in reads if "evidence" in d]
        ot = [d["other"] for d in reads if "other" in d]
        read_s = f"{np.mean(ev):.2f} / {np.mean(ot):.2f}" if ev and ot else ""
        rows.append(f"| {name} | {len(seeds)} | {fmt(tuple(mean))} | {per} | {vs} | {empty:.3f}"
                    f"{' (over 0.02)' if empty > 0.02 else ''} | {max(forgot) if forgot else 0:.2f} | {read_s} |")
    return "\n".join(rows)


def dynamics_table(recs: list[dict]) -> str:
    arms = records._by_arm(recs)
    rows = ["| arm | steps | RL live | last KL to teacher | max KL to round start | max first-token EOS | mean output "
            "length |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name in _arm_order(set(arms)):
        ds = [r["dynamics"] for r in arms[name].values() if r["dynamics"].get("steps")]
        if not ds:
            continue

        def mean(key: str, ds: list[dict] = ds) -> str:
            vals = [d[key] for d in ds if d.get(key) is not None]
            return f"{np.mean(vals):.3f}" if vals else "-"
        rows.append(f"| {name} | {ds[0]['steps']} | {mean('rl_live')} | {mean('kl_teacher_last')} | "
                    f"{mean('kl_start_max')} | {mean('eos_first_max')} | {mean('out_len_mean')} |")
    return "\n".join(rows)


def ledger_table(recs: list[dict]) -> str:
    arms = records._by_arm(recs)
    rows = ["| arm | seeds | student steps | rollout tokens | teacher-forward tokens | student tokens | wall s |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for name in _arm_order(set(arms)):
        ls = [r["ledger"] for r in arms[name].values()]
        mean = {k: np.mean([x.get(k) or 0 for x in ls]) for k in ("steps", "rollout_tokens", "teacher_forward_tokens",
                                                                   "student_tokens", "wall_seconds")}
        rows.append(f"| {name} | {len(ls)} | {mean['steps']:.0f} | {mean['rollout_tokens']:.0f} | "
                    f"{mean['teacher_forward_tokens']:.0f} | {mean['student_tokens']:.0f} | {mean['wall_seconds']:.0f} |")
    return "\n".join(rows)


def recovery_table(curve: dict) -> str:
    steps = sorted({s for points in curve["curve"].values() for s in points})
    rows = ["| arm | " + " | ".join(f"{s} steps" for s in steps) + " |", "|---|" + "---:|" * len(steps)]
    for name, points in curve["curve"].items():
        rows.append(f"| {name} | " + " | ".join(f"{points[s]:+.2f}" if s in points else "" for s in steps) + " |")
    gap = "none above 0" if curve["gap"] is None else f"{curve['gap']:+.3f}"
    rule = ("**Stop**: OPD did not recover 30% of the gap by the last step; run nothing more." if curve["stop"]
            else f"S = {curve['S']} steps: the first point where OPD recovers at least 30% of the gap.")
    return f"The hint teacher's gap over the warm start: {gap}.\n\n" + "\n".join(rows) + f"\n\n{rule}"


def teacher_section(fit: dict | None) -> str:
    if fit is None:
        return "No teacher fit is committed (`python -m bench.learning.teacher_fit`)."
    rows = ["| SFT step | validation F1 | paired F1 over warm [95%] | decision gap | max empty | max EOS@1 | gate |",
            "|---:|---:|---|---:|---:|---:|---|"]
    for st in fit["stages"]:
        g = st["gate"]
        gap = "na" if g["decision_gap"] is None else f"{g['decision_gap']:.2f}"
        rows.append(f"| {st['step']} | {st['f1']:.3f} | {fmt(g['paired_f1'])} | {gap} | {g['max_empty']:.3f} | "
                    f"{g['max_eos_first']:.3f} | {'passed' if g['passed'] else '; '.join(g['fails'])} |")
    p = fit["plan"]
    picked = f"picked at step {fit['picked']}" if fit["picked"] else "no candidate passed"
    return (f"LoRA rank {p['lora_rank']} SFT under the {p['context']} prompt at {p['lr']} (constant), validated every "
            f"{p['stage']} steps on {p['val_episodes']} level-{p['val_level']} episodes against the warm start "
            f"(F1 {fit['warm']['f1']:.3f}); {picked}. CPU: {fit['cpu']['model']}, commit {fit['commit'][:7]}.\n\n"
            + "\n".join(rows))


def plot_recovery(curve: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for name, points in curve["curve"].items():
        steps = sorted(points)
        ax.plot(steps, [points[s] for s in steps], marker="o", label=name)
    ax.axhline(0.3, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("student steps")
    ax.set_ylabel("gap recovery (arm - warm) / (teacher - warm)")
    if curve["curve"]:
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def build(recs: list[dict], fit: dict | None, title: str) -> str:
    """The report of one config hash's records (and the teacher fit): pure, reads nothing."""
    summary = records.summarize(recs)
    cfg = recs[0]["config"] if recs else {}
    units = sorted((r for r in recs if r["kind"] == "unit"), key=lambda r: r["seed"])
    cpus = sorted({r["cpu"]["model"] for r in recs})
    text = [f"# {title}", "", f"`{records.last_line(summary)}`", "",
            "\n".join(f"- `{k}`: {fmt(summary[k])}" for k in records.LAST_LINE), "",
            f"Config {recs[0]['config_hash'] if recs else '-'}: S = {cfg.get('steps')} student steps, evaluated at "
            f"{cfg.get('eval_steps')}, {cfg.get('heldout_per_level')} held-out questions per level "
            f"{cfg.get('heldout_levels')}, host {cfg.get('host')} ({', '.join(cpus) or '-'}). Intervals resample "
            "questions and seeds (paired where two arms are compared).", "",
            "## Held-out ladder", "", heldout_table(recs), "",
            "## Dynamics (mean over seeds)", "", dynamics_table(recs), "",
            "## Ledgers (mean per arm-seed): equal steps, and the compute behind them", "", ledger_table(recs), ""]
    along = sorted({int(s) for r in recs if r["kind"] == "arm" for s in r.get("along", {})})
    if len(along) > 1:
        text += ["## Gap recovery", "", recovery_table(records.pilot(recs, along)), ""]
    text += ["## The teacher", "", teacher_section(fit), "",
             "## Units", "", "\n".join(f"- seed {u['seed']}: {u['minutes']} min"
                                       f"{'' if u.get('whole', True) else ' (resumed: its last process only)'}"
                                       f" ({', '.join(u['arms'])})"
                                       for u in units) or "none yet", ""]
    return "\n".join(text)


def write(folder: Path = RESULTS) -> list[Path]:
    """``REPORT.md`` (and ``recovery.png`` where a pilot curve exists) for every config hash of the records."""
    fit_path = folder / "teacher" / "hint" / "record.json"
    fit = json.loads(fit_path.read_text()) if fit_path.is_file() else None
    out = []
    all_recs = [r for r in records.load(folder / "records") if r["kind"] in ("arm", "unit")]
    hashes = sorted({r["config_hash"] for r in all_recs})
    parts = []
    for h in hashes:
        recs = [r for r in all_recs if r["config_hash"] == h]
        along = sorted({int(s) for r in recs if r["kind"] == "arm" for s in r.get("along", {})})
        kind = "pilot" if len(along) > 1 else "seeds"
        parts.append(build(recs, fit, f"Learning plan, {kind} (config {h})"))
        if len(along) > 1:
            png = folder / f"recovery-{h}.png"
            plot_recovery(records.pilot(recs, along), png)
            out.append(png)
    report = folder / "REPORT.md"
    report.write_text("\n\n".join(parts) if parts else "# Learning plan\n\nNo records yet.\n\n## The teacher\n\n"
                      + teacher_section(fit) + "\n")
    return [report, *out]

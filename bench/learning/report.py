"""The report: tables, intervals and the dynamics plot of a finished folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bench.learning import records
from bench.learning.arms import Bench
from bench.learning.plan import ARMS, RL_ARMS, teacher_keys
from envs.metrics import cluster_bootstrap
from store import repository as repo


def stack(evals: list[dict], components: list[str]) -> dict[str, np.ndarray]:
    """[seeds, questions] per component."""
    return {c: np.array([e["scores"][c] for e in evals]) for c in components}


def diff(a: dict, b: dict) -> tuple[float, float, float]:
    return cluster_bootstrap(a, b, n=2000)


def fmt(d: tuple[float, float, float]) -> str:
    return f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]"


def step_metrics(store, runs: list[str]) -> list[dict]:
    """The metrics of every training step of the runs, in order (one read for the report's step statistics)."""
    with store.session() as s:
        return [st.metrics for rid in runs for st in repo.list_train_steps(s, rid)]


def live_fraction(steps: list[dict]) -> float | None:
    """Groups with a non-zero advantage over every step (None when no step had RL groups)."""
    groups = sum(m.get("rl_groups", 0.0) for m in steps)
    live = sum(m.get("rl_groups_live", 0.0) for m in steps)
    return live / groups if groups else None


def step_mean(steps: list[dict], key: str) -> float | None:
    """A step metric's mean over the steps that logged it (None when none did): ``kd_gated_fraction``, the
    teacher term's token weight left out by ``teacher_min_confidence``; ``kd_shared_fraction``, the share of
    the teacher's first-token push that ``teacher_centering`` removed."""
    shares = [m[key] for m in steps if key in m]
    return float(np.mean(shares)) if shares else None


def report(bench: Bench, results: dict) -> tuple[str, str]:
    """The tables (markdown, ``WORK/learning.md``) and the last line; the values behind them go to
    ``WORK/learning.json``: per arm (``arms``), per teacher (``teachers``), the paired ``differences``
    (mean, low, high), and how it ran (``mixed_precision``, ``momentum``: ``coast`` or ``warm_start``)."""
    p = bench.plan
    ladder = [f"level{lv}" for lv in p.heldout_levels]
    scores = {arm: stack(r["evals"], ladder) for arm, r in results.items() if r["ladder"]}
    base = scores["base"]
    lines = ["| arm | seeds | held-out F1, levels " + ",".join(map(str, p.heldout_levels)) + " [95%] | "
             + " | ".join(ladder) + " | vs warm (paired) | vs base (paired) | max empty rate | (empty) after "
             "evidence | RL live | teacher gated | push shared |",
             "|---|---:|---|" + "---:|" * len(ladder) + "---|---|---:|---:|---:|---:|---:|"]
    values: dict = {"arms": {}, "teachers": {}, "differences": {}, "mixed_precision": bench.mixed(),
                    "momentum": "coast" if p.coasts else "warm_start"}
    for arm in [a for a in ARMS if a in scores]:
        s = scores[arm]
        mean = cluster_bootstrap(s, n=2000)
        per = " | ".join(f"{s[c].mean():.3f}" for c in ladder)
        vs_warm = fmt(diff(s, scores["warm"])) if arm not in ("base", "warm") and "warm" in scores else ""
        vs_base = fmt(diff(s, base)) if arm != "base" else ""
        empty = max((v for e in results[arm]["evals"] for comp in e["empty"].values() for v in comp.values()), default=0)
        flag = " (collapsed)" if empty > 0.02 else ""
        forgot = [v for e in results[arm]["evals"] for v in e.get("forgot", {}).values() if v is not None]
        forgot_s = f"{max(forgot):.2f}" if forgot else ""
        live = results[arm].get("live")
        live_s = "" if live is None else (f"{live:.2f}" + (" (dead: no signal)" if live == 0 else ""))
        gated_s, shared_s = ("" if (v := results[arm].get(k)) is None else f"{v:.2f}" for k in ("gated", "shared"))
        values["arms"][arm] = {"seeds": len(results[arm]["evals"]), "f1": list(mean),
                               "levels": {c: float(s[c].mean()) for c in ladder}, "max_empty": empty,
                               "empty_after_evidence": max(forgot) if forgot else None, "rl_live": live,
                               "teacher_gated": results[arm].get("gated"), "push_shared": results[arm].get("shared")}
        lines.append(f"| {arm} | {len(results[arm]['evals'])} | {mean[0]:.3f} [{mean[1]:.3f}, {mean[2]:.3f}] | {per} | "
                     f"{vs_warm} | {vs_base} | {empty:.3f}{flag} | {forgot_s} | {live_s} | {gated_s} | {shared_s} |")
    table = "\n".join(lines)
    real = {arm: r for arm, r in results.items() if r["real"]}
    real_table = ""
    hotpot_d = (float("nan"),) * 3
    if real and p.hotpot:
        comps = ["hotpotqa", "ruler10"]
        rs = {arm: stack(r["evals"], comps) for arm, r in real.items()}
        rows = ["| arm | hotpotqa (gold paragraphs) | ruler_hotpotqa, 10 docs | both vs base (paired) |",
                "|---|---:|---:|---|"]
        for arm in [a for a in ARMS if a in rs]:
            d = fmt(diff(rs[arm], rs["base"])) if arm != "base" else ""
            rows.append(f"| {arm} | {rs[arm]['hotpotqa'].mean():.3f} | {rs[arm]['ruler10'].mean():.3f} | {d} |")
        real_table = "\n".join(rows)
        trained = "squad_opd" if "squad_opd" in rs else ("opd_aligned" if "opd_aligned" in rs else None)
        if trained:
            hotpot_d = diff(rs[trained], rs["base"])

    def d(a: str, b: str) -> tuple[float, float, float]:
        return diff(scores[a], scores[b]) if a in scores and b in scores else (float("nan"),) * 3

    lives = [results[a]["live"] for a in RL_ARMS if a in results and results[a].get("live") is not None]
    live = float(np.mean(lives)) if lives else float("nan")
    split = (f"aligned_minus_persistent_update={d('opd_aligned', 'opd_persistent_update')[0]:.3f} "
             f"aligned_minus_persistent_answer={d('opd_aligned', 'opd_persistent_answer')[0]:.3f}")
    last = (f"warm_minus_base={d('warm', 'base')[0]:.3f} aligned_minus_warm={d('opd_aligned', 'warm')[0]:.3f} "
            f"aligned_minus_persistent={d('opd_aligned', 'opd_persistent')[0]:.3f} "
            f"opd_rl_minus_rl={d('opd_grpo', 'grpo')[0]:.3f} rl_live_fraction={live:.2f} "
            f"hotpot_trained_minus_base={hotpot_d[0]:.3f} seeds={p.seeds}")
    differences = (
        ("warm_minus_base", d("warm", "base")), ("aligned_minus_warm", d("opd_aligned", "warm")),
        ("aligned_minus_persistent", d("opd_aligned", "opd_persistent")),
        ("aligned_minus_persistent_update (context on update calls only)", d("opd_aligned", "opd_persistent_update")),
        ("aligned_minus_persistent_answer (context on answer calls only)", d("opd_aligned", "opd_persistent_answer")),
        ("opd_rl_minus_rl", d("opd_grpo", "grpo")),
        ("rl_minus_momentum (the RL term against the warm start's momentum alone)", d("grpo", "momentum")),
        ("aligned_minus_momentum (the teacher term against the warm start's momentum alone)", d("opd_aligned", "momentum")),
        ("momentum_minus_warm (what the carried AdamW state alone does)", d("momentum", "warm")),
        ("privileged_rl_minus_rl (the privileged teacher's term beside the RL term, against the RL term alone)",
         d("opd_privileged_grpo", "grpo")),
        ("privileged_minus_warm (the privileged teacher's term alone)", d("opd_privileged", "warm")),
        ("centered_minus_warm (the teacher's push centred at first tokens)", d("opd_centered", "warm")),
        ("centered_minus_aligned (centring against the plain teacher term)", d("opd_centered", "opd_aligned")),
        ("centered_rl_minus_rl (the centred teacher term beside the RL term, against the RL term alone)",
         d("opd_grpo_centered", "grpo")),
        ("centered_memory_minus_warm (centred within calls of one kind and one memory state)",
         d("opd_centered_memory", "warm")),
        ("centered_memory_minus_aligned", d("opd_centered_memory", "opd_aligned")),
        ("centered_memory_rl_minus_rl (beside the RL term, against the RL term alone)",
         d("opd_grpo_centered_memory", "grpo")),
        ("privileged_centered_memory_minus_warm (the privileged teacher's term, centred by kind and memory state)",
         d("opd_privileged_centered_memory", "warm")),
        ("privileged_centered_memory_minus_centered_memory (the privileged teacher against the plain one, both "
         "centred)", d("opd_privileged_centered_memory", "opd_centered_memory")),
        ("privileged_centered_memory_rl_minus_rl (beside the RL term, against the RL term alone)",
         d("opd_privileged_grpo_centered_memory", "grpo")),
        ("hotpot_trained_minus_base", hotpot_d),
        ("aligned_minus_sft_more (on-policy distillation against SFT continued on oracle calls)",
         d("opd_aligned", "sft_more")),
        ("aligned_minus_seqkd (on-policy against off-policy distillation from the same teacher)",
         d("opd_aligned", "seqkd")))
    values["differences"] = {name.split()[0]: [float(x) for x in v] for name, v in differences}
    intervals = "\n".join(f"- `{name}`: {fmt(v)}" for name, v in differences)
    picks = [(key, pick) for key in teacher_keys(p) if (pick := bench.state.get(f"teacher/{key}/pick"))]
    def skips(d: dict[str, float] | None) -> str:
        return "" if d is None else f"{d.get('evidence', float('nan')):.2f} / {d.get('other', float('nan')):.2f}"

    for key, pick in picks:
        values["teachers"][key] = {"step": pick["step"], "f1": pick["f1"],
                                   "first_reads": bench.teacher_first_reads(key, pick)}
    teachers = "\n".join(
        ["| teacher | prompt | picked at SFT step | validation F1 | (empty) after evidence | max empty rate | "
         "first reads, evidence / other |", "|---|---|---:|---:|---:|---:|---:|"]
        + [f"| {key} | {'privileged' if key.endswith('-privileged') else 'plain'} | {pick['step']} | {pick['f1']:.3f} | "
           f"{pick.get('empty_after_evidence') or 0:.2f} | {max(pick['empty_by_kind'].values(), default=0):.3f} | "
           f"{skips(values['teachers'][key]['first_reads'])} |" for key, pick in picks])

    reads = ["| arm | " + " | ".join(f"seed {i}" for i in range(p.seeds)) + " |", "|---|" + "---:|" * p.seeds]
    for arm in [a for a in ARMS if a in scores]:
        values["arms"][arm]["first_reads"] = bench.first_reads(results[arm]["evals"])
        cells = [skips(d) for d in values["arms"][arm]["first_reads"]]
        reads.append(f"| {arm} | " + " | ".join(cells + [""] * (p.seeds - len(cells))) + " |")
    reads_table = "\n".join(reads)
    text = (f"## Held-out ladder\n\n{table}\n\n{p.heldout_per_level} questions per level, {p.seeds} training seed(s); "
            "intervals resample questions and seeds. Max empty rate: the largest greedy end-of-sequence-only share of "
            "any call kind over the arm's evaluations (above 0.02: collapsed). (empty) after evidence: the largest share, "
            "over the ladder levels, of update calls made once a fact was read whose memory is `(empty)` or blank (a "
            "student that learned to write `(empty)` whatever it read; `agentmem eval`'s `empty_after_evidence`). RL live: share of GRPO groups with a "
            "non-zero advantage over every step. Teacher gated: the share of the teacher term's token weight that "
            "`teacher_min_confidence` left out, mean over the steps. Push shared: the share of the teacher term's push at "
            "first tokens that `teacher_centering` removed (its mean over each call kind's calls), mean over the steps. "
            "Training ran in "
            + ("mixed precision (decoders in bf16 autocast, float32 weights and optimiser)" if bench.mixed()
               else "float32")
            + f", the evaluations in {bench.eval_dtype()} (`auto` takes bfloat16 where this CPU has it natively; a "
            "table made in one dtype is reproduced in that dtype, since round-off flips a few greedy answers). "
            + ("Momentum: the warm start's carried AdamW stepped with zero gradients (the move every method makes "
               "before its own gradient counts)." if p.coasts else
               "Momentum is the warm start itself: no first moment is carried, so the carried state moves nothing "
               "with zero gradients and every method's move is its own gradients'.")
            + "\n\n## First reads (does a student tell evidence "
            f"from a distractor?)\n\n{reads_table}\n\nOf the held-out update calls (levels together) that read a "
            "chunk while holding nothing, the share that write an empty memory: evidence reads (a fact of the task is in "
            "the chunk) / other reads (`agentmem eval`'s `empty_at_first_read`). Both low: writes whatever it reads; both "
            f"high: skips whatever it reads; only a gap between them is a decision.\n\n## Teachers\n\n{teachers}\n\nValidation on "
            f"{p.teacher_val} training-name episodes, under the prompt each teacher reads (a privileged teacher's F1 is "
            "high by construction: its answer call reads the gold answer). First reads: as in the table above, on those "
            "validation episodes; the decision a teacher term could teach.\n\n"
            f"## Real text\n\n{real_table or '(no ../shared data)'}\n\n"
            f"## Differences (paired, 95%)\n\n{intervals}\n\n{split}\n")
    (bench.work / "learning.md").write_text(text)
    (bench.work / "learning.json").write_text(json.dumps(values, indent=1, default=float))
    return text, last


def plot_dynamics(bench: Bench, results: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 8))
    FigureCanvasAgg(fig)
    panels = [("rl_live_fraction", "share of GRPO groups with a non-zero advantage"),
              ("eos_first/", "first-token EOS mass (mean over call kinds)"),
              ("out_len/", "mean output length, tokens (mean over kinds)"),
              ("kl_teacher", "KL(student || teacher)"), ("kl_start", "KL(student || round start)")]
    axes = [fig.add_subplot(2, 3, i + 1) for i in range(len(panels))]
    with bench.store.session() as s:
        for arm, r in results.items():
            runs = r.get("distill_runs_seed0") or []
            steps = [st for rid in runs for st in repo.list_train_steps(s, rid)]
            if not steps:
                continue
            for ax, (key, title) in zip(axes, panels, strict=True):
                ys = []
                for st in steps:
                    vals = [v for k, v in st.metrics.items() if (k.startswith(key) if key.endswith("/") else k == key)]
                    ys.append(float(np.mean(vals)) if vals else np.nan)
                if not all(np.isnan(ys)):
                    ax.plot(range(1, len(ys) + 1), ys, marker="o", label=arm)
                ax.set_title(title, fontsize=9)
                ax.set_xlabel("step (after the warm start)", fontsize=8)
    labelled = max(axes, key=lambda ax: len(ax.get_lines()))  # the RL panel has lines only when an RL arm ran
    if labelled.get_lines():
        labelled.legend(fontsize=7)
    fig.suptitle("Training dynamics, seed 0")
    fig.savefig(path, dpi=110, bbox_inches="tight")


def records_section(summary: dict, kept: list[dict]) -> str:
    """The last line's terms with their intervals, every teacher's gate per seed, and the two ledgers, all from
    the records (``records.summarize``)."""
    def cell(v: object) -> str:
        if v is None:
            return "na"
        return fmt(v) if isinstance(v, tuple | list) else f"{v:.3f}" if isinstance(v, float) else str(v)

    terms = "\n".join(f"- `{k}`: {cell(summary[k])}" for k in records.LAST_LINE)
    gates = ["| teacher | seed | validation F1 | warm F1 | decision gap | max empty | max EOS@1 | gate |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in sorted((r for r in kept if r["kind"] == "teacher"), key=lambda r: (r["teacher"], r["seed"])):
        g = r["gate"]
        gap = "na" if g["decision_gap"] is None else f"{g['decision_gap']:.2f}"
        gates.append(f"| {r['teacher']} | {r['seed']} | {g['f1']:.3f} | {g['warm_f1']:.3f} | {gap} | "
                     f"{g['max_empty']:.3f} | {g['max_eos_first']:.3f} | "
                     f"{'passed' if g['passed'] else 'failed: ' + '; '.join(g['fails'])} |")
    ledger = ["| arm | seeds | steps | rollout tokens | teacher-forward tokens | student tokens | wall s |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    arms: dict[str, list[dict]] = {}
    for r in kept:
        if r["kind"] == "arm":
            arms.setdefault(r["arm"], []).append(r["ledger"])
    for arm, ls in sorted(arms.items()):
        if arm.endswith(records.REAL):  # an evaluation, no training
            continue
        mean = {k: np.mean([x[k] or 0 for x in ls]) for k in ("steps", "rollout_tokens", "teacher_forward_tokens",
                                                                "student_tokens", "wall_seconds")}
        ledger.append(f"| {arm} | {len(ls)} | {mean['steps']:.0f} | {mean['rollout_tokens']:.0f} | "
                      f"{mean['teacher_forward_tokens']:.0f} | {mean['student_tokens']:.0f} | "
                      f"{mean['wall_seconds']:.0f} |")
    real = ["| arm | teacher | seeds | F1 per real-text set | minus sft_more | minus base |", "|---|---|---:|---|---|---|"]
    for row in records.real_text(kept):
        f1 = ", ".join(f"{c} {v:.3f}" for c, v in row["f1"].items())
        real.append(f"| {row['arm']} | {row['teacher'] or '-'} | {row['seeds']} | {f1} | {cell(row['minus_sft_more'])} "
                    f"| {cell(row['minus_base'])} |")
    best = summary.get("best") or "none (no T_rl or T_hint passed its gate with OPD records)"
    return (f"\n## From the records ({len(kept)} of this config)\n\nThe comparisons use the teacher {best}.\n\n"
            f"{terms}\n\n### Teachers: the gate per seed\n\n" + "\n".join(gates)
            + "\n\n### Real text: each teacher's best arm on the ladder\n\n" + "\n".join(real)
            + "\n\n### Ledgers (means per arm-seed)\n\n" + "\n".join(ledger) + "\n")


def pilot_section(curve: dict) -> str:
    """The gap-recovery curve (``records.pilot``) as a table, S and the stopping rule."""
    steps = sorted({s for points in curve["curve"].values() for s in points})
    rows = ["| arm / teacher | " + " | ".join(f"{s} steps" for s in steps) + " |", "|---|" + "---:|" * len(steps)]
    for name, points in sorted(curve["curve"].items()):
        rows.append(f"| {name} | " + " | ".join(f"{points[s]:+.2f}" if s in points else "" for s in steps) + " |")
    gaps = ", ".join(f"{t} {g:+.3f}" for t, g in curve["gap"].items()) or "none above 0"
    rule = ("**Stop**: no teacher's OPD recovered 30% of its gap by the last step; run nothing more."
            if curve["stop"] else f"S = {curve['S']} steps: the first point where OPD recovers at least 30%.")
    return f"\n## Gap recovery (pilot)\n\nGaps: {gaps}.\n\n" + "\n".join(rows) + f"\n\n{rule}\n"


def plot_recovery(curve: dict, path: Path) -> None:
    """Each arm's gap recovery against its steps (``records.pilot``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for name, points in sorted(curve["curve"].items()):
        steps = sorted(points)
        ax.plot(steps, [points[s] for s in steps], marker="o", label=name)
    ax.axhline(0.3, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("student steps")
    ax.set_ylabel("gap recovery (arm - warm) / (teacher - warm)")
    if curve["curve"]:
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=110, bbox_inches="tight")

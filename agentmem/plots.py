"""Plots of eval_results: F1 with its bootstrap 95% interval against training step or context length.

matplotlib is imported only when a plot is drawn, and draws on an Agg canvas: no display is needed and
matplotlib's global backend is left alone.

Lines: against training step, one line per (base model, environment knobs: level, context tokens, ...); against context
length (the mean tokens each episode read, ``metrics["context_tokens"]``), one line per model and step.
Where a line has several results at the same x, the latest one is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from agentmem.errors import ConfigError
from agentmem.records import EvalResult

PlotBy = Literal["step", "context_tokens"]


def _line_label(r: EvalResult, by: PlotBy) -> str:
    """One line per base model and set of environment knobs (``level 2``, ``context 4096``, ...): evaluations
    of different tasks are never joined into one line."""
    if by == "step":
        base = str(r.metrics.get("base_model") or r.model)
        knobs = r.metrics.get("env_knobs") or {}
        return " · ".join([base] + [f"{'context' if k == 'context_tokens' else k} {v}" for k, v in sorted(knobs.items())])
    return f"{Path(r.model).name or r.model} · step {r.step}"


def _x(r: EvalResult, by: PlotBy) -> float | None:
    value = r.step if by == "step" else r.metrics.get("context_tokens")
    return None if value is None else float(value)


def series(results: Sequence[EvalResult], by: PlotBy) -> dict[str, list[tuple[float, EvalResult]]]:
    """Results grouped into lines, each a list of (x, result) sorted by x; results without an x are left out."""
    lines: dict[str, dict[float, EvalResult]] = {}
    for r in sorted(results, key=lambda r: r.created_at):
        x = _x(r, by)
        if x is not None:
            lines.setdefault(_line_label(r, by), {})[x] = r
    return {label: sorted(points.items()) for label, points in sorted(lines.items())}


def plot_eval_results(results: Sequence[EvalResult], path: str | Path, *, by: PlotBy = "step") -> Path:
    """Write a PNG of F1 (error bars: 95% interval) against ``by``; return its path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    lines = series(results, by)
    if not lines:
        raise ConfigError(f"no eval results with a {by.replace('_', ' ')} to plot")
    fig = Figure(figsize=(7, 4.5), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, points in lines.items():
        xs = [x for x, _ in points]
        ys = [r.f1 for _, r in points]
        err = [[max(0.0, r.f1 - r.f1_ci[0]) for _, r in points], [max(0.0, r.f1_ci[1] - r.f1) for _, r in points]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
    envs = sorted({r.env for r in results})
    ax.set_xlabel("training step" if by == "step" else "context tokens (mean per episode)")
    ax.set_ylabel("F1 (95% bootstrap interval)")
    ax.set_ylim(-0.02, 1.02)
    xs_all = [x for points in lines.values() for x, _ in points]
    if by == "context_tokens" and min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 8:
        ax.set_xscale("log")  # a length sweep spans orders of magnitude (MemAgent's figure)
    ax.set_title(f"F1 on {', '.join(envs)}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out

"""``agentmem report``: one run as one self-contained HTML file (inline CSS, inline SVG, no scripts and no
external references): the run's episode table and F1 histogram, its training plots, and the first
``max_episodes`` episodes in full, with the same views as ``agentmem view`` (links become anchors)."""

from __future__ import annotations

from pathlib import Path

from agentmem.records import utcnow
from agentmem.view.episode import episode_context
from agentmem.view.render import Links, render, stylesheet
from agentmem.view.run_page import run_context
from agentmem.view.training import training_context
from store.engine import Store


def report_html(store: Store, run_id: str, *, max_episodes: int = 20, tokenizer: str | None = None) -> str:
    with store.session() as s:
        run = run_context(s, run_id, per_page=None)
        training = training_context(s, run["run"].id)
        shown = [episode_context(s, e.episode.id, tokenizer=tokenizer) for e in run["episodes"][:max_episodes]]
    return render("report.html", links=Links(report=True), css=stylesheet(), title=f"run {run['run'].id[:10]}",
                  written=utcnow().strftime("%Y-%m-%d %H:%M UTC"), shown=shown,
                  **{k: training[k] for k in ("charts", "eval_chart", "evals")}, **run)


def write_report(store: Store, run_id: str, out: str | Path, *, max_episodes: int = 20,
                 tokenizer: str | None = None) -> Path:
    """Write the report of run ``run_id`` to ``out``; return its path."""
    html = report_html(store, run_id, max_episodes=max_episodes, tokenizer=tokenizer)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    return path

"""The run page (``/runs/{id}``): one run's episodes as a table, sorted and filtered on the server (query
parameters, so every view has a URL), paged, with a histogram of the run's F1; and what the run holds
besides episodes: its teacher scores (under which teacher and context), training steps and checkpoints. A run
without episodes (score, distill, sft) shows only the latter, not an empty table."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from agentmem.records import EpisodeStatus
from agentmem.view import svg
from agentmem.view.render import Links, render
from agentmem.view.runs import TRAINING_KINDS, run_model
from store import repository as repo

PER_PAGE = 200
COLUMNS = (("task", "task"), ("status", "status"), ("f1", "F1"), ("calls", "calls"), ("tokens", "tokens"),
           ("stop_reason", "stop reason"))

router = APIRouter()


def f1_histogram(values: list[float]) -> str:
    return svg.histogram(values, title=f"F1 of {len(values)} scored episodes", x_label="F1", bins=10)


def run_context(session: Session, run_id: str, *, sort: str = "task", desc: bool = False, status: str | None = None,
                q: str | None = None, page: int = 1, per_page: int | None = PER_PAGE) -> dict:
    run = repo.get_run(session, run_id)
    total = repo.count_episodes(session, run.id, status=status, search=q)
    offset = (page - 1) * per_page if per_page else 0
    episodes = repo.list_episode_stats(session, run.id, status=status, search=q, sort=sort, descending=desc,
                                       limit=per_page, offset=offset)
    f1s = repo.episode_f1s(session, [run.id])[run.id]
    has_episodes = bool(total or status or q)
    return {"run": run, "model": run_model(run), "episodes": episodes, "total": total, "page": page,
            "has_episodes": has_episodes, "scores": repo.teacher_score_summary(session, run.id),
            "steps": repo.count_train_steps(session, run.id), "checkpoints": repo.list_checkpoints(session, run.id),
            "pages": max(1, -(-total // per_page)) if per_page else 1, "sort": sort, "desc": desc,
            "status": status or "", "q": q or "", "statuses": [s.value for s in EpisodeStatus], "columns": COLUMNS,
            "histogram": f1_histogram(f1s) if has_episodes else "", "has_training": run.kind in TRAINING_KINDS}


def table_links(links: Links, context: dict) -> dict:
    """Header links that sort by each column (a second click reverses), and a page link, keeping filters."""
    run_id, sort, desc = context["run"].id, context["sort"], context["desc"]
    keep = {k: context[k] for k in ("status", "q") if context[k]}

    def page_link(page: int) -> str:
        return links.run(run_id, sort=sort, desc=int(desc), page=page, **keep)

    sort_links = {key: links.run(run_id, sort=key, desc=int(key == sort and not desc), **keep) for key, _ in COLUMNS}
    return {"sort_links": sort_links, "page_link": page_link}


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(
    request: Request,
    run_id: str,
    sort: str = Query("task", pattern="^(" + "|".join(repo.EPISODE_SORTS) + ")$", description="Sort column."),
    desc: bool = Query(False, description="Sort descending."),
    status: str | None = Query(None, description="Only episodes of this status."),
    q: str | None = Query(None, description="Task id or question contains this, or an episode id prefix."),
    page: int = Query(1, ge=1),
) -> str:
    with request.app.state.store.session() as s:
        context = run_context(s, run_id, sort=sort, desc=desc, status=status or None, q=q or None, page=page)
    links = Links()
    return render("run.html", links=links, title=f"run {context['run'].id[:10]}", **context,
                  **table_links(links, context))

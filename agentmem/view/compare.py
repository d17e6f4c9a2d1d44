"""The compare page (``/episodes/{id}/compare``): one episode's calls with the tokens coloured under two
sets of teacher scores side by side: two contexts (``context_a``, ``context_b``) or two teachers, e.g. two
checkpoints (``teacher_a``, ``teacher_b``). Both sides share one colour scale."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from agentmem.records import TeacherContext
from agentmem.view import heat
from agentmem.view.episode import call_views, choose, load_episode, score_values
from agentmem.view.render import Links, render

router = APIRouter()


def compare_context(session: Session, episode_id: str, *, teacher_a: str | None = None,
                    context_a: TeacherContext | None = None, teacher_b: str | None = None,
                    context_b: TeacherContext | None = None, metric: heat.Metric = heat.Metric.logprob,
                    tokenizer: str | None = None) -> dict:
    data = load_episode(session, episode_id, tokenizer)
    a = choose(data.keys, teacher_a, context_a, default=0)
    b = choose(data.keys, teacher_b, context_b, default=1)
    sides = [k for k in (a, b) if k is not None]
    valuesets = [score_values(session, data, k, metric) for k in sides]
    scale = heat.page_scale([v for vs in valuesets for v in vs.values()], metric)
    return {"episode": data.episode, "calls": call_views(data, valuesets, metric, scale), "sides": sides,
            "keys": data.keys, "metric": metric, "metrics": list(heat.Metric),
            "legend": heat.legend(metric, scale) if sides else None}


@router.get("/episodes/{episode_id}/compare", response_class=HTMLResponse)
def compare_page(
    request: Request,
    episode_id: str,
    context_a: TeacherContext | None = Query(None, description="Left side: teacher context."),
    teacher_a: str | None = Query(None, description="Left side: teacher (e.g. a checkpoint)."),
    context_b: TeacherContext | None = Query(None, description="Right side: teacher context."),
    teacher_b: str | None = Query(None, description="Right side: teacher."),
    metric: heat.Metric = Query(heat.Metric.logprob, description="Colour by teacher log-prob or reverse KL."),
) -> str:
    with request.app.state.store.session() as s:
        page = compare_context(s, episode_id, teacher_a=teacher_a or None, context_a=context_a,
                               teacher_b=teacher_b or None, context_b=context_b, metric=metric,
                               tokenizer=request.app.state.tokenizer)
    return render("compare.html", links=Links(), title=f"compare {page['episode'].id[:10]}", **page)

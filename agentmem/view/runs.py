"""The runs page (``/``): every run, newest first, paged, with its model and policy versions, episode count
and mean F1 with a bootstrap 95% interval. Counts and means are aggregated in SQL; only the F1 column of the
page's runs is read for the intervals. An eval run shows its ``eval_results`` row's interval (the CLI's and
``/evals``'); any other run ``envs.metrics.mean_interval`` of its scored episodes' F1, the same function. A run
links to its episodes only when it has some."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from agentmem.records import Run, RunKind
from agentmem.view.render import Links, render
from envs.metrics import mean_interval
from store import repository as repo
from store.repository import RunSummary

PER_PAGE = 50
TRAINING_KINDS = (RunKind.distill, RunKind.sft, RunKind.train, RunKind.eval)

router = APIRouter()


@dataclass(frozen=True)
class RunLine:
    summary: RunSummary
    model: str
    policy_versions: list[str]
    f1_ci: tuple[float, float] | None
    status: str

    @property
    def run(self) -> Run:
        return self.summary.run

    @property
    def has_training(self) -> bool:
        return self.run.kind in TRAINING_KINDS


def run_model(run: Run) -> str:
    """The model a run used: a rollout's or eval's model, a score run's teacher, a training run's student."""
    config = run.config
    if run.kind is RunKind.score:
        return str(config.get("teacher") or "")
    return str(config.get("model") or config.get("student") or (config.get("distill") or {}).get("student") or "")


def run_status(summary: RunSummary) -> str:
    """Status, with a killed or stale running run said so and a failed run's error."""
    run = summary.run
    if summary.liveness in ("dead", "stale", "unknown"):
        return f"running ({'killed' if summary.liveness == 'dead' else summary.liveness})"
    return f"{run.status}: {run.error[:80]}" if run.error else run.status


@functools.lru_cache(maxsize=256)
def f1_interval(values: tuple[float, ...]) -> tuple[float, float]:
    """``mean_interval`` of the F1 values, remembered: an ended run's values do not change, and the bootstrap
    is the runs page's largest cost (1,000 resamples of every run on the page)."""
    return mean_interval(values)


def runs_context(session: Session, page: int = 1, per_page: int = PER_PAGE) -> dict:
    summaries = repo.list_runs(session, per_page, (page - 1) * per_page)
    ids = [s.run.id for s in summaries]
    f1s = repo.episode_f1s(session, ids)
    versions = repo.run_policy_versions(session, ids)
    evals = {r.run_id: r.f1_ci for r in repo.list_eval_results(session, ids)}

    def interval(run_id: str) -> tuple[float, float] | None:
        if run_id in evals:
            return evals[run_id]
        return f1_interval(tuple(sorted(f1s[run_id]))) if f1s[run_id] else None

    lines = [RunLine(s, run_model(s.run), versions.get(s.run.id, []), interval(s.run.id), run_status(s))
             for s in summaries]
    total = repo.count_runs(session)
    return {"lines": lines, "page": page, "pages": max(1, -(-total // per_page)), "total": total}


@router.get("/", response_class=HTMLResponse)
def runs_page(request: Request, page: int = Query(1, ge=1, description="Page of 50 runs.")) -> str:
    with request.app.state.store.session() as s:
        context = runs_context(s, page)
    return render("runs.html", links=Links(), title="runs", **context)

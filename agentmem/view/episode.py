"""The episode page (``/episodes/{id}``): the calls in order, each with its prompt (the chunk folded in a
``<details>``), its output, and the memory before -> after as a word diff; a served call (``agentmem serve``)
shows the request instead: its messages, tools, sampling options and constraint (``view.served``). Where teacher scores exist, the
output's tokens are coloured by the teacher log-prob or the reverse KL stored under one (teacher, context),
chosen by query parameters (``context``, ``teacher``, ``metric``)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from agentmem.records import Episode, Invocation, TeacherContext
from agentmem.view import heat, served, tokens
from agentmem.view.diff import DiffPart, word_diff
from agentmem.view.render import Links, model_label, render
from store import repository as repo
from store.errors import NotFound
from store.repository import serve as serve_repo

router = APIRouter()


@dataclass(frozen=True)
class ScoreKey:
    teacher: str
    context: TeacherContext

    @property
    def label(self) -> str:
        return f"{self.context.value} · {model_label(self.teacher)}"


@dataclass(frozen=True)
class Heat:
    """One call's output as coloured tokens (``html``), or why it has none (``note``)."""

    html: str | None
    note: str | None
    mean: float | None = None


@dataclass(frozen=True)
class CallView:
    inv: Invocation
    prompt_head: str
    chunk: str | None
    prompt_tail: str
    diff: list[DiffPart]
    heats: list[Heat]
    request: served.Request | None = None  # a served call's request (``serve_calls``)


@dataclass(frozen=True)
class EpisodeData:
    episode: Episode
    calls: list[Invocation]
    keys: list[ScoreKey]
    tokenizer_of: dict[str, str | None]  # invocation id -> tokenizer.json (None: show ids)
    requests: dict[str, served.Request]  # invocation id -> what the client sent, for served calls


def prompt_parts(inv: Invocation) -> tuple[str, str | None, str]:
    """The prompt split around its chunk (the first place the chunk's text occurs), so the chunk can fold."""
    chunk = inv.chunk_text
    if chunk and chunk in inv.prompt_text:
        head, _, tail = inv.prompt_text.partition(chunk)
        return head, chunk, tail
    return inv.prompt_text, None, ""


def _tokenizers(session: Session, episode: Episode, calls: list[Invocation], override: str | None) -> dict:
    if override:
        path = tokens.tokenizer_file(override)
        return {c.id: path for c in calls}
    run_model = tokens.tokenizer_file(str(repo.get_run(session, episode.run_id).config.get("model") or ""))
    by_version: dict[str | None, str | None] = {None: run_model}
    for version in {c.policy_version for c in calls if c.policy_version}:
        try:
            by_version[version] = tokens.tokenizer_file(repo.get_checkpoint(session, version).path) or run_model
        except NotFound:
            by_version[version] = run_model
    return {c.id: by_version[c.policy_version] for c in calls}


def load_episode(session: Session, episode_id: str, tokenizer: str | None = None) -> EpisodeData:
    episode = repo.get_episode(session, episode_id)
    calls = repo.episode_invocations(session, episode.id)
    keys = [ScoreKey(t, c) for t, c in repo.teacher_score_keys(session, [c.id for c in calls])]
    return EpisodeData(episode, calls, keys, _tokenizers(session, episode, calls, tokenizer),
                       _requests(session, episode, calls))


def _requests(session: Session, episode: Episode, calls: list[Invocation]) -> dict[str, served.Request]:
    if episode.env != "serve":  # only a serve run's episodes hold served calls
        return {}
    requests = {}
    for inv in calls:
        with contextlib.suppress(NotFound):  # a call stored by another writer than serve
            requests[inv.id] = served.request(serve_repo.get_serve_call(session, inv.id))
    return requests


def choose(keys: list[ScoreKey], teacher: str | None, context: TeacherContext | None,
           default: int = 0) -> ScoreKey | None:
    """The scores to show: those matching the given teacher and/or context (the first such), else the
    ``default``-th available; NotFound when the given ones match nothing."""
    if teacher is None and context is None:
        return keys[default] if len(keys) > default else (keys[0] if keys else None)
    for key in keys:
        if (teacher is None or key.teacher == teacher) and (context is None or key.context is context):
            return key
    have = ", ".join(k.label for k in keys) or "none"
    want = " · ".join(x for x in (context.value if context else None, teacher) if x)
    raise NotFound(f"no teacher scores under {want} for this episode (stored: {have})")


def score_values(session: Session, data: EpisodeData, key: ScoreKey | None, metric: heat.Metric) -> dict:
    """Invocation id -> the stored per-token values of ``metric`` under ``key``."""
    if key is None:
        return {}
    scores = repo.get_teacher_scores(session, [c.id for c in data.calls], key.teacher, key.context)
    return {i: (s.token_logprobs if metric is heat.Metric.logprob else s.reverse_kl) for i, s in scores.items()}


def call_heat(inv: Invocation, values: np.ndarray | None, metric: heat.Metric, scale: float,
              tokenizer_path: str | None) -> Heat:
    if values is None:
        return Heat(None, "not scored under this teacher and context")
    if len(values) == 0 and inv.output_tokens:
        return Heat(None, f"no {metric.label} stored (scored without a student)")
    if len(values) != inv.output_tokens:
        return Heat(None, f"{len(values)} stored values for {inv.output_tokens} output tokens: not shown")
    pieces = tokens.pieces(inv.output_ids, tokenizer_path)
    mean = float(np.mean(values)) if len(values) else None
    return Heat(heat.token_spans(pieces, inv.output_ids, values, metric, scale), None, mean)


def call_views(data: EpisodeData, valuesets: list[dict], metric: heat.Metric, scale: float) -> list[CallView]:
    views = []
    for inv in data.calls:
        head, chunk, tail = prompt_parts(inv)
        heats = [call_heat(inv, values.get(inv.id), metric, scale, data.tokenizer_of[inv.id]) for values in valuesets]
        views.append(CallView(inv, head, chunk, tail, word_diff(inv.memory_before, inv.memory_after), heats,
                              data.requests.get(inv.id)))
    return views


def episode_context(session: Session, episode_id: str, *, teacher: str | None = None,
                    context: TeacherContext | None = None, metric: heat.Metric = heat.Metric.logprob,
                    tokenizer: str | None = None) -> dict:
    data = load_episode(session, episode_id, tokenizer)
    key = choose(data.keys, teacher, context)
    values = score_values(session, data, key, metric)
    scale = heat.page_scale(list(values.values()), metric)
    return {"episode": data.episode, "calls": call_views(data, [values] if key else [], metric, scale), "key": key,
            "keys": data.keys, "metric": metric, "metrics": list(heat.Metric),
            "legend": heat.legend(metric, scale) if key else None,
            "tokenizer_missing": bool(key) and any(p is None for p in data.tokenizer_of.values())}


@router.get("/episodes/{episode_id}", response_class=HTMLResponse)
def episode_page(
    request: Request,
    episode_id: str,
    context: TeacherContext | None = Query(None, description="Teacher context of the scores to colour by."),
    teacher: str | None = Query(None, description="Teacher of the scores to colour by."),
    metric: heat.Metric = Query(heat.Metric.logprob, description="Colour by teacher log-prob or reverse KL."),
) -> str:
    with request.app.state.store.session() as s:
        page = episode_context(s, episode_id, teacher=teacher or None, context=context, metric=metric,
                               tokenizer=request.app.state.tokenizer)
    return render("episode.html", links=Links(), title=f"episode {page['episode'].id[:10]}", **page)

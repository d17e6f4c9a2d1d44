"""Template rendering shared by the app and the static report: one Jinja2 environment (autoescaped), the
number formats, and ``Links``, which says where a page links to (URLs in the app, anchors in the report).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlencode

import jinja2

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"


def num(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def short(ident: str | None) -> str:
    return (ident or "")[:10]


DEFAULT_MODEL_FOLDER = "SmolLM2-135M-Instruct"  # the prepared default model: .../models/SmolLM2-135M-Instruct


_CHECKPOINT_ID = re.compile(r"[0-9a-f]{6,64}")  # a checkpoint id (or its abbreviation), as a user types it
_STEP_FOLDER = re.compile(r"step-\d+")  # a trained checkpoint's folder: <out>/<run id>/step-000010


def model_label(path: str | None, checkpoint_id: str | None = None) -> str:
    """How a model is named to a person, the same on every page: ``default`` for the prepared default model
    (not its cache path); a trained checkpoint by its id (``short``: what the runs page shows for a run whose
    ``--model`` was a checkpoint id), given as the reference or as its folder with ``checkpoint_id``; else the
    last part of its path (a folder's name) or the reference itself; at most 24 characters."""
    if not path:
        return ""
    if path == "default" or (Path(path).name == DEFAULT_MODEL_FOLDER and Path(path).parent.name == "models"):
        return "default"
    if _CHECKPOINT_ID.fullmatch(path):
        return short(path)
    if checkpoint_id and _STEP_FOLDER.fullmatch(Path(path).name):
        return short(checkpoint_id)
    name = Path(path).name or path
    return name if len(name) <= 24 else name[:10] + "…" + name[-8:]


def knobs(values: dict | None) -> str:
    """An evaluation's environment knobs as a person reads them: ``level 2, docs 10`` (sorted)."""
    return ", ".join(f"{k} {v}" for k, v in sorted((values or {}).items()))


@functools.cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters.update(num=num, short=short, model_label=model_label, knobs=knobs)
    return env


def render(template: str, **context) -> str:
    return environment().get_template(template).render(**context)


@functools.cache
def stylesheet() -> str:
    return (STATIC / "style.css").read_text(encoding="utf-8")


@dataclass(frozen=True)
class Links:
    """Links of the web app. ``report`` links the sections of one file instead and inlines the CSS."""

    report: bool = False

    def runs(self) -> str:
        return "#top" if self.report else "/"

    def run(self, run_id: str, **query) -> str:
        if self.report:
            return "#episodes"
        return f"/runs/{quote(run_id)}" + (f"?{urlencode(query)}" if query else "")

    def training(self, run_id: str) -> str:
        return "#training" if self.report else f"/runs/{quote(run_id)}/training"

    def episode(self, episode_id: str, **query) -> str:
        if self.report:
            return f"#episode-{episode_id}"
        return f"/episodes/{quote(episode_id)}" + (f"?{urlencode(query)}" if query else "")

    def compare(self, episode_id: str) -> str | None:
        return None if self.report else f"/episodes/{quote(episode_id)}/compare"

    def evals(self) -> str | None:
        return None if self.report else "/evals"

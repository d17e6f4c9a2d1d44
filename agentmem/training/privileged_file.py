"""Privileged context per task from a JSONL file, for scoring calls whose episodes carry none (calls an
outside agent made through ``agentmem serve``, whose gold answers the harness knows only afterwards).

One JSON object per line: ``{"task_id": "...", "answers": ["..."], "text": "..."}`` (``text``: evidence, may
be omitted). An episode of a listed task that has neither gold answers nor evidence gets the line's
answers and ``[text]`` as evidence; the ``privileged`` teacher context then renders them as it does for
agentmem's own rollouts (``agent.prompts.privileged_ids``). Episodes that already have some keep theirs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from agentmem.errors import ConfigError
from agentmem.training.selection import Selection


def read_privileged(path: str | Path) -> dict[str, tuple[list[str], list[str]]]:
    """task id -> (answers, evidence); ConfigError naming the file and line of a bad entry."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the privileged file {path}: {exc.strerror or exc}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            task, answers, text = item["task_id"], item.get("answers", []), item.get("text", "")
            if not isinstance(task, str) or not isinstance(text, str) or not isinstance(answers, list):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"{path}:{n}: expected {{\"task_id\": str, \"answers\": [str], \"text\": str}}") from None
        out[task] = ([str(a) for a in answers], [text] if text else [])
    return out


def with_privileged(selection: Selection, by_task: dict[str, tuple[list[str], list[str]]]) -> Selection:
    """The selection with the file's context given to its episodes that have none."""
    episodes = {}
    for ep_id, ep in selection.episodes.items():
        if ep.task_id in by_task and not ep.gold_answers and not ep.evidence:
            answers, evidence = by_task[ep.task_id]
            ep = ep.model_copy(update={"gold_answers": answers, "evidence": evidence})
        episodes[ep_id] = ep
    return replace(selection, episodes=episodes)

"""The privileged contexts, in token ids: gold answers and evidence as one system message (``privileged``), or
one line per memory-update call saying whether its chunk holds a fact of the task's evidence (``hint``).

One function for both sides of PSD: the rollout splices it before a call's prompt to sample under it (a
privileged rollout, ``agentmem.jobs.rollout``), and the ``privileged`` teacher context splices it before a
stored prompt (``rebuild_privileged`` at offset 0, ``agentmem.training.selection``). It lives here, below
both the jobs and training, so that training imports nothing from the agent. The tokenizer is any object
with the Hugging Face ``apply_chat_template`` and ``__call__``; nothing here imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentmem.records import Episode

PRIVILEGED_TEMPLATE = (
    "Privileged information for grading, not visible to the reader. Gold answer: {answers}."
    "{evidence}"
)


def privileged_ids(tokenizer: Any, episode: Episode) -> list[int]:
    """The privileged context (gold answers and evidence) as one complete system message rendered by the
    chat template: spliced before a stored prompt it makes the privileged teacher's context
    (``replay.rebuild_privileged``, at offset 0) and, in a privileged rollout, the sampler's prompt."""
    evidence = f" Supporting evidence: {' '.join(episode.evidence)}" if episode.evidence else ""
    text = PRIVILEGED_TEMPLATE.format(answers=" | ".join(episode.gold_answers), evidence=evidence)
    rendered = tokenizer.apply_chat_template([{"role": "system", "content": text}], tokenize=False)
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


# the ``hint`` context's one line: whether the call's chunk holds a fact about the question's entity (one of the
# task's evidence sentences), never which fact or the answer, so the student's own input could let it infer it
HINT_YES = "Hint: this chunk states a fact about the question's entity."
HINT_NO = "Hint: this chunk states no fact about the question's entity."


def hint_line(evidence: Sequence[str], chunk_text: str | None) -> str | None:
    """The hint for a call that reads ``chunk_text`` (None for a call that reads no chunk, an answer call):
    ``HINT_YES`` when some evidence sentence is in the chunk, ``HINT_NO`` otherwise."""
    if chunk_text is None:
        return None
    return HINT_YES if any(e.strip() and e.strip() in chunk_text for e in evidence) else HINT_NO


def hint_ids(tokenizer: Any, evidence: Sequence[str], chunk_text: str | None) -> list[int]:
    """``hint_line`` as one complete system message rendered by the chat template (no ids for a call without
    a chunk): spliced before a stored prompt it makes the ``hint`` teacher's context, and in a hint rollout
    (``SamplingContext.hint``) the sampler's prompt."""
    line = hint_line(evidence, chunk_text)
    if line is None:
        return []
    rendered = tokenizer.apply_chat_template([{"role": "system", "content": line}], tokenize=False)
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])

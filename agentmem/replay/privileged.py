"""The privileged context: gold answers and evidence as one system message, in token ids.

One function for both sides of PSD: the rollout splices it before a call's prompt to sample under it (a
privileged rollout, ``agentmem.jobs.rollout``), and the ``privileged`` teacher context splices it before a
stored prompt (``rebuild_privileged`` at offset 0, ``agentmem.training.selection``). It lives here, below
both the jobs and training, so that training imports nothing from the agent. The tokenizer is any object
with the Hugging Face ``apply_chat_template`` and ``__call__``; nothing here imports it.
"""

from __future__ import annotations

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

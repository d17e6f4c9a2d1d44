"""The memories job (``agentmem memories build``): workflow memories from a run's successful episodes (AMD).

From each episode of the source run with ``f1 >= min_f1`` (an unscored or failed episode never passes), a
writer writes one workflow memory: the strategy the episode followed, abstracted from its specifics. Each
memory is a row of ``memories`` with its provenance: the build run (a run of kind ``memories`` holding this
job's config), the source run and episode, and the ids of the source episode's invocations in step order
(every call the writer read).

Writers:
- ``oracle``: ``oracle_workflow``, a deterministic template over the episode's calls, with the gold answers
  replaced by ``<ANSWER>`` and the question's names (capitalised words after its first) by ``<E1>``,
  ``<E2>``... in order of first appearance (``placeholders``);
- a model (any reference ``agentmem.model_refs.resolve`` takes): one greedy generation per episode of
  ``WRITER_PROMPT`` (system message ``WRITER_SYSTEM``; ``trace`` lists each call as ``<step>. <kind>:`` and the
  memory after it, or for the final call its output, each cut to ``TRACE_CHARS`` characters), at most
  ``max_new_tokens`` tokens; the memory is the decoded output, stripped, with ``placeholders`` applied too.

Memory ids are uuid5 of (build run, source episode): writing a batch twice never duplicates a row.
The order of work: the source run and its successful episodes are checked first, so a bad run id or an
empty selection fails before any model loads and leaves no build run.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from agentmem import model_refs
from agentmem.agent.prompts import render
from agentmem.backends.types import Backend, SamplingParams
from agentmem.config import MemoriesConfig
from agentmem.config.memories_config import ORACLE_WRITER
from agentmem.errors import ConfigError
from agentmem.jobs.runs import tracked_run
from agentmem.records import Checkpoint, Episode, Invocation, InvocationKind, RunKind, WorkflowMemory
from agentmem.runtime import CPU, Runtime
from store import repository as repo
from store.engine import Store
from store.repository import memories as memory_repo

ORACLE = ORACLE_WRITER
TRACE_CHARS = 200

WRITER_SYSTEM = "You write workflow memories: reusable strategies abstracted from one solved task."
WRITER_PROMPT = (
    "A reading agent solved this task.\n\n"
    "Question: {question}\n"
    "Answer: {answer}\n\n"
    "What it did, call by call:\n{trace}\n\n"
    "Write the strategy it followed as a short numbered workflow that would help on similar questions. "
    "Replace the specific names and the answer with placeholders such as <E1> and <ANSWER>. "
    "Write only the workflow."
)


@dataclass(frozen=True)
class BuildResult:
    run_id: str
    memories: list[WorkflowMemory]
    source_run_id: str
    episodes_seen: int


def placeholders(text: str, episode: Episode) -> str:
    """``text`` with the gold answers (longest first, any case) as ``<ANSWER>`` and the question's names
    (capitalised words after its first word, not part of an answer) as ``<E1>``, ``<E2>``..."""
    for answer in sorted((a for a in episode.gold_answers if a.strip()), key=len, reverse=True):
        text = re.sub(re.escape(answer.strip()), "<ANSWER>", text, flags=re.IGNORECASE)
    names: list[str] = []
    for word in re.findall(r"\b[A-Z][\w'-]*", episode.question)[1:] if episode.question else []:
        if word not in names and not any(word.lower() in a.lower() for a in episode.gold_answers):
            names.append(word)
    for n, name in enumerate(names, 1):
        text = re.sub(rf"\b{re.escape(name)}\b", f"<E{n}>", text)
    return text


def oracle_workflow(episode: Episode, calls: Sequence[Invocation]) -> str:
    """The oracle writer's workflow memory for ``episode`` from its stored ``calls`` (step order)."""
    updates = [c for c in calls if c.kind == InvocationKind.memory_update.value]
    found = [c for c in updates if c.memory_after != c.memory_before]
    last_memory = updates[-1].memory_after if updates else ""
    other = sorted({c.kind for c in calls} - {InvocationKind.memory_update.value, InvocationKind.answer.value})
    lines = [f"Task pattern: {placeholders(episode.question, episode)}"]
    if updates:
        lines += [
            f"1. Read the text section by section ({len(updates)} sections); in each, look only for sentences "
            "about the question's names.",
            f"2. Keep those sentences verbatim in memory and drop the rest (relevant facts were in {len(found)} "
            f"of {len(updates)} sections).",
            f"3. Memory at the end: {placeholders(last_memory, episode) or '(empty)'}",
            "4. Answer from memory with the short answer only: <ANSWER>.",
        ]
    else:
        lines += ["1. Answer with the short answer only: <ANSWER>."]
    if other:
        lines.append(f"Other calls made: {', '.join(other)}.")
    return "\n".join(lines)


def trace(calls: Sequence[Invocation]) -> str:
    """The writer prompt's account of the calls: one line per call."""
    out = []
    for c in calls:
        shown = c.output_text if c.kind == InvocationKind.answer.value else c.memory_after
        shown = " ".join(shown.split())[:TRACE_CHARS] or "(empty)"
        out.append(f"{c.step}. {c.kind}: {shown}")
    return "\n".join(out)


def writer_prompt(tokenizer, episode: Episode, calls: Sequence[Invocation]) -> list[int]:
    """The model writer's prompt ids for one episode."""
    user = WRITER_PROMPT.format(question=episode.question, answer=" | ".join(episode.gold_answers),
                                trace=trace(calls))
    return render(tokenizer, user, system=WRITER_SYSTEM).ids


def memory_id(build_run_id: str, episode_id: str) -> str:
    return uuid.uuid5(uuid.UUID(build_run_id), episode_id).hex


def successful_episodes(store: Store, run_id: str, min_f1: float) -> tuple[str, list[Episode]]:
    """(full run id, its episodes with ``f1 >= min_f1``); ``NotFound`` for an unknown run, ``ConfigError``
    when no episode passes."""
    with store.session() as s:
        run = repo.get_run(s, run_id)
        episodes = [e for e in repo.list_episodes(s, run.id) if e.f1 is not None and e.f1 >= min_f1]
    if not episodes:
        raise ConfigError(f"run {run.id} ({run.kind.value}) has no episode with f1 >= {min_f1} (--min-f1) to "
                          "write memories from")
    return run.id, episodes


def build_memories(
    store: Store,
    config: MemoriesConfig,
    runtime: Runtime = CPU,
    *,
    backend: Backend | None = None,
    policy: Checkpoint | None = None,
) -> BuildResult:
    """Write one workflow memory per successful episode of ``config.run`` in a new run of kind ``memories``.
    ``backend`` and ``policy`` inject the model writer (tests); otherwise ``config.writer`` is resolved and
    loaded (no model for the oracle)."""
    if (backend is None) != (policy is None):
        raise ConfigError("give both backend and policy, or neither")
    oracle = config.writer == ORACLE
    if oracle and backend is not None:
        raise ConfigError("the oracle writer runs no model: give no backend")
    source_id, episodes = successful_episodes(store, config.run, config.min_f1)
    writer_name = ORACLE
    ref = model_refs.resolve(store, config.writer) if not oracle and backend is None else None
    written: list[WorkflowMemory] = []
    with tracked_run(store, RunKind.memories, config.model_copy(update={"run": source_id})) as run:
        if not oracle:
            if backend is None:  # after the run row: its id is known while weights load
                policy, backend = model_refs.sampler(store, ref, config.backend, config.dtype, runtime)
            writer_name = f"model:{policy.id}"
        for lo in range(0, len(episodes), config.batch):
            batch = episodes[lo : lo + config.batch]
            with store.session() as s:
                calls = [repo.episode_invocations(s, e.id) for e in batch]
            if oracle:
                texts = [oracle_workflow(e, c) for e, c in zip(batch, calls, strict=True)]
            else:
                texts = _model_texts(backend, batch, calls, config.max_new_tokens)
            rows = [WorkflowMemory(id=memory_id(run.id, e.id), build_run_id=run.id, source_run_id=source_id,
                                   source_episode_id=e.id, source_invocation_ids=[c.id for c in cs],
                                   writer=writer_name, env=e.env, question=e.question, text=text, f1=e.f1)
                    for e, cs, text in zip(batch, calls, texts, strict=True)]
            with store.session() as s:
                memory_repo.insert_memories(s, rows)
                s.commit()
            run.beat()
            written.extend(rows)
    with store.session() as s:
        stored = memory_repo.list_memories(s, run.id)
    return BuildResult(run.id, stored, source_id, len(written))


def _model_texts(backend: Backend, episodes: Sequence[Episode], calls: Sequence[Sequence[Invocation]],
                 max_new_tokens: int) -> list[str]:
    prompts = [writer_prompt(backend.tokenizer, e, c) for e, c in zip(episodes, calls, strict=True)]
    gens = backend.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, seed=0))
    texts = [backend.tokenizer.decode(g.output_ids, skip_special_tokens=True).strip() for g in gens]
    return [placeholders(t, e) for t, e in zip(texts, episodes, strict=True)]


def load_bank(store: Store, build_run_id: str) -> tuple[str, list[WorkflowMemory]]:
    """(full id, memories) of a ``memories`` build run; ``ConfigError`` when it holds none."""
    with store.session() as s:
        run = repo.get_run(s, build_run_id)
        if run.kind is not RunKind.memories:
            raise ConfigError(f"run {run.id} is a {run.kind.value} run, not a memories build run "
                              "(see `agentmem memories list`)")
        bank = memory_repo.list_memories(s, run.id)
    if not bank:
        raise ConfigError(f"memories build run {run.id} holds no memories")
    return run.id, bank

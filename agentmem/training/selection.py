"""Select stored invocations and rebuild them for a student and a teacher.

The student always reads its own state (``aligned``); the teacher reads the state its context names.
Both rebuilds of one invocation have the same action tokens in the same order, so per-invocation action
slices of the two forward passes line up one to one. Every rebuilt sequence carries its group key
``(run id, task id, step)`` (``Sequence.group``): the G samples of a task at one step, which the
shared-prefix packing lets share their common prompt prefix (found on token ids only, in ``replay.pack``).

A call sampled under the privileged prompt (a privileged rollout: PSD's off-policy samples) stores its
privileged ids apart from its student-visible ``prompt_ids``: the student rebuilds the prompt without them
(``aligned``) and the ``privileged`` teacher the prompt with exactly the stored ids, so the teacher reads
what the sampler read and both hold the same action tokens. Other calls get the privileged message
rendered from their episode (``replay.privileged.privileged_ids``, the same function the rollout uses).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field, replace

from transformers import PreTrainedTokenizerBase

from agentmem.errors import TrainingError
from agentmem.records import Episode, Invocation, InvocationKind, ServeCall, TeacherContext
from agentmem.replay import Sequence, rebuild, teacher_calls
from agentmem.replay.privileged import hint_ids, privileged_ids
from agentmem.training.chat_history import ChatHistory, chat_turns
from store import repository as repo
from store.engine import Store
from store.repository import serve as serve_repo

__all__ = ["Selection", "select", "student_sequences", "teacher_selection", "teacher_sequences"]


@dataclass(frozen=True)
class Selection:
    """Invocations in (run, task, sample, step) order and the episodes they belong to. The order is a
    function of what was stored, not of the random ids rows got, so two rollouts that stored the same calls
    (a loop round redone after a kill, the same config run twice) give a training job the same data order.
    ``chats``: what the client sent with each selected call that ``agentmem serve`` recorded from a chat
    (its messages and tools, which ``persistent_chat`` renders), by invocation id."""

    invocations: list[Invocation]
    episodes: dict[str, Episode]
    chats: dict[str, ServeCall] = field(default_factory=dict)

    @property
    def ids(self) -> list[str]:
        return [i.id for i in self.invocations]

    def group_of(self, inv: Invocation) -> tuple[str, str, int]:
        """The shared-prefix group of a call: (run id, task id, step)."""
        episode = self.episodes[inv.episode_id]
        return episode.run_id, episode.task_id, inv.step


def select(
    store: Store,
    run_ids: Seq[str],
    *,
    kinds: Seq[InvocationKind | str] | None = None,
    policy_versions: Seq[str] | None = None,
    min_f1: float | None = None,
    constrained: bool = True,
) -> Selection:
    """Every stored invocation of ``run_ids`` matching the filters; raises TrainingError when empty or when a
    run does not exist. ``min_f1``: only calls of episodes whose F1 is at least this (an unscored episode,
    F1 None, never passes). ``constrained=False`` leaves out the calls ``agentmem serve`` sampled under a grammar
    (``serve_calls.sampling["constraint"]``: structured output, a forced tool call): their stored log-probs are
    of the masked distribution, which neither a recompute of the student nor a teacher's log-probs reproduce
    (distill leaves them out; sft trains on them)."""
    with store.session() as s:
        run_ids = [repo.get_run(s, rid).id for rid in run_ids]  # full ids (abbreviations allowed)
        episodes = {e.id: e for e in repo.list_episodes(s, run_ids)}
        if min_f1 is not None:
            episodes = {k: e for k, e in episodes.items() if e.f1 is not None and e.f1 >= min_f1}
        invocations = [i for i in repo.stream_invocations(s, run_ids=run_ids, kinds=kinds,
                                                          policy_versions=policy_versions)
                       if i.episode_id in episodes]
        wanted = {i.id for i in invocations}
        chats = {k: c for k, c in serve_repo.chat_serve_calls(s, run_ids).items() if k in wanted}
    held = {k for k, c in chats.items() if "constraint" in (c.sampling or {})} if not constrained else set()
    invocations = [i for i in invocations if i.id not in held]
    run_index = {rid: n for n, rid in enumerate(run_ids)}

    def order(inv: Invocation) -> tuple:
        ep = episodes[inv.episode_id]
        return run_index[ep.run_id], ep.task_id, ep.sample_index, inv.step

    invocations.sort(key=order)
    if not invocations:
        raise TrainingError(f"no stored invocations match run(s) {', '.join(run_ids)}"
                            + (f" and kinds {[str(k) for k in kinds]}" if kinds else "")
                            + (f" in episodes with f1 >= {min_f1} (--min-f1)" if min_f1 is not None else "")
                            + (f" ({len(held)} calls sampled under a grammar left out: their log-probs are of the "
                               "masked distribution)" if held else ""))
    return Selection(invocations, episodes, chats)


def teacher_selection(selection: Selection, context: TeacherContext,
                      tokenizer: PreTrainedTokenizerBase) -> tuple[Selection, int]:
    """(the part of ``selection`` a teacher under ``context`` reads, how many calls it leaves out):
    ``replay.teacher_calls`` decides, given which calls are chat turns under the teacher's ``tokenizer``."""
    kept, left_out = teacher_calls(selection.invocations, context, chat_turns(selection, tokenizer))
    return replace(selection, invocations=kept), left_out


def teacher_sequences(
    selection: Selection, context: TeacherContext, tokenizer: PreTrainedTokenizerBase | None = None, *,
    aligned_kinds: Collection[str] = (),
) -> list[Sequence]:
    """Rebuild the selection under ``context``. ``replay.rebuild`` decides what the context reads; this gives it
    everything any context may read: the privileged message of each call's episode, its hint line and the chat
    rendering of a history, all with the teacher's ``tokenizer`` (without one, ``privileged``, ``hint`` and
    ``persistent_chat`` are refused). Calls of ``aligned_kinds`` are rebuilt ``aligned`` whatever ``context``."""
    if tokenizer is None:
        return _grouped(selection, rebuild(selection.invocations, context, aligned_kinds=aligned_kinds))
    cache: dict[str, list[int]] = {}

    def privileged(inv: Invocation) -> list[int]:
        if inv.episode_id not in cache:
            cache[inv.episode_id] = privileged_ids(tokenizer, selection.episodes[inv.episode_id])
        return cache[inv.episode_id]

    def hint(inv: Invocation) -> list[int]:
        return hint_ids(tokenizer, selection.episodes[inv.episode_id].evidence, inv.chunk_text)

    return _grouped(selection, rebuild(selection.invocations, context, privileged=privileged, hint=hint,
                                       conversation=ChatHistory(tokenizer, selection.chats),
                                       aligned_kinds=aligned_kinds))


def student_sequences(selection: Selection) -> list[Sequence]:
    return _grouped(selection, rebuild(selection.invocations, TeacherContext.aligned))


def _grouped(selection: Selection, sequences: Iterable[Sequence]) -> list[Sequence]:
    return [replace(seq, group=selection.group_of(inv))
            for inv, seq in zip(selection.invocations, sequences, strict=True)]

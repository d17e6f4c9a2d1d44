"""Rebuild stored invocations into token sequences, one pure function per teacher context.

Invariants (see DESIGN.md, "state alignment"):
- action tokens are the stored ``output_ids``, never re-tokenised text, in the order they were sampled;
- ``action_mask[i]`` is True iff ``input_ids[i + 1]`` was sampled by the policy, i.e. the prediction made at
  position ``i`` is an action. So for a prompt of P tokens and O outputs the mask covers positions
  ``P-1 .. P+O-2``; the last output token is input (it is part of the state) but predicts nothing we score.
- positions are ``0..len-1`` per rebuilt sequence; a sequence never sees tokens of another invocation unless
  the context says so (``persistent`` flattens the episode's earlier calls on purpose: it is the baseline;
  ``persistent_chat`` is the same history as one well-formed chat, rendered by the caller).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass, replace

import numpy as np

from agentmem.errors import ReplayError
from agentmem.records import Invocation, TeacherContext


@dataclass(frozen=True)
class Sequence:
    """One rebuilt invocation: what the scoring model reads, and which of its predictions are actions.

    ``action_ids`` (the sampled tokens, one per True in ``action_mask``, in order) and ``sampler_logprobs``
    are the stored ``output_ids`` / ``output_logprobs`` (all NaN for a call stored without log-probs, an
    oracle call, and in the ``aligned`` rebuild of a call sampled under a privileged prompt, whose stored
    log-probs belong to another input: cross-entropy and distillation use only the ids; the RL term refuses
    NaN). ``truncated_tokens`` counts prompt tokens cut from
    the left by packing (0 when the sequence is whole). ``group``: the calls that may share a prompt
    prefix when packed with ``shared_prefix=True`` carry the same key (the training layer sets it to the
    call's (run, task, step)); None packs the sequence as an ordinary segment."""

    invocation_id: str
    input_ids: np.ndarray  # int32 [L]
    position_ids: np.ndarray  # int32 [L]
    action_mask: np.ndarray  # bool [L]
    action_ids: np.ndarray  # int32 [O]
    sampler_logprobs: np.ndarray  # float32 [O]
    truncated_tokens: int = 0
    group: Hashable | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_actions(self) -> int:
        return int(self.action_ids.shape[0])


def _checked(inv: Invocation) -> None:
    if inv.prompt_tokens == 0:
        raise ReplayError(f"invocation {inv.id}: empty prompt_ids, the first action has no state to predict from")
    if inv.output_logprobs is not None and inv.output_logprobs.shape[0] != inv.output_tokens:
        raise ReplayError(
            f"invocation {inv.id}: {inv.output_tokens} output_ids but {inv.output_logprobs.shape[0]} output_logprobs"
        )


def _sequence(inv: Invocation, context_ids: np.ndarray) -> Sequence:
    """``context_ids`` (everything before the actions) + the stored outputs, positions from 0."""
    input_ids = np.concatenate([context_ids, inv.output_ids]).astype(np.int32)
    mask = np.zeros(input_ids.shape[0], dtype=bool)
    mask[context_ids.shape[0] - 1 : input_ids.shape[0] - 1] = True
    return Sequence(
        invocation_id=inv.id,
        input_ids=input_ids,
        position_ids=np.arange(input_ids.shape[0], dtype=np.int32),
        action_mask=mask,
        action_ids=inv.output_ids.copy(),
        sampler_logprobs=_sampler_logprobs(inv),
    )


def _sampler_logprobs(inv: Invocation) -> np.ndarray:
    if inv.output_logprobs is None:
        return np.full(inv.output_tokens, np.nan, dtype=np.float32)
    return inv.output_logprobs.copy()


def rebuild_aligned(inv: Invocation) -> Sequence:
    """Exactly the student's state: ``prompt_ids + output_ids`` at positions ``0..len-1``. For a call
    sampled under a privileged prompt (``inv.privileged_ids``) that is the prompt without the privileged
    ids, and its sampler log-probs are NaN: the stored ones were taken under the privileged prompt, so no
    policy-gradient ratio of the student may use them."""
    _checked(inv)
    seq = _sequence(inv, inv.prompt_ids)
    if inv.privileged_ids is None:
        return seq
    return replace(seq, sampler_logprobs=np.full(inv.output_tokens, np.nan, dtype=np.float32))


def _check_history(history: Seq[Invocation], inv: Invocation) -> None:
    _checked(inv)
    steps = [h.step for h in history]
    if any(h.episode_id != inv.episode_id for h in history):
        raise ReplayError(f"invocation {inv.id}: history holds calls of another episode")
    if steps != sorted(set(steps)) or (steps and steps[-1] >= inv.step):
        raise ReplayError(f"invocation {inv.id} (step {inv.step}): history steps {steps} are not increasing before it")


def rebuild_persistent(history: Seq[Invocation], inv: Invocation) -> Sequence:
    """The baseline: the episode's earlier calls (prompt + output of each, in step order) flattened before
    this call's prompt, positions continuing. Only this call's outputs are actions."""
    _check_history(history, inv)
    parts = [p for h in history for p in (h.prompt_ids, h.output_ids)]
    return _sequence(inv, np.concatenate([*parts, inv.prompt_ids]))


Conversation = Callable[[Seq[Invocation], Invocation], Seq[int]]


def rebuild_persistent_chat(history: Seq[Invocation], inv: Invocation, conversation: Conversation) -> Sequence:
    """The faithful full-history baseline: one well-formed multi-turn chat (system once, each earlier call's
    user turn, or for a served chat the messages its client sent, answered by its output, then this call's
    and the generation prompt), followed by
    this call's stored outputs, positions ``0..len-1``. Only this call's outputs are actions, unchanged.

    ``conversation(history, inv)`` gives the chat's ids up to the generation prompt: the training layer,
    which owns the tokenizer and its chat template, renders it (``training.chat_history``). It must end
    with the stored prompt's last token (the generation prompt), so the first action is predicted from the
    same token it was sampled after."""
    _check_history(history, inv)
    context = np.asarray(conversation(history, inv), dtype=np.int32)
    if context.ndim != 1 or context.shape[0] == 0 or context[-1] != inv.prompt_ids[-1]:
        raise ReplayError(f"invocation {inv.id}: the rendered conversation must be a flat list of ids ending with "
                          f"the stored prompt's last token {int(inv.prompt_ids[-1])} (the generation prompt)")
    return _sequence(inv, context)


def rebuild_privileged(inv: Invocation, privileged_ids: Seq[int], *, at: int = 0) -> Sequence:
    """``aligned`` with privileged context spliced into the teacher's prompt at prompt offset ``at``.

    The caller (the training layer, which owns the tokenizer) renders the privileged text as one complete
    chat message, e.g. ``tok.apply_chat_template([{"role": "system", "content": "Gold answer: ..."}])``,
    and passes its ids. ``at=0`` makes it the first message (ChatML: SmolLM2, Qwen2); ``at=1`` keeps a
    leading BOS first (Llama 3 style). ``at`` must leave at least one stored prompt token before the
    actions, so the first action is still predicted from the stored generation prompt. Positions are
    ``0..len-1`` over the spliced sequence; action tokens are unchanged."""
    _checked(inv)
    if not 0 <= at < inv.prompt_tokens:
        raise ReplayError(f"invocation {inv.id}: insertion offset {at} outside its {inv.prompt_tokens}-token prompt")
    extra = np.asarray(privileged_ids, dtype=np.int32)
    if extra.ndim != 1:
        raise ReplayError(f"invocation {inv.id}: privileged ids must be a flat list of token ids")
    prompt = inv.prompt_ids
    return _sequence(inv, np.concatenate([prompt[:at], extra, prompt[at:]]))


def teacher_calls(invocations: Iterable[Invocation], context: TeacherContext,
                  is_chat_turn: Callable[[Invocation], bool]) -> tuple[list[Invocation], int]:
    """(the calls a teacher under ``context`` reads, how many it leaves out). ``persistent_chat`` leaves out the
    calls that are no chat turns (``is_chat_turn``: ``training.chat_history.chat_turns``), and the calls kept get
    their step within what is kept (in memory only: scores are stored by invocation id), so each episode reads
    as whole; every other context reads every call."""
    invocations = list(invocations)
    if TeacherContext(context) is not TeacherContext.persistent_chat:
        return invocations, 0
    kept: list[Invocation] = []
    steps: dict[str, int] = {}
    for inv in invocations:
        if is_chat_turn(inv):
            step = steps[inv.episode_id] = steps.get(inv.episode_id, -1) + 1
            kept.append(inv if inv.step == step else type(inv).model_construct(
                _fields_set=set(inv.model_fields_set), **{**inv.__dict__, "step": step}))
    return kept, len(invocations) - len(kept)


def rebuild(
    invocations: Iterable[Invocation],
    context: TeacherContext,
    *,
    privileged: Callable[[Invocation], Seq[int]] | None = None,
    hint: Callable[[Invocation], Seq[int]] | None = None,
    privileged_at: int = 0,
    conversation: Conversation | None = None,
    aligned_kinds: Collection[str] = (),
) -> Iterator[Sequence]:
    """Rebuild invocations, given in (episode, step) order, under one teacher context: the one place that
    branches on it (``training.selection`` passes every context's inputs; this picks what the context reads).

    ``persistent`` and ``persistent_chat`` take each call's history from the calls seen before it in the
    same episode, so the iterable must hold every earlier call of an episode (a whole-episode selection;
    a missing step is a ``ReplayError``).
    ``privileged`` needs ``privileged(inv)`` (the episode's privileged message) and ``hint`` needs ``hint(inv)``
    (the call's hint line, ``replay.privileged.hint_ids``): the ids to splice in at ``privileged_at`` (see
    ``rebuild_privileged``), except for a call sampled under that very splice, which reads its stored
    ``privileged_ids`` (what the sampler read). ``persistent_chat`` needs ``conversation(history, inv)`` (see
    ``rebuild_persistent_chat``). Calls whose ``str(kind)`` is in ``aligned_kinds`` are rebuilt ``aligned``
    whatever the context (they stay in the history of the calls after them)."""
    context = TeacherContext(context)
    splice = {TeacherContext.privileged: privileged, TeacherContext.hint: hint}.get(context)
    if context in (TeacherContext.privileged, TeacherContext.hint) and splice is None:
        raise ReplayError(f"teacher context {context.value!r} needs the teacher's tokenizer (a {context.value}(inv) -> "
                          "token ids function)")
    if context is TeacherContext.persistent_chat and conversation is None:
        raise ReplayError("teacher context 'persistent_chat' needs the teacher's tokenizer (a "
                          "conversation(history, inv) -> token ids function)")
    aligned = {str(k) for k in aligned_kinds}
    history: dict[str, list[Invocation]] = {}
    last_step: dict[str, int] = {}
    for inv in invocations:
        if inv.episode_id in last_step and inv.step <= last_step[inv.episode_id]:
            raise ReplayError(
                f"invocation {inv.id}: step {inv.step} of episode {inv.episode_id} after step "
                f"{last_step[inv.episode_id]}; invocations must come in (episode, step) order"
            )
        expected = last_step.get(inv.episode_id, -1) + 1
        if context in (TeacherContext.persistent, TeacherContext.persistent_chat) and inv.step != expected:
            raise ReplayError(f"teacher context {context.value!r} needs whole episodes: episode {inv.episode_id} has "
                              f"step {inv.step} without step {expected} in the selection (select all kinds)")
        last_step[inv.episode_id] = inv.step
        if context is TeacherContext.aligned or str(inv.kind) in aligned:
            yield rebuild_aligned(inv)
            if context in (TeacherContext.persistent, TeacherContext.persistent_chat):
                history.setdefault(inv.episode_id, []).append(inv)
        elif context is TeacherContext.persistent:
            earlier = history.setdefault(inv.episode_id, [])
            yield rebuild_persistent(earlier, inv)
            earlier.append(inv)
        elif context is TeacherContext.persistent_chat:
            assert conversation is not None  # checked before the loop
            earlier = history.setdefault(inv.episode_id, [])
            yield rebuild_persistent_chat(earlier, inv, conversation)
            earlier.append(inv)
        elif inv.privileged_ids is not None and inv.sampled_context.value == context.value:
            yield rebuild_privileged(inv, inv.privileged_ids.tolist(), at=privileged_at)  # what the sampler read
        else:
            assert splice is not None  # checked before the loop
            yield rebuild_privileged(inv, splice(inv), at=privileged_at)

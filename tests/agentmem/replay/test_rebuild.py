"""Rebuild: exact sequences per teacher context, from hand-made invocations; ``rebuild`` alone checks what each
teacher context needs."""

from __future__ import annotations

import numpy as np
import pytest

from agentmem.records import Invocation, InvocationKind, TeacherContext
from agentmem.replay import (
    ReplayError,
    rebuild,
    rebuild_aligned,
    rebuild_persistent,
    rebuild_persistent_chat,
    rebuild_privileged,
)


def inv(id_: str, step: int, prompt: list[int], output: list[int], episode: str = "e1") -> Invocation:
    return Invocation(
        id=id_,
        episode_id=episode,
        step=step,
        kind=InvocationKind.memory_update,
        prompt_ids=prompt,
        output_ids=output,
        output_logprobs=[-0.5 * (k + 1) for k in range(len(output))],
    )


A = inv("a", 0, [10, 11, 12], [20, 21])
B = inv("b", 1, [13, 14], [22, 23, 24])


def eq(arr: np.ndarray, expected: list) -> None:
    assert arr.tolist() == expected


def test_aligned_is_prompt_plus_output_with_actions_at_prediction_positions():
    s = rebuild_aligned(A)
    assert s.invocation_id == "a" and s.truncated_tokens == 0 and len(s) == 5 and s.num_actions == 2
    eq(s.input_ids, [10, 11, 12, 20, 21])
    eq(s.position_ids, [0, 1, 2, 3, 4])
    # position 2 (last prompt token) predicts 20, position 3 predicts 21; position 4 predicts nothing scored
    eq(s.action_mask, [False, False, True, True, False])
    eq(s.action_ids, [20, 21])
    eq(s.sampler_logprobs, [-0.5, -1.0])
    assert s.input_ids.dtype == np.int32 and s.position_ids.dtype == np.int32
    assert s.action_mask.dtype == bool and s.sampler_logprobs.dtype == np.float32
    # the mask picks exactly the positions whose next input token is the action
    assert s.input_ids[1:][s.action_mask[:-1]].tolist() == s.action_ids.tolist()


def test_aligned_with_no_output_has_no_actions():
    s = rebuild_aligned(inv("c", 0, [1, 2], []))
    eq(s.input_ids, [1, 2])
    eq(s.action_mask, [False, False])
    assert s.num_actions == 0


def test_persistent_flattens_earlier_calls_and_masks_only_this_call():
    s = rebuild_persistent([A], B)
    eq(s.input_ids, [10, 11, 12, 20, 21, 13, 14, 22, 23, 24])
    eq(s.position_ids, list(range(10)))
    eq(s.action_mask, [False] * 6 + [True, True, True, False])
    eq(s.action_ids, [22, 23, 24])
    eq(s.sampler_logprobs, [-0.5, -1.0, -1.5])


def test_persistent_rejects_foreign_or_later_history():
    with pytest.raises(ReplayError, match="another episode"):
        rebuild_persistent([inv("x", 0, [1], [2], episode="e2")], B)
    with pytest.raises(ReplayError, match="not increasing"):
        rebuild_persistent([B], A)


def test_privileged_splices_ids_and_keeps_actions():
    s = rebuild_privileged(A, [90, 91])
    eq(s.input_ids, [90, 91, 10, 11, 12, 20, 21])
    eq(s.position_ids, list(range(7)))
    eq(s.action_mask, [False] * 4 + [True, True, False])
    eq(s.action_ids, [20, 21])
    s1 = rebuild_privileged(A, [90], at=1)  # keep a leading BOS first
    eq(s1.input_ids, [10, 90, 11, 12, 20, 21])
    eq(s1.action_mask, [False, False, False, True, True, False])


def test_privileged_offset_must_leave_the_generation_prompt_last():
    with pytest.raises(ReplayError, match="insertion offset 3"):
        rebuild_privileged(A, [90], at=3)


def test_rebuild_dispatches_per_context():
    out = list(rebuild([A, B], TeacherContext.aligned))
    assert [s.invocation_id for s in out] == ["a", "b"]
    eq(out[1].input_ids, [13, 14, 22, 23, 24])
    per = list(rebuild([A, B], "persistent"))
    eq(per[0].input_ids, [10, 11, 12, 20, 21])
    eq(per[1].input_ids, [10, 11, 12, 20, 21, 13, 14, 22, 23, 24])
    priv = list(rebuild([A, B], TeacherContext.privileged, privileged=lambda i: [99] * i.step))
    eq(priv[0].input_ids, [10, 11, 12, 20, 21])
    eq(priv[1].input_ids, [99, 13, 14, 22, 23, 24])


def test_persistent_history_is_per_episode():
    c = inv("c", 0, [50], [51], episode="e2")
    out = list(rebuild([A, B, c], TeacherContext.persistent))
    eq(out[2].input_ids, [50, 51])


def test_rebuild_errors():
    with pytest.raises(ReplayError, match="privileged"):
        list(rebuild([A], TeacherContext.privileged))
    with pytest.raises(ReplayError, match=r"\(episode, step\) order"):
        list(rebuild([B, A], TeacherContext.aligned))
    with pytest.raises(ReplayError, match="empty prompt_ids"):
        rebuild_aligned(inv("z", 0, [], [1]))
    bad = A.model_copy(update={"output_logprobs": np.zeros(3, np.float32)})
    with pytest.raises(ReplayError, match="2 output_ids but 3"):
        rebuild_aligned(bad)


def test_persistent_chat_takes_the_rendered_conversation_and_keeps_the_actions():
    """Replay stays tokenizer-free: the caller renders the chat from (history, call); replay checks the
    history, appends the stored outputs as the actions and masks only them."""
    seen = []

    def conversation(history, call):
        seen.append(([h.id for h in history], call.id))
        return [1, *[t for h in history for t in h.output_ids], 7, call.prompt_ids[-1]]

    out = list(rebuild([A, B], TeacherContext.persistent_chat, conversation=conversation))
    assert seen == [([], "a"), (["a"], "b")]
    eq(out[0].input_ids, [1, 7, 12, 20, 21])
    eq(out[1].input_ids, [1, 20, 21, 7, 14, 22, 23, 24])
    eq(out[1].position_ids, list(range(8)))
    eq(out[1].action_mask, [False] * 4 + [True, True, True, False])
    eq(out[1].action_ids, [22, 23, 24])
    eq(out[1].sampler_logprobs, [-0.5, -1.0, -1.5])
    assert rebuild_persistent_chat([A], B, conversation).input_ids.tolist() == out[1].input_ids.tolist()


def test_persistent_chat_errors():
    with pytest.raises(ReplayError, match="persistent_chat"):
        list(rebuild([A], TeacherContext.persistent_chat))
    with pytest.raises(ReplayError, match="ending with the stored prompt's last token 14"):
        rebuild_persistent_chat([A], B, lambda history, call: [1, 2, 3])
    with pytest.raises(ReplayError, match="not increasing"):
        rebuild_persistent_chat([B], A, lambda history, call: [12])


def call(step: int, episode: str = "e") -> Invocation:
    return Invocation(id=f"{episode}{step}", episode_id=episode, step=step, kind="memory_update",
                      prompt_ids=[10 + step, 20 + step], output_ids=[30 + step], output_logprobs=[-0.5])


def test_rebuild_alone_checks_what_each_teacher_context_needs():
    gappy = [call(0), call(2)]  # step 1 not selected (say, another kind)
    assert [s.input_ids.tolist() for s in rebuild(gappy, TeacherContext.aligned)] == [[10, 20, 30], [12, 22, 32]]
    for context in (TeacherContext.persistent, TeacherContext.persistent_chat):
        with pytest.raises(ReplayError, match=rf"teacher context '{context.value}' needs whole episodes: episode e "
                                              r"has step 2 without step 1"):
            list(rebuild(gappy, context, conversation=lambda history, inv: [1, int(inv.prompt_ids[-1])]))
    whole = [call(0), call(1)]
    assert [s.input_ids.tolist() for s in rebuild(whole, TeacherContext.persistent)][1][:3] == [10, 20, 30]
    with pytest.raises(ReplayError, match="teacher context 'privileged' needs the teacher's tokenizer"):
        list(rebuild(whole, TeacherContext.privileged))

"""The ``hint`` teacher context: before each memory update, one line saying whether the call's chunk holds a fact
about the question's entity (no answer text). The hint teacher reads it and is fine-tuned under it
(``sft --context hint``); the student never sees it."""

from __future__ import annotations

import pytest
from helpers import Called, register_policy
from job_fixtures import episodes_and_calls, rollout_config
from model_helpers import RecordingBackend
from typer.testing import CliRunner

from agentmem.jobs.rollout import run_rollout
from agentmem.records import Episode, Invocation, SamplingContext, TeacherContext
from agentmem.replay.privileged import HINT_NO, HINT_YES, hint_ids, hint_line
from agentmem.testing.tiny_models import tiny_llama, tiny_tokenizer
from agentmem.training.selection import Selection, student_sequences, teacher_sequences
from cli.app import app

EVIDENCE = ["Tino works for Duzadyne.", "Duzadyne has 93 employees."]


def test_the_hint_line_says_whether_the_chunk_holds_a_fact_and_nothing_else():
    assert HINT_YES == "Hint: this chunk states a fact about the question's entity."
    assert HINT_NO == "Hint: this chunk states no fact about the question's entity."
    assert hint_line(EVIDENCE, "The bridge grew. Duzadyne has 93 employees. The river was busy.") == HINT_YES
    assert hint_line(EVIDENCE, "The bridge grew. Bino has 33 employees.") == HINT_NO
    assert hint_line(EVIDENCE, None) is None  # an answer call reads no chunk: no hint
    assert hint_line([], "Duzadyne has 93 employees.") == HINT_NO


def test_the_teacher_reads_the_hint_and_the_student_does_not():
    tok = tiny_tokenizer()
    episode = Episode(id="e1", run_id="r", env="synthetic", task_id="t", question="How many employees?",
                      gold_answers=["93"], evidence=EVIDENCE)
    chunk = "The bridge grew. Duzadyne has 93 employees."
    update = Invocation(id="u", episode_id="e1", step=0, kind="memory_update", prompt_ids=[11, 12, 13],
                        output_ids=[21, 22], output_logprobs=[-0.5, -0.25], chunk_text=chunk, chunk_index=0)
    answer = Invocation(id="a", episode_id="e1", step=1, kind="answer", prompt_ids=[14, 15], output_ids=[23],
                        output_logprobs=[-1.0])
    selection = Selection([update, answer], {"e1": episode})
    teacher_update, teacher_answer = teacher_sequences(selection, TeacherContext.hint, tok)
    student_update, student_answer = student_sequences(selection)
    splice = hint_ids(tok, EVIDENCE, chunk)
    assert tok.decode(splice) == tok.apply_chat_template([{"role": "system", "content": HINT_YES}], tokenize=False)
    assert teacher_update.input_ids.tolist() == splice + [11, 12, 13, 21, 22]
    assert teacher_update.action_ids.tolist() == student_update.action_ids.tolist() == [21, 22]
    assert student_update.input_ids.tolist() == [11, 12, 13, 21, 22]
    assert teacher_answer.input_ids.tolist() == student_answer.input_ids.tolist() == [14, 15, 23]
    text = tok.decode(teacher_update.input_ids.tolist())
    assert HINT_YES in text and HINT_YES not in tok.decode(student_update.input_ids.tolist())
    assert "93" not in tok.decode(splice) and "Duzadyne" not in tok.decode(splice)  # no answer, no entity


def test_a_hint_rollout_samples_updates_under_their_hint_line(store):
    """What a hint teacher's validation samples: each memory update's prompt after its hint line (stored apart,
    ``sampled_context`` hint), the answer call's prompt alone."""
    tok = tiny_tokenizer()
    backend = RecordingBackend.from_model(tiny_llama(seed=3), tok)
    policy = register_policy(store, "/models/tiny", "tiny")
    run_id = run_rollout(store, rollout_config(context="hint"), backend=backend, policy=policy).run_id
    episodes, invocations = episodes_and_calls(store, run_id)
    kinds = set()
    for inv in invocations:
        assert inv.sampled_context is SamplingContext.hint
        want = hint_ids(tok, episodes[inv.episode_id].evidence, inv.chunk_text)
        assert inv.privileged_ids.tolist() == want
        kinds.add((inv.kind, bool(want)))
        assert tok.decode(want).count("Hint:") == (inv.kind == "memory_update")
    assert kinds == {("memory_update", True), ("answer", False)}
    assert sorted(map(tuple, backend.seen)) == sorted(tuple(i.sampled_prompt_ids.tolist()) for i in invocations)


def test_sft_and_rollout_take_the_hint_context_from_the_command_line(captured):
    runner = CliRunner()
    result = runner.invoke(app, ["sft", "--run", "a", "--context", "hint", "--device", "cpu"])
    assert isinstance(result.exception, Called), result.output
    assert captured["sft"].context is SamplingContext.hint
    result = runner.invoke(app, ["rollout", "--context", "hint", "--device", "cpu"])
    assert isinstance(result.exception, Called), result.output
    assert captured["rollout"].context is SamplingContext.hint


def test_the_oracle_reads_no_hint():
    with pytest.raises(ValueError, match="context hint needs policy model"):
        rollout_config(context="hint", policy="oracle")

"""The teacher memory policy (AMD, DuoMem): workflow memories built from a run's successful episodes keep their
provenance (SQLite and Postgres), the oracle and model writers write exact texts, retrieval picks the exact
top-k of a known bank, the rollout's prompts carry them exactly, resume is exact, the CLI fails in one line,
and LoRA SFT on the teacher's successful episodes combines with the memories."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import SYNTH, KilledBackend, agentmem, canonical_calls, register_policy, stored_calls
from transformers import AutoModelForCausalLM

from agentmem.agent.prompts import ANSWER, SYSTEM, UPDATE, answer_prompt, render, update_prompt
from agentmem.agent.registry import memory_policy
from agentmem.agent.teacher_memory import WORKFLOW, TeacherMemoryPolicy, workflow_system
from agentmem.backends.scripted import ScriptedBackend
from agentmem.backends.transformers_backend import TransformersBackend
from agentmem.config import AgentConfig, RolloutConfig, SftConfig
from agentmem.errors import AgentError, ConfigError
from agentmem.jobs.memories import (
    WRITER_PROMPT,
    WRITER_SYSTEM,
    MemoriesConfig,
    build_memories,
    oracle_workflow,
    placeholders,
)
from agentmem.jobs.memory_setup import memory_for
from agentmem.jobs.rollout import run_rollout
from agentmem.jobs.sft import run_sft
from agentmem.records import Episode, Invocation, RunKind, WorkflowMemory
from agentmem.testing.tiny_models import save_tiny, tiny_tokenizer
from envs import load_env
from store import repository as repo
from store.errors import NotFound
from store.repository import memories as memory_repo


def agent(policy="overwrite", **options) -> AgentConfig:
    return AgentConfig(memory_policy=policy, memory_options=options, memory_tokens=16, answer_max_new_tokens=8,
                       max_batch=4, seed=1, prompt_layout="memory-first")


def tiny_env(tok):
    return load_env("synthetic", seed=0, chunk_tokens=48,
                    count_tokens=lambda s: len(tok(s, add_special_tokens=False)["input_ids"]), **SYNTH)


def teacher_rollout(store, tok):
    """A scripted overwrite rollout of 3 tasks x 2 samples that answers right; then sample 0 of each task is
    marked wrong (f1 0), so the successful episodes are the 3 samples 1."""
    policy = register_policy(store, "/models/tiny", "tiny")
    answers = {t.question: t.answers[0] for t in tiny_env(tok).tasks(3)}

    def reply(prompt):
        text = tok.decode(prompt)
        question = next(q for q in answers if q in text)
        return answers[question] if "Answer the question" in text else f"about {question.split()[-3]}"

    config = RolloutConfig(model="tiny", episodes=3, group_size=2, chunk_tokens=48, env_knobs=SYNTH, agent=agent(),
                           seed=0)
    result = run_rollout(store, config, backend=ScriptedBackend(tok, reply), policy=policy)
    with store.session() as s:
        for ep in repo.list_episodes(s, result.run_id):
            if ep.sample_index == 0:
                repo.update_episode(s, ep.model_copy(update={"f1": 0.0, "reward": 0.0}))
        s.commit()
        episodes = repo.list_episodes(s, result.run_id)
    return dataclasses.replace(result, episodes=episodes)


# ---- writers ----------------------------------------------------------------------------------------


def call(step, kind, before, after, output=""):
    return Invocation(id=f"i{step}", episode_id="e", step=step, kind=kind, prompt_ids=[1], output_ids=[2],
                      output_logprobs=None, memory_before=before, memory_after=after, output_text=output)


EPISODE = Episode(id="e", run_id="r", env="synthetic", task_id="t", question="Which company does Vode work for?",
                  gold_answers=["Katidyne"], f1=1.0)
CALLS = [call(0, "memory_update", "", ""), call(1, "memory_update", "", "Vode works for Katidyne."),
         call(2, "memory_update", "Vode works for Katidyne.", "Vode works for Katidyne."),
         call(3, "answer", "Vode works for Katidyne.", "Vode works for Katidyne.", output="Katidyne")]


def test_placeholders_and_the_oracle_template_are_exact():
    assert placeholders("Vode works for KATIDYNE; Vode.", EPISODE) == "<E1> works for <ANSWER>; <E1>."
    two = EPISODE.model_copy(update={"question": "Who is the mentor of Roso and Sire?", "gold_answers": ["Sire"]})
    assert placeholders("Roso met Sire", two) == "<E1> met <ANSWER>"  # an answer is never a name placeholder
    assert oracle_workflow(EPISODE, CALLS) == (
        "Task pattern: Which company does <E1> work for?\n"
        "1. Read the text section by section (3 sections); in each, look only for sentences about the question's "
        "names.\n"
        "2. Keep those sentences verbatim in memory and drop the rest (relevant facts were in 1 of 3 sections).\n"
        "3. Memory at the end: <E1> works for <ANSWER>.\n"
        "4. Answer from memory with the short answer only: <ANSWER>.")
    routed = [call(0, "route", "", "route: ..."), call(1, "answer", "", "", output="Katidyne")]
    assert oracle_workflow(EPISODE, routed) == ("Task pattern: Which company does <E1> work for?\n"
                                                "1. Answer with the short answer only: <ANSWER>.\n"
                                                "Other calls made: route.")


def test_oracle_build_keeps_provenance(store):
    tok = tiny_tokenizer()
    source = teacher_rollout(store, tok)
    good = sorted((e for e in source.episodes if e.f1 == 1.0), key=lambda e: (e.task_id, e.sample_index))
    assert len(good) == 3 and all(e.sample_index == 1 for e in good)
    result = build_memories(store, MemoriesConfig(run=source.run_id[:8]))
    assert result.source_run_id == source.run_id and len(result.memories) == 3
    with store.session() as s:
        run = repo.get_run(s, result.run_id)
        assert run.kind is RunKind.memories and run.status == "finished"
        assert run.config["run"] == source.run_id and run.config["min_f1"] == 1.0
        by_episode = {m.source_episode_id: m for m in memory_repo.list_memories(s, result.run_id)}
        assert sorted(by_episode) == sorted(e.id for e in good)
        for ep in good:
            m = by_episode[ep.id]
            calls = repo.episode_invocations(s, ep.id)
            assert m.build_run_id == result.run_id and m.source_run_id == source.run_id
            assert m.source_invocation_ids == [c.id for c in calls]
            assert m.writer == "oracle" and m.f1 == 1.0 and m.env == "synthetic" and m.question == ep.question
            assert m.text == oracle_workflow(ep, calls)
        memory_repo.insert_memories(s, result.memories)  # idempotent: offered again, nothing is added
        s.commit()
        assert len(memory_repo.list_memories(s)) == 3


def test_model_writer_prompt_and_row_are_exact(sqlite_store):
    tok = tiny_tokenizer()
    source = teacher_rollout(sqlite_store, tok)
    writer = ScriptedBackend(tok, lambda p: "1. Find Vode.\n2. Say Katidyne.")
    policy = register_policy(sqlite_store, "/models/writer", "writer")
    result = build_memories(sqlite_store, MemoriesConfig(run=source.run_id, writer="/models/writer"),
                            backend=writer, policy=policy)
    assert len(writer.seen_prompts) == 3
    with sqlite_store.session() as s:
        first = min((e for e in source.episodes if e.f1 == 1.0), key=lambda e: e.task_id)
        calls = repo.episode_invocations(s, first.id)
    trace = "\n".join(f"{c.step}. {c.kind}: " + ((c.output_text if c.kind == "answer" else c.memory_after).strip()
                                                  or "(empty)") for c in calls)
    want = render(tok, WRITER_PROMPT.format(question=first.question, answer=first.gold_answers[0], trace=trace),
                  system=WRITER_SYSTEM).ids
    assert want in writer.seen_prompts
    (m,) = [m for m in result.memories if m.source_episode_id == first.id]
    assert m.writer == f"model:{policy.id}"
    assert m.text == placeholders("1. Find Vode.\n2. Say Katidyne.", first)


def test_min_f1_filters_and_an_empty_selection_leaves_no_run(sqlite_store):
    tok = tiny_tokenizer()
    source = teacher_rollout(sqlite_store, tok)
    assert len(build_memories(sqlite_store, MemoriesConfig(run=source.run_id, min_f1=0.0)).memories) == 6
    with sqlite_store.session() as s:
        for ep in repo.list_episodes(s, source.run_id):
            repo.update_episode(s, ep.model_copy(update={"f1": 0.5}))
        s.commit()
    with pytest.raises(ConfigError, match=rf"run {source.run_id} \(rollout\) has no episode with f1 >= 0.9"):
        build_memories(sqlite_store, MemoriesConfig(run=source.run_id, min_f1=0.9))
    with pytest.raises(NotFound, match="no run with id 'nopenope'"):
        build_memories(sqlite_store, MemoriesConfig(run="nopenope"))
    with sqlite_store.session() as s:
        assert [r.run.kind for r in repo.list_runs(s)].count(RunKind.memories) == 1


# ---- the policy -------------------------------------------------------------------------------------


def memory(i, question, text) -> WorkflowMemory:
    return WorkflowMemory(id=f"m{i}", source_run_id="r", source_episode_id=f"e{i}", writer="oracle", env="synthetic",
                          question=question, text=text)


BANK = [memory(0, "Who is the mentor of Roso?", "W0"), memory(1, "Which company does Dado work for?", "W1"),
        memory(2, "Which company does Vode work for?", "W2"), memory(3, "Where was Dado born?", "W3")]


def teacher(tok, bank, **options) -> TeacherMemoryPolicy:
    """The teacher policy over ``bank`` (16 memory tokens, memory-first), built by the registry."""
    policy = memory_policy(tok, agent("teacher", memories="bank", **options), lambda run: bank)
    assert isinstance(policy, TeacherMemoryPolicy)
    return policy


def test_top_k_memories_are_exact_on_a_known_bank():
    tok = tiny_tokenizer()
    one = teacher(tok, BANK)
    assert [m.id for m in one.retrieve("Which company does Vode work for?")] == ["m2"]  # k = 1 by default
    three = teacher(tok, BANK, k=3)
    assert [m.id for m in three.retrieve("Which company does Dado work for?")] == ["m1", "m2", "m3"]
    assert [m.id for m in three.retrieve("zebra")] == ["m0", "m1", "m2"]  # nothing matches: bank order
    assert teacher(tok, []).retrieve("anything") == []


def test_prompts_carry_the_memories_in_the_system_message_exactly():
    tok = tiny_tokenizer()
    task = tiny_env(tok).tasks(1)[0]
    policy = teacher(tok, BANK, k=2)
    state = policy.initial_state(task)
    assert state.workflows == ("W2", "W1")
    system = SYSTEM + "\n\n" + WORKFLOW.format(memories="Workflow 1:\nW2\n\nWorkflow 2:\nW1")
    assert workflow_system(["W2", "W1"]) == system
    assert system.startswith(SYSTEM + "\n\nWorkflow memories from similar solved tasks (strategies, not answers):")
    first = policy.next_call(state, task)
    want = render(tok, UPDATE.format(question=task.question, memory="(empty)", chunk=task.chunks[0]), system=system)
    assert first.prompt == want and first.kind == "memory_update" and first.chunk_index == 0
    state = policy.consume(state, first, tok.encode("Vode facts"), "Vode facts")
    for _ in task.chunks[1:]:
        state = policy.consume(state, policy.next_call(state, task), tok.encode("Vode facts"), "Vode facts")
    last = policy.next_call(state, task)
    assert last.final and last.prompt == render(tok, ANSWER.format(question=task.question, memory="Vode facts"),
                                                system=system)
    # an empty bank gives exactly overwrite's prompts
    bare = teacher(tok, [])
    assert bare.next_call(bare.initial_state(task), task).prompt == update_prompt(tok, task.question, "",
                                                                                  task.chunks[0], "memory-first")
    assert answer_prompt(tok, "q", "").text == render(tok, ANSWER.format(question="q", memory="(empty)")).text


def test_memory_for_loads_the_bank_and_options_are_checked(sqlite_store):
    tok = tiny_tokenizer()
    source = teacher_rollout(sqlite_store, tok)
    built = build_memories(sqlite_store, MemoriesConfig(run=source.run_id))
    policy = memory_for(sqlite_store, tok, agent("teacher", memories=built.run_id[:10], k=2))
    assert isinstance(policy, TeacherMemoryPolicy) and policy.k == 2 and policy.bank == built.memories
    with pytest.raises(AgentError, match="needs its memory bank"):
        memory_policy(tok, agent("teacher", memories=built.run_id))
    with pytest.raises(AgentError, match=r"bad --memory-option \(memories: Field required\)"):
        memory_for(sqlite_store, tok, agent("teacher"))
    with pytest.raises(ConfigError, match=f"run {source.run_id} is a rollout run, not a memories build run"):
        memory_for(sqlite_store, tok, agent("teacher", memories=source.run_id))
    with pytest.raises(NotFound, match="no run with id 'abcdefabcdef'"):
        memory_for(sqlite_store, tok, agent("teacher", memories="abcdefabcdef"))


def student_config(bank_id, **kw) -> RolloutConfig:
    base = dict(model="tiny", episodes=3, group_size=2, chunk_tokens=48, env_knobs=SYNTH, seed=0,
                agent=agent("teacher", memories=bank_id))
    return RolloutConfig(**(base | kw))


def canonical(store, run_id):
    return canonical_calls(*stored_calls(store, run_id), "prompt_ids", "output_ids", "memory_after")


def test_teacher_rollout_prompts_and_exact_resume(sqlite_store):
    tok = tiny_tokenizer()
    built = build_memories(sqlite_store, MemoriesConfig(run=teacher_rollout(sqlite_store, tok).run_id))
    policy = register_policy(sqlite_store, "/models/tiny", "tiny")
    respond = lambda p: "Oslo"  # noqa: E731
    whole = run_rollout(sqlite_store, student_config(built.run_id), backend=ScriptedBackend(tok, respond),
                        policy=policy)
    want = canonical(sqlite_store, whole.run_id)
    tasks = {t.task_id: t for t in tiny_env(tok).tasks(3)}
    bank = {m.question: m.text for m in built.memories}
    for (task_id, _), step, kind, prompt, *_ in want:
        task = tasks[task_id]
        assert "Workflow 1:\n" + bank[task.question] in tok.decode(prompt)  # its own source question ranks first
        assert kind == ("answer" if step == len(task.chunks) else "memory_update")
    killed = KilledBackend(tok, respond)
    killed.left = 3
    with pytest.raises(KeyboardInterrupt):
        run_rollout(sqlite_store, student_config(built.run_id), backend=killed, policy=policy)
    with sqlite_store.session() as s:
        run_id = next(r.run.id for r in repo.list_runs(s) if r.run.kind is RunKind.rollout and r.run.status != "finished")
    result = run_rollout(sqlite_store, None, backend=ScriptedBackend(tok, respond), policy=policy, resume=run_id)
    assert result.resumed_episodes > 0
    assert canonical(sqlite_store, run_id) == want


def test_duomem_lora_sft_on_successful_teacher_episodes_combines_with_memories(sqlite_store, tmp_path):
    """DuoMem: LoRA SFT on the teacher's successful episodes, then a rollout of the trained student with the
    teacher's memories in its prompts."""
    tok = tiny_tokenizer()
    teacher = teacher_rollout(sqlite_store, tok)
    built = build_memories(sqlite_store, MemoriesConfig(run=teacher.run_id))
    folder = save_tiny(tmp_path / "tiny")
    sft = run_sft(sqlite_store, SftConfig(run_ids=[teacher.run_id], student=folder, min_f1=1.0, lora_rank=2, out=str(tmp_path / "ckpt"), optim=dict(steps=1), batch=dict(invocations_per_step=64)))
    good = [e for e in teacher.episodes if e.f1 == 1.0]
    with sqlite_store.session() as s:
        n_good = sum(len(repo.episode_invocations(s, e.id)) for e in good)
        out_tokens = sum(i.output_tokens for e in good for i in repo.episode_invocations(s, e.id))
    assert sft.history[0].metrics["actions"] == out_tokens and n_good > 0
    student = AutoModelForCausalLM.from_pretrained(sft.last_checkpoint.path)
    config = student_config(built.run_id, episodes=1, group_size=1)
    result = run_rollout(sqlite_store, config, backend=TransformersBackend.from_model(student, tok),
                         policy=sft.last_checkpoint)
    with sqlite_store.session() as s:
        invs = list(repo.stream_invocations(s, run_ids=[result.run_id]))
    assert invs and all("Workflow 1:" in i.prompt_text for i in invs)
    assert {i.memory_policy for i in invs} == {"teacher"}
    assert {i.policy_version for i in invs} == {sft.last_checkpoint.id}


# ---- CLI --------------------------------------------------------------------------------------------


def test_cli_build_and_list_fail_in_one_line_and_list_shows_provenance(sqlite_store, tmp_path):
    db = str(tmp_path / "agentmem.db")  # the sqlite_store fixture's file
    bad = agentmem("memories", "build", "--run", "nopenope", "--db", db)
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == ["error: no run with id 'nopenope' (see `agentmem runs`)"]
    assert agentmem("memories", "list", "--db", db).stdout.startswith("no memories yet")
    source = teacher_rollout(sqlite_store, tiny_tokenizer())
    built = agentmem("memories", "build", "--run", source.run_id, "--db", db)
    assert built.returncode == 0, built.stderr
    first, line = built.stdout.strip().splitlines()  # the run id as soon as the run is written, then the result
    assert line.startswith(f"memories_run_id={first.removeprefix('run_id=')} ")
    assert line.endswith(f"memories=3 source_run={source.run_id}")
    listed = agentmem("memories", "list", "--db", db, "--full")
    assert listed.returncode == 0 and listed.stdout.count("== memory ") == 3 and "Task pattern:" in listed.stdout
    missing = agentmem("memories", "list", "--run", "zzzzzzzz", "--db", db)
    assert missing.returncode == 1 and missing.stderr.strip().splitlines() == [
        "error: no run with id 'zzzzzzzz' (see `agentmem runs`)"]

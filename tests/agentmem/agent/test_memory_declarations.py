"""A memory policy declares what it is on its class, and every job asks the declaration: the registry's call
kinds, the oracle (``oracle`` and ``oracle_text``), ReOPD replay (``replayable``), the log-probs passed to
``consume`` (``wants_logprobs``) and the options (``Options``, one pydantic model each)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from agentmem.agent.memory import Call, MemoryPolicyBase, consume
from agentmem.agent.oracle import OracleWriter
from agentmem.agent.prompts import EMPTY_MEMORY, Prompt
from agentmem.agent.registry import (
    call_kinds,
    memory_policy,
    memory_policy_names,
    policy_class,
    register_memory_policy,
    replayable_policies,
)
from agentmem.config import AgentConfig, PolicySource, RolloutConfig
from agentmem.errors import AgentError, ConfigError
from agentmem.jobs.replay import teacher_calls
from agentmem.jobs.rollout import rollout_setup
from agentmem.records import Fact, Run, RunKind, Task
from agentmem.testing.tiny_models import tiny_llama, tiny_tokenizer
from store import repository as repo

TASK = Task(task_id="t", env="synthetic", question="Where does Bob live?", chunks=["Alice works.", "Bob: Oslo."],
            answers=["Oslo"], facts=[Fact(text="Bob lives in Oslo.", chunk=1)])


def test_the_built_in_declarations():
    declared = {n: (policy_class(n).kinds, policy_class(n).wants_logprobs, policy_class(n).oracle,
                    policy_class(n).replayable, list(policy_class(n).Options.model_fields))
                for n in ("overwrite", "events", "log", "routed", "teacher")}
    assert declared == {
        "overwrite": (("memory_update", "answer"), False, True, True, []),
        "events": (("event_record", "event_view", "answer"), False, True, False,
                   ["recorder", "view_tokens", "record_tokens"]),
        "log": (("log_note", "log_search", "answer"), False, True, False,
                ["condition", "window", "searches", "read_tokens", "query_tokens"]),
        "routed": (("route", "memory_update", "answer"), True, True, False, ["threshold", "k"]),
        "teacher": (("memory_update", "answer"), False, True, False, ["memories", "k"]),
    }
    assert call_kinds()[:7] == ["memory_update", "answer", "event_record", "event_view", "log_note", "log_search",
                                "route"]
    assert call_kinds()[-2:] == ["chat", "completion"]  # agentmem serve's
    assert replayable_policies() == ["overwrite"]


@dataclass(frozen=True)
class Count:
    n: int = 0


class Counter(MemoryPolicyBase[Count]):
    """Two ``tick`` calls then the answer; it wants log-probs and declares no oracle."""

    name = "counter"
    kinds = ("tick", "answer")
    wants_logprobs = True

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @classmethod
    def build(cls, tokenizer, config, options):
        return cls(tokenizer)

    def initial_state(self, task):
        return Count()

    def next_call(self, state, task):
        return Call("tick" if state.n < 2 else "answer", Prompt([1], "p"), 4, final=state.n >= 2)

    def consume(self, state, call, output_ids, output_text, logprobs=None):
        return Count(state.n + (1 if logprobs is None else 10))

    def memory_text(self, state):
        return str(state.n)

    def resume(self, task, stored):
        raise NotImplementedError


@pytest.fixture(autouse=True)
def counter_registered():
    register_memory_policy(Counter)


def test_a_registered_policy_adds_its_kinds_and_its_declarations_are_asked():
    tok = tiny_tokenizer()
    assert "counter" in memory_policy_names() and "tick" in call_kinds()
    policy = memory_policy(tok, AgentConfig(memory_policy="counter"))
    call = policy.next_call(policy.initial_state(TASK), TASK)
    assert consume(policy, Count(), call, [5], "x", [-0.1]) == Count(10)  # wants_logprobs: passed
    assert consume(policy, Count(), call, [5], "x", None) == Count(1)
    with pytest.raises(AgentError, match="memory policy 'counter': bad --memory-option \\(k: unknown option\\); known: "):
        memory_policy(tok, AgentConfig(memory_policy="counter", memory_options={"k": 1}))
    with pytest.raises(AgentError, match="the oracle writes the calls of memory policies that declare"):
        OracleWriter(tok, policy)


def test_the_oracle_asks_the_policy(sqlite_store, tmp_path):
    tok = tiny_tokenizer()
    tok.save_pretrained(tmp_path / "tok")
    tiny_llama().config.save_pretrained(tmp_path / "tok")  # a model folder without weights
    config = RolloutConfig(model=str(tmp_path / "tok"), policy=PolicySource.oracle, episodes=1,
                           agent=AgentConfig(memory_policy="counter"))
    with pytest.raises(ConfigError, match="policy 'oracle' writes the calls of memory policies that declare "
                                          "``oracle`` \\(their oracle_text\\), not those of 'counter'"):
        rollout_setup(sqlite_store, config)
    update = Call("memory_update", Prompt([1], "p"), 64, chunk_index=1)
    for name, options in (("overwrite", {}), ("routed", {})):
        policy = memory_policy(tok, AgentConfig(memory_policy=name, memory_options=options))
        oracle = OracleWriter(tok).for_policy(policy)
        assert oracle.text(update, TASK) == "Bob lives in Oslo."  # overwrite's oracle_text, routed delegates
        assert oracle.text(Call("memory_update", Prompt([1], "p"), 64, chunk_index=0), TASK) == EMPTY_MEMORY
        assert oracle.text(Call("answer", Prompt([1], "p"), 8, final=True), TASK) == "Oslo"
    with pytest.raises(AgentError, match="writes only the final answer"):
        OracleWriter(tok).text(update, TASK)


def test_replay_asks_the_policy(sqlite_store):
    ids = {}
    with sqlite_store.session() as s:
        for name in ("log", "overwrite", "counter"):
            run = Run(kind=RunKind.rollout, config=RolloutConfig(agent=AgentConfig(memory_policy=name)).model_dump(
                mode="json"), status="finished")
            repo.insert_run(s, run)
            ids[name] = run.id
        s.commit()
    for name in ("log", "counter"):
        with pytest.raises(ConfigError, match=f"run {ids[name]} used memory policy '{name}', which does not declare "
                                              "``replayable``: replay branches from the calls of overwrite"):
            teacher_calls(sqlite_store, ids[name])
    with pytest.raises(ConfigError, match=f"run {ids['overwrite']} has no stored calls to branch from"):
        teacher_calls(sqlite_store, ids["overwrite"])  # past the declaration check

"""The overwrite policy's two prompt layouts: chunk-first (the default: siblings of a task share everything
before their memory) and memory-first (MemAgent's order, and what runs stored before the option used)."""

from __future__ import annotations

from agentmem.agent.overwrite import OverwriteState
from agentmem.agent.registry import memory_policy
from agentmem.config import AgentConfig, PromptLayout, RolloutConfig
from agentmem.records import Task
from agentmem.testing.tiny_models import tiny_tokenizer

SYSTEM_TURN = ("<|im_start|>system\nYou are a careful reading agent. You read a long text in sections and keep a "
               "short memory.<|im_end|>\n")
TASK = Task(task_id="t", env="synthetic", question="Where does Bob live?",
            chunks=["Bob moved to Oslo in 2019.", "Alice works in Berlin."], answers=["Oslo"])


def test_chunk_first_prompt_is_pinned():
    tok = tiny_tokenizer()
    policy = memory_policy(tok, AgentConfig(memory_tokens=16))
    assert policy.layout is PromptLayout.chunk_first
    call = policy.next_call(OverwriteState("Bob lives in Oslo.", 1), TASK)
    assert call.prompt.text == (
        SYSTEM_TURN + "<|im_start|>user\nQuestion: Where does Bob live?\n\nNew section of the text:\nAlice works "
        "in Berlin.\n\nRewrite your memory. Keep every fact that may help answer the question, add the relevant "
        "facts from the new section, and drop the rest. Write only the new memory.\n\nYour memory so far:\n"
        "Bob lives in Oslo.<|im_end|>\n<|im_start|>assistant\n")
    assert call.prompt.ids == tok(call.prompt.text, add_special_tokens=False)["input_ids"]


def test_siblings_share_everything_before_their_memory():
    tok = tiny_tokenizer()
    prompts = {}
    for layout in PromptLayout:
        policy = memory_policy(tok, AgentConfig(memory_tokens=16, prompt_layout=layout))
        a = policy.next_call(OverwriteState("Bob lives in Oslo.", 1), TASK).prompt.ids
        b = policy.next_call(OverwriteState("Alice works in Lyon and Bob in Oslo.", 1), TASK).prompt.ids
        shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
        prompts[layout] = (shared, len(a))
    chunk_shared, chunk_len = prompts[PromptLayout.chunk_first]
    memory_shared, _ = prompts[PromptLayout.memory_first]
    assert chunk_shared > memory_shared
    # chunk-first: only the memory and the closing chat tokens differ
    tail = len(tok("Bob lives in Oslo.<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"])
    assert chunk_len - chunk_shared <= tail


def test_a_stored_config_without_the_field_reads_as_memory_first():
    stored = RolloutConfig().model_dump(mode="json")
    del stored["agent"]["prompt_layout"]
    assert RolloutConfig.stored(stored).agent.prompt_layout is PromptLayout.memory_first
    assert RolloutConfig().agent.prompt_layout is PromptLayout.chunk_first
    fresh = RolloutConfig(agent=AgentConfig(prompt_layout="memory-first")).model_dump(mode="json")
    assert RolloutConfig.stored(fresh).agent.prompt_layout is PromptLayout.memory_first

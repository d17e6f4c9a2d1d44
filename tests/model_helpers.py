"""Helpers shared by tests that run a model or build model inputs: chat prompts, log-probs computed
afresh to compare a backend's or a scorer's with, packed sequences of known shapes, and a backend that
records what it was given."""

from __future__ import annotations

import numpy as np
import torch

from agentmem.backends.transformers_backend import TransformersBackend
from agentmem.replay import Sequence

SYSTEM = "Update the memory with facts from the chunk that help answer the question."
MEMORIES = ["none", "Bob lives in Oslo.", "Alice was born in Lyon", "Paris"]


def chat(tok, question: str, chunk: str, memory: str) -> list[int]:
    """The ids of a memory-update chat prompt, rendered by ``tok``'s chat template."""
    content = f"Question: {question}\nChunk: {chunk}\nMemory: {memory}"
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]
    return tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)


def sample_prompts(tok) -> list[list[int]]:
    """Four siblings sharing a long prefix (the shared-prefix prefill) and three unrelated prompts:
    [Hi, siblings x 4, "The capital of France is Paris.", Update]."""
    siblings = [chat(tok, "where does Bob live?", "Alice was born in Lyon and works in Berlin.", m) for m in MEMORIES]
    return [tok.encode("Hi"), *siblings, tok.encode("The capital of France is Paris."), tok.encode("Update")]


def fresh_logprobs(model, prompt, output, temperature):
    """The log-probs of ``output`` after ``prompt`` from one plain forward pass (no cache), at ``temperature``."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output]), use_cache=False).logits[0, len(prompt) - 1 : -1]
    logits = logits.float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logp.gather(-1, torch.tensor(output)[:, None]).squeeze(-1)


def direct_logprobs(model, context_ids: np.ndarray, output_ids: np.ndarray) -> np.ndarray:
    """The log-probs of ``output_ids`` after ``context_ids`` from one plain forward pass, as numpy."""
    ids = torch.tensor(np.concatenate([context_ids, output_ids]), dtype=torch.long)[None]
    with torch.no_grad():
        logp = torch.log_softmax(model(ids, use_cache=False).logits[0].float(), -1)
    c = len(context_ids)
    return logp[c - 1 : -1].gather(-1, torch.tensor(output_ids, dtype=torch.long)[:, None])[:, 0].numpy()


class RecordingBackend(TransformersBackend):
    """The real backend, remembering exactly the prompts it consumed."""

    def generate(self, prompts, params):
        self.seen = getattr(self, "seen", []) + [list(p) for p in prompts]
        return super().generate(prompts, params)


# (prompt, output) lengths; rows of 40 leave padding in the last row
SHAPES = [(12, 5), (7, 3), (20, 6), (4, 9), (9, 2), (15, 4), (3, 1), (10, 8)]


def make_sequences(seed: int = 0, vocab: int = 300) -> list[Sequence]:
    """Eight calls of the ``SHAPES`` lengths with random ids, their action masks set."""
    rng = np.random.default_rng(seed)
    out = []
    for i, (p, o) in enumerate(SHAPES):
        ids = rng.integers(3, vocab, p + o).astype(np.int32)
        mask = np.zeros(p + o, bool)
        mask[p - 1 : p + o - 1] = True
        out.append(Sequence(f"inv{i}", ids, np.arange(p + o, dtype=np.int32), mask, ids[p:].copy(),
                            np.zeros(o, np.float32)))
    return out


def seq(id_: str, ids, prompt: int, group=None) -> Sequence:
    """A call of ``ids`` whose first ``prompt`` ids are the prompt, in ``group``."""
    ids = np.asarray(ids, np.int32)
    n = len(ids)
    mask = np.zeros(n, bool)
    mask[prompt - 1 : n - 1] = True
    return Sequence(id_, ids, np.arange(n, dtype=np.int32), mask, ids[prompt:].copy(),
                    -np.arange(1, n - prompt + 1, dtype=np.float32), group=group)


def group_sequences(seed: int = 0, vocab: int = 300) -> list[Sequence]:
    """Two groups of siblings (a long shared prompt head, own memory and actions), a call with no group,
    and a group whose members share nothing."""
    rng = np.random.default_rng(seed)

    def rand(n):
        return rng.integers(3, vocab, n)

    head = rand(30)
    out = [seq(f"g{i}", np.concatenate([head, rand(6 + i), rand(3 + i)]), 36 + i, group="g") for i in range(4)]
    out.append(seq("solo", rand(15), 11))
    head2 = rand(9)
    out += [seq(f"h{i}", np.concatenate([head2, rand(5), rand(2 + i)]), 14, group="h") for i in range(3)]
    out += [seq(f"x{i}", np.concatenate([[3 + i], rand(8)]), 6, group="x") for i in range(2)]  # first ids differ
    return out

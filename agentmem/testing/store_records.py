"""Builders of realistic records for store tests and benchmarks."""

from __future__ import annotations

import numpy as np

from agentmem.records import Episode, Invocation, InvocationKind, Run, RunKind


def make_run(**kw) -> Run:
    return Run(kind=RunKind.rollout, config={"env": "synthetic", "seed": 0}, **kw)


def make_episode(run: Run, task: int = 0, sample: int = 0) -> Episode:
    return Episode(run_id=run.id, env="synthetic", task_id=f"task-{task}", sample_index=sample,
                   question=f"Where does person {task} live?", gold_answers=["Oslo", "oslo city"],
                   evidence=["Person lives in Oslo."], n_chunks=3)


def make_invocation(episode: Episode, step: int, rng: np.random.Generator, prompt_len: int = 600,
                    output_len: int = 200, kind: InvocationKind = InvocationKind.memory_update) -> Invocation:
    return Invocation(
        episode_id=episode.id, step=step, kind=kind,
        prompt_ids=rng.integers(0, 49152, prompt_len, dtype=np.int32),
        output_ids=rng.integers(0, 49152, output_len, dtype=np.int32),
        output_logprobs=-rng.exponential(1.0, output_len).astype(np.float32),
        prompt_text="question + memory + chunk " * 20, output_text="new memory " * 20,
        memory_before="old memory", memory_after="new memory " * 20, chunk_text="chunk text " * 30,
        chunk_index=step, latency_s=0.5,
    )

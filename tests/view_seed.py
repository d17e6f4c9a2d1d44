"""A small store for the viewer's tests (and the viewer benchmark's shapes): a rollout run whose calls have
known memories and teacher scores under two contexts, a distill run with train steps and a checkpoint, and
an eval of that checkpoint. ``seed_view_store`` returns what it wrote, so tests compare pages with it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from agentmem.records import (
    Checkpoint,
    Episode,
    EpisodeStatus,
    EvalResult,
    Invocation,
    InvocationKind,
    Run,
    RunKind,
    TeacherContext,
    TeacherScore,
    TrainStep,
)
from store import repository as repo

TEACHER = "/models/teacher"
MEMORIES = [
    ("", "Bob lives in Oslo."),
    ("Bob lives in Oslo.", "Bob lives in Bergen now. Alice works in Oslo."),
    ("Bob lives in Bergen now. Alice works in Oslo.", "Bob lives in Bergen now. Alice works in Oslo."),
]


@dataclass
class Seeded:
    rollout: Run
    distill: Run
    eval_run: Run
    checkpoint: Checkpoint
    trained: Checkpoint
    episodes: list[Episode]
    calls: dict[str, list[Invocation]]  # episode id -> its calls in order
    scores: dict[tuple[str, TeacherContext], TeacherScore] = field(default_factory=dict)  # (invocation, context)
    steps: list[TrainStep] = field(default_factory=list)


def _call(ep: Episode, step: int, before: str, after: str, encode, rng, policy: str) -> Invocation:
    final = step == len(MEMORIES)
    chunk = None if final else f"Chunk {step}: {after} The weather was fine."
    output = "Bergen" if final else after
    prompt = f"Question: {ep.question}\n" + ("" if final else f"Chunk:\n{chunk}\n") + f"Memory:\n{before}\nUpdate:"
    out_ids = encode(output)
    return Invocation(episode_id=ep.id, step=step, kind=InvocationKind.answer if final else InvocationKind.memory_update,
                      policy_version=policy, prompt_ids=encode(prompt), output_ids=out_ids,
                      output_logprobs=-rng.exponential(0.5, len(out_ids)).astype(np.float32), prompt_text=prompt,
                      output_text=output, memory_before=before, memory_after=before if final else after,
                      chunk_text=chunk, chunk_index=None if final else step, latency_s=0.25)


def seed_view_store(store, tokenizer_folder: str, encode) -> Seeded:
    """Write the seed; ``encode(text) -> ids`` is the tokenizer of ``tokenizer_folder`` (the policy's folder)."""
    rng = np.random.default_rng(0)
    ckpt = Checkpoint(path=tokenizer_folder, base_model="tiny")
    rollout = Run(kind=RunKind.rollout, status="finished", config={"env": "synthetic", "model": tokenizer_folder})
    distill = Run(kind=RunKind.distill, status="finished", config={"student": ckpt.id, "out": "/tmp/ck"})
    eval_run = Run(kind=RunKind.eval, status="finished", config={"env": "synthetic", "model": "trained"})
    trained = Checkpoint(run_id=distill.id, parent_id=ckpt.id, step=3, path="/tmp/ck/step-3", base_model="tiny")
    episodes = []
    for task, (f1, status) in enumerate([(1.0, EpisodeStatus.answered), (0.5, EpisodeStatus.answered),
                                         (None, EpisodeStatus.failed)]):
        episodes.append(Episode(
            run_id=rollout.id, env="synthetic", task_id=f"task-{task}", question=f"Where does Bob live ({task})?",
            gold_answers=["Bergen"], prediction=None if f1 is None else "Bergen", f1=f1, em=f1, sub_em=f1,
            reward=f1, status=status, stop_reason="answered" if f1 is not None else "error",
            error="BackendError: out of memory" if f1 is None else None, n_chunks=3))
    calls = {ep.id: [_call(ep, i, b, a, encode, rng, ckpt.id) for i, (b, a) in enumerate(MEMORIES + [MEMORIES[-1]])]
             for ep in episodes[:2]}
    seeded = Seeded(rollout, distill, eval_run, ckpt, trained, episodes, calls)
    for ep_calls in calls.values():
        for inv in ep_calls:
            n = inv.output_tokens
            for context in (TeacherContext.aligned, TeacherContext.persistent):
                if context is TeacherContext.persistent and inv.step == 0:
                    continue  # one call scored under one context only
                seeded.scores[inv.id, context] = TeacherScore(
                    invocation_id=inv.id, teacher=TEACHER, context=context, run_id=rollout.id,
                    token_logprobs=-rng.exponential(1.0, n).astype(np.float32),
                    reverse_kl=rng.exponential(0.3, n).astype(np.float32),
                    entropy=rng.exponential(1.0, n).astype(np.float32))
    for step in (1, 2, 3):
        seeded.steps.append(TrainStep(run_id=distill.id, step=step, loss=2.0 / step, tokens=1000 * step, lr=1e-5,
                                      seconds=2.0, metrics={"kd_loss": 1.5 / step, "rl_loss": -0.1 * step,
                                                            "clip_fraction": 0.1 * step, "approx_kl": 0.01 * step,
                                                            "ce_loss": 0.5}))
    evals = [EvalResult(run_id=eval_run.id, checkpoint_id=c.id, model=c.path, env="synthetic", step=c.step,
                        n_episodes=16, f1=f1, em=f1, sub_em=f1, f1_ci=(f1 - 0.1, f1 + 0.1), metrics={"base_model": "tiny"})
             for c, f1 in ((ckpt, 0.3), (trained, 0.5))]
    with store.session() as s:
        for run in (rollout, distill, eval_run):
            repo.insert_run(s, run)
        repo.insert_checkpoint(s, ckpt)
        repo.insert_checkpoint(s, trained)
        repo.insert_episodes(s, episodes)
        repo.insert_invocations(s, [i for c in calls.values() for i in c])
        repo.insert_teacher_scores(s, seeded.scores.values())
        for step in seeded.steps:
            repo.insert_train_step(s, step)
        for result in evals:
            repo.insert_eval_result(s, result)
        s.commit()
    return seeded

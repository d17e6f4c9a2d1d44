"""A job's small configs and stored runs, shared by the tests of the jobs that read them: a scripted
rollout for SFT and a tiny-model rollout for distill (``conftest.py`` gives them as the ``stored`` and
``rolled`` fixtures), and the configs of the distill, SFT, train and eval jobs on the tiny models."""

from __future__ import annotations

from helpers import SYNTH, register_policy

from agentmem.backends.scripted import ScriptedBackend
from agentmem.backends.transformers_backend import TransformersBackend
from agentmem.config import (
    AgentConfig,
    DistillConfig,
    EvalConfig,
    Oversize,
    RolloutConfig,
    SftConfig,
    TrainConfig,
)
from agentmem.jobs.rollout import run_rollout
from agentmem.records import Episode, Invocation, TeacherContext
from agentmem.testing.configs import merged
from agentmem.testing.tiny_models import save_tiny, tiny_llama, tiny_tokenizer
from agentmem.training.trainer import Models
from store import repository as repo


def sft_run(sqlite_store, tmp_path):
    """(store, run id, tiny student folder) of a scripted rollout (4 episodes, F1 0, 0.8, 0, 0.8): the
    ``stored`` fixture."""
    tok = tiny_tokenizer()
    config = RolloutConfig(model="tiny", episodes=2, group_size=2, chunk_tokens=48, env_knobs=SYNTH,
                           agent=AgentConfig(memory_tokens=8, answer_max_new_tokens=4))
    policy = register_policy(sqlite_store, "/models/tiny", "tiny")
    result = run_rollout(sqlite_store, config, backend=ScriptedBackend(tok, lambda p: "Bob lives in Oslo."),
                         policy=policy)
    with sqlite_store.session() as s:
        for i, ep in enumerate(repo.list_episodes(s, result.run_id)):
            repo.update_episode(s, ep.model_copy(update={"f1": 0.8 * (i % 2), "reward": 0.8 * (i % 2)}))
        s.commit()
    return sqlite_store, result.run_id, save_tiny(tmp_path / "tiny")


def distill_run(sqlite_store):
    """(store, run id, policy) of a sampled tiny-llama rollout whose group has rewards 0 and 1: the ``rolled``
    fixture."""
    tok = tiny_tokenizer()
    config = RolloutConfig(model="tiny", episodes=2, group_size=2, chunk_tokens=48, env_knobs=SYNTH,
                           agent=AgentConfig(memory_tokens=8, answer_max_new_tokens=4, temperature=1.0, seed=7))
    policy = register_policy(sqlite_store, "/models/tiny", "tiny")
    result = run_rollout(sqlite_store, config, backend=TransformersBackend.from_model(tiny_llama(seed=3), tok), policy=policy)
    # give the group different rewards so the RL term has a signal
    with sqlite_store.session() as s:
        for i, ep in enumerate(repo.list_episodes(s, result.run_id)):
            repo.update_episode(s, ep.model_copy(update={"reward": float(i % 2), "f1": float(i % 2)}))
        s.commit()
    return sqlite_store, result.run_id, policy


def rollout_config(**kw) -> RolloutConfig:
    """The sampled tiny rollout of ``rolled``'s shape, ``kw`` on top (a context, a policy)."""
    return RolloutConfig(model="tiny", episodes=2, group_size=2, chunk_tokens=48, env_knobs=SYNTH,
                         agent=AgentConfig(memory_tokens=8, answer_max_new_tokens=4, temperature=1.0, seed=7), **kw)


def episodes_and_calls(store, run_id) -> tuple[dict[str, Episode], list[Invocation]]:
    """A run's episodes by id and its invocations, as stored."""
    with store.session() as s:
        return ({e.id: e for e in repo.list_episodes(s, run_id)}, list(repo.stream_invocations(s, run_ids=[run_id])))


def models(policy, student_seed=0) -> Models:
    """A tiny-llama student (seeded ``student_seed``) and a frozen tiny-llama teacher, sharing a tokenizer."""
    tok = tiny_tokenizer()
    student = tiny_llama(seed=student_seed).train()
    return Models(student, tok, policy, tiny_llama(seed=1).requires_grad_(False), tok)


def distill_config(run_id, tmp_path, **kw) -> DistillConfig:
    """Two steps of privileged distillation on ``run_id``, ``kw`` merged on top."""
    base = dict(run_ids=[run_id], out=str(tmp_path), teacher=dict(context=TeacherContext.privileged),
                optim=dict(steps=2, lr=1e-3), batch=dict(invocations_per_step=4, row_tokens=4096))
    return DistillConfig(**merged(base, kw))


def sft_config(run_id, folder, tmp_path, **kw) -> SftConfig:
    """A constant rate with no warmup, and the optimizer state kept at the end: resumed and carried runs
    continue it (the defaults' warmup, cosine and dropped state are tested on their own)."""
    base = dict(run_ids=[run_id], student=folder, optim=dict(steps=2, lr=1e-3, warmup_steps=0, schedule="constant"),
                batch=dict(invocations_per_step=64), keep_optimizer=True, out=str(tmp_path / "ckpt"))
    return SftConfig(**merged(base, kw))


def tiny_train(folder: str, tmp_path, **distill) -> TrainConfig:
    """Two rounds of rollout and privileged distillation with ``folder`` as student and teacher."""
    return TrainConfig(
        rounds=2,
        rollout=RolloutConfig(env_knobs=SYNTH, episodes=2, group_size=2, chunk_tokens=48,
                              agent=AgentConfig(memory_tokens=8, answer_max_new_tokens=4, max_batch=4)),
        distill=DistillConfig(**merged(dict(student=folder, out=str(tmp_path / "ckpt"),
                                            teacher=dict(model=folder, context=TeacherContext.privileged),
                                            optim=dict(steps=1, lr=1e-3),
                                            batch=dict(invocations_per_step=4, oversize=Oversize.skip)), distill)),
        # the tiny random teacher writes noise into an 8-token memory; the forgetting check has its own test
        # (test_recipe: a teacher that writes `(empty)` after evidence is refused)
        max_teacher_forgot=1.0,
    )


def eval_config(answer_max_new_tokens: int = 32, **kw) -> EvalConfig:
    """A greedy eval of four synthetic tasks on the tiny model."""
    agent = AgentConfig(memory_tokens=8, answer_max_new_tokens=answer_max_new_tokens, max_batch=4, temperature=0.0,
                        seed=1000)
    fields = {"model": "tiny", "episodes": 4, "chunk_tokens": 48, "env_knobs": SYNTH, "agent": agent}
    return EvalConfig(**{**fields, **kw})

"""The router benchmark (``bench/router.py``): its threshold curve, combined from a full-pass arm and a
threshold-0 arm, equals routed rollouts at each threshold, and ``best`` picks the threshold that saves the most
time within the F1 tolerance."""

from __future__ import annotations

import math

import pytest
from helpers import LogprobBackend, tiny_env

import bench.router as bench_router
from agentmem.config import AgentConfig
from agentmem.testing.tiny_models import tiny_tokenizer


def test_curve_equals_routed_rollouts_at_each_threshold():
    """``bench.router`` combines the full-pass arm and the threshold-0 arm per task; under a deterministic
    backend that is exactly what a routed rollout at threshold t scores and which calls it makes."""
    tok = tiny_tokenizer()
    env = tiny_env(tok)
    tasks = env.tasks(3)
    probs = {t.question: p for t, p in zip(tasks, (0.9, 0.5, 0.2), strict=True)}
    answers = {t.question: t.answers[0] for t in tasks}

    def respond(prompt):  # right from the passages for task 0 only, right from memory for tasks 1 and 2
        text = tok.decode(prompt)
        q = next(q for q in answers if q in text)
        if "Reply yes or no." in text:
            return "yes"
        if "Answer the question from these passages" in text:
            return answers[q] if q == tasks[0].question else "wrong"
        return answers[q] if "Answer the question from your memory" in text and q != tasks[0].question else "x"

    def make():
        return LogprobBackend(tok, respond, lambda text: math.log(next(p for q, p in probs.items() if q in text)))

    base = dict(memory_tokens=16, answer_max_new_tokens=16, temperature=0.0, max_batch=1, seed=1)
    full = bench_router.run_arm(make(), AgentConfig(**base), env, tasks)
    router = bench_router.run_arm(make(), AgentConfig(memory_policy="routed", memory_options={"threshold": 0.0, "k": 2},
                                               **base), env, tasks)
    rows = bench_router.curve(tasks, full, router, [0.0, 0.4, 0.6, 1.01])
    for t, f1, _, now in rows:
        eps, calls, _ = bench_router.run_arm(make(), AgentConfig(memory_policy="routed",
                                                          memory_options={"threshold": t, "k": 2}, **base), env, tasks)
        assert f1 == pytest.approx(sum(e.f1 for e in eps.values()) / 3)
        assert now == pytest.approx(sum(len(c) == 2 for c in calls.values()) / 3)
    assert [round(f1, 3) for _, f1, _, _ in rows] == [0.333, 0.667, 1.0, 0.667]
    made_up = [(0.0, 0.3, 1.0, 1.0), (0.4, 0.66, 4.0, 0.67), (0.6, 1.0, 6.0, 0.33), (1.01, 0.667, 10.5, 0.0)]
    assert bench_router.best(made_up, 0.667, 10.0, 0.02)[0] == 0.4  # the most time saved with F1 >= 0.647
    assert bench_router.best(made_up, 1.0, 10.0, 0.0)[0] == 0.6

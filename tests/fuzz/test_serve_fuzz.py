"""`agentmem serve` under property-based requests (Hypothesis), built from its own `/openapi.json`: every route
(chat, completions, Responses, models, rewards, privileged contexts, episode traces, a run's episodes, health,
unknown routes, raw bodies), directly and through a gateway, on SQLite and Postgres. The properties
(`agentmem.testing.fuzz`): no 5xx, every 400 and 413 names its field, an answered call is stored exactly once and
a refused one not at all, every stored row is whole, and `/health` answers within a second throughout.

A fixed seed and a bounded number of examples keep CI's run the same every time; `python -m bench.fuzz` runs the
same properties over tens of thousands of requests."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from agentmem.testing.fuzz import WEIGHTS, Health, half_written, model_of, routes, served
from agentmem.testing.tiny_models import tiny_tokenizer

PER_WEIGHT = 4  # examples per route and unit of its weight (agentmem.testing.fuzz.WEIGHTS): 224 requests in all


def fuzz(store, tmp_path, per_weight: int, seed_value: int) -> None:
    """Each route of the document (and unknown routes, raw bodies) in turn, ``per_weight`` times its weight
    examples, a quarter of them through the gateway."""
    with served(store, tmp_path) as targets, Health(targets[0].root) as health:
        document = httpx.get(f"{targets[0].root}/openapi.json").json()
        found = routes(document, model_of(targets), len(tiny_tokenizer()))
        for label, strategy in found.items():

            @seed(seed_value)
            @settings(max_examples=per_weight * WEIGHTS.get(label, 1), database=None, deadline=None,
                      suppress_health_check=list(HealthCheck))
            @given(st.integers(0, 3), strategy)
            def send(pick: int, request) -> None:
                outcome = targets[pick == 0].checker.send(request)
                assert not outcome.violations, (outcome.violations, request)

            send()
    assert half_written(store, [t.run_id for t in targets]) == []
    answered = {route for t in targets for route, status in t.checker.counts if status == "2xx"}
    for route in ("/chat/completions", "/completions", "/responses"):  # each generated and stored too
        assert {f"POST /v1{route}", f"POST /episodes/{{episode}}/v1{route}"} & answered, route
    assert all(t.checker.answered for t in targets)
    assert health.failures == 0 and len(health.latencies_ms) > 5 and max(health.latencies_ms) < 1000


def test_every_route_keeps_its_properties(store, tmp_path):
    fuzz(store, tmp_path, PER_WEIGHT, seed_value=0)


@pytest.mark.slow
def test_every_route_keeps_its_properties_longer(sqlite_store, tmp_path):
    fuzz(sqlite_store, tmp_path, 10 * PER_WEIGHT, seed_value=1)

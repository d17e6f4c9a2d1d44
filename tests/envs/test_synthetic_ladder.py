"""The synthetic task ladder (``level`` 0..4) and the CLI's ``--level``."""

from __future__ import annotations

import pytest
from fixtures_envs import words

from agentmem.errors import ConfigError
from cli.job_specs import with_level
from envs import EnvError, load_env
from envs.synthetic import LEVELS


def ladder(level: int | None = None, chunk_tokens: int = 32, **knobs):
    return load_env("synthetic", count_tokens=words, chunk_tokens=chunk_tokens, seed=3, level=level, **knobs)


def test_level_0_is_one_fact_alone_in_one_chunk():
    for task in ladder(0).tasks(20):
        assert len(task.chunks) == 1
        assert task.chunks == task.evidence  # the fact alone: no filler, no distractor
        assert [(f.text, f.chunk) for f in task.facts] == [(task.evidence[0], 0)]
        assert task.answers[0] in task.evidence[0]


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_each_level_sets_its_knobs(level):
    spec = LEVELS[level]
    assert ladder(level).tasks(5) == ladder(None, context_tokens=spec.context_tokens, hops=spec.hops,
                                            distractors=spec.distractors).tasks(5)
    for task in ladder(level).tasks(5):
        assert task.category == f"{spec.hops}-hop"
        assert len(task.facts) == spec.hops
        assert [f.chunk for f in task.facts] == sorted(f.chunk for f in task.facts)
        for fact in task.facts:
            assert fact.text in task.chunks[fact.chunk]


def test_levels_grow_harder():
    chunks = [sum(len(t.chunks) for t in ladder(lv).tasks(10)) / 10 for lv in sorted(LEVELS)]
    assert chunks == sorted(chunks) and chunks[0] == 1 and chunks[-1] > 5
    assert [LEVELS[lv].hops for lv in sorted(LEVELS)] == [1, 1, 1, 2, 3]


def test_explicit_knob_wins_over_level():
    tasks = ladder(2, distractors=0).tasks(5)
    assert tasks == ladder(None, context_tokens=LEVELS[2].context_tokens, hops=1, distractors=0).tasks(5)


def test_default_without_level_is_unchanged():
    assert ladder(None).tasks(3) == ladder(None, context_tokens=1024, hops=2, distractors=4).tasks(3)


@pytest.mark.parametrize("bad", [5, -1, True, "2"])
def test_bad_level(bad):
    with pytest.raises(EnvError, match="knob level must be one of 0, 1, 2, 3, 4"):
        ladder(bad)


def test_cli_level_becomes_a_knob():
    assert with_level("synthetic", {"hops": 2}, 3) == {"level": 3, "hops": 2}
    assert with_level("synthetic", {"level": 3}, 3) == {"level": 3}
    assert with_level("hotpotqa", {"docs": 2}, None) == {"docs": 2}
    with pytest.raises(ConfigError, match="--level is the synthetic task ladder; environment 'hotpotqa'"):
        with_level("hotpotqa", {}, 1)
    with pytest.raises(ConfigError, match="--level 1 and --knob level=2 disagree"):
        with_level("synthetic", {"level": 2}, 1)

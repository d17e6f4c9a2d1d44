"""``kill -9`` of the score, distill and sft jobs mid-run (real processes, tiny models), then resume: nothing
lost, nothing duplicated, and the resumed result equal to an uninterrupted run (``bench/faults.py`` does the
same at random moments, 21 times; see docs/reliability.md). Also: a SQLite file that hits its size limit
mid-rollout gives one error line, and the store stays readable and resumable."""

from __future__ import annotations

import random

import pytest

from agentmem.testing import faults


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return faults.make_world(tmp_path_factory.mktemp("faults"))


@pytest.mark.parametrize(("job", "after_rows"), [("score", 2), ("distill", 2), ("sft", 3)])
def test_kill_9_mid_job_then_resume_equals_uninterrupted(world, job, after_rows):
    ref, seconds = faults.reference(world, job)
    assert len(ref.rows) == (6 if job != "score" else len(ref.rows)) and ref.rows
    tally = faults.Tally()
    faults.kill_and_resume(world, job, ref, seconds, random.Random(0), 0, tally, after_rows=after_rows)
    assert tally.kills == 1, tally.notes  # killed mid-run, not after it finished
    assert (tally.lost, tally.duplicates, tally.mixed) == (0, 0, 0), tally.notes
    assert tally.equal == tally.resumed == 1, tally.notes


def test_disk_full_is_one_line_and_the_store_stays_readable(world):
    line = faults.disk_full(world)
    assert line.startswith("error: cannot write database") and "the disk is full or the file hit its size limit" in line

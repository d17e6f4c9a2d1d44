"""cli/agent_progress.py: a model-calling job's progress counts calls; on a pipe it is one plain line at most every
5 s and at least every 30 s, whatever the length of a round of calls."""

from __future__ import annotations

from dataclasses import dataclass

from cli.agent_progress import MAX_GAP, MIN_GAP, CallProgress, Counts, PipeLines, call_progress, duration


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Round:
    calls: int
    finished: int


def test_durations_read_as_written():
    assert [duration(s) for s in (0.4, 42, 185, 3725)] == ["0 s", "42 s", "3 min 5 s", "1 h 2 min"]


def test_a_line_names_calls_episodes_rate_and_time_left():
    counts = Counts("rollout", calls_total=400, calls=96, episodes_total=80, episodes=3, started=10.0)
    assert counts.line(56.0) == "rollout: 96/400 calls (24%), 3/80 episodes, 2.1 calls/s, about 2 min 26 s left, 46 s in"
    assert Counts("eval", 40, episodes_total=8).line(5.0) == "eval: 0/40 calls (0%), 0/8 episodes, loading"
    assert Counts("eval", 40, started=5.0).line(9.0) == "eval: 0/40 calls (0%), first calls running, 4 s in"
    resumed = Counts("score", calls_total=100, calls=60, started=0.0, done_at_start=50)
    assert resumed.line(5.0) == "score: 60/100 calls (60%), 2.0 calls/s, about 20 s left, 5 s in"


def simulate(round_seconds: float, rounds: int) -> list[float]:
    """The times of the plain lines of a job whose rounds of 8 calls take ``round_seconds`` each, the timer
    beating every second."""
    clock, times = Clock(), []
    counts = Counts("rollout", calls_total=8 * rounds, episodes_total=8)
    progress = CallProgress(counts, None, PipeLines(counts, lambda line: times.append(clock.now), clock))
    progress.on_start(8, 0)
    counts.started = clock.now
    for _ in range(rounds):
        for _ in range(int(round_seconds)):
            clock.now += 1.0
            progress.heartbeat()
        progress.on_round(Round(8, 0))
    return times


def test_lines_come_at_most_every_5_s_and_at_least_every_30_s():
    for round_seconds in (1, 3, 7, 45, 200):  # fast rounds, slow rounds, a round of minutes on busy cores
        times = simulate(round_seconds, 12)
        gaps = [b - a for a, b in zip([100.0, *times], times, strict=False)]
        assert times and all(MIN_GAP <= g <= MAX_GAP for g in gaps), (round_seconds, gaps)


def test_more_calls_than_planned_raise_the_total():
    counts = Counts("rollout", calls_total=10)
    progress = CallProgress(counts, None, None)
    progress.on_start(2, 0)
    progress.on_round(Round(12, 2))
    assert (counts.calls, counts.calls_total, counts.episodes) == (12, 12, 2)


def test_on_a_pipe_the_job_prints_plain_lines_to_stderr(capsys, monkeypatch):
    clock = Clock()
    monkeypatch.setattr("cli.agent_progress.time.monotonic", clock)
    with call_progress("eval", 16, 4, terminal=False) as progress:
        progress.on_start(4, 0)
        clock.now += 6
        progress.on_round(Round(8, 2))
        clock.now += 1
        progress.on_round(Round(8, 2))  # 1 s after the last line: none
    err = capsys.readouterr().err.splitlines()
    assert err == ["eval: 8/16 calls (50%), 2/4 episodes, 1.3 calls/s, about 6 s left, 6 s in"]

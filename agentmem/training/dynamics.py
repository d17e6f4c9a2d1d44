"""Training dynamics: what each step's sampled calls and advantages say about whether learning is alive
(pure functions over records; the trainer stores them in ``TrainStep.metrics``).

Per step (keys of ``TrainStep.metrics``):
- ``rl_groups``, ``rl_groups_live``: the step's GRPO groups (episodes of one (run, task) with two or more
  samples in the selection) and those with a non-zero advantage; ``rl_live_fraction`` their ratio. A group
  whose samples all scored the same gives the RL term no gradient;
- ``out_len/<kind>``, ``empty/<kind>``: the mean output length (tokens, end-of-sequence included) of the
  step's calls of each kind, and the share of them that are end-of-sequence only;
- ``eos_first/<kind>``: the student's mean probability of end-of-sequence as the first output token of
  those calls (at temperature 1, before the step's update): the stop habit that collapses a student;
- ``kl_teacher``, ``kl_start``: token-weighted mean KL(student || teacher) at the action positions (full
  vocabulary; only with a model or shards teacher), and KL(student || starting student) (with
  ``monitor_start_kl``).

``round_warnings`` turns a round's steps into the warnings ``agentmem train`` and ``bench/learning.py``
print: an RL term with no signal for a whole round, or end-of-sequence-only outputs above a threshold.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from agentmem.records import TrainStep

EMPTY_WARN = 0.2  # share of end-of-sequence-only outputs (or first-token EOS mass) of one kind that warns


def group_liveness(advantage_of_episode: Mapping[str, float], group_of_episode: Mapping[str, tuple],
                   episodes: Iterable[str], sizes: Mapping[tuple, int]) -> tuple[int, int]:
    """(groups, groups with a non-zero advantage) among ``episodes``' groups of two or more samples."""
    groups: dict[tuple, bool] = {}
    for e in episodes:
        g = group_of_episode[e]
        if sizes.get(g, 0) < 2:
            continue
        groups[g] = groups.get(g, False) or abs(advantage_of_episode[e]) > 1e-9
    return len(groups), sum(groups.values())


def output_stats(calls: Sequence[tuple[str, Sequence[int] | np.ndarray]], eos_id: int | None) -> dict[str, float]:
    """``out_len/<kind>`` and ``empty/<kind>`` of (kind, output ids) pairs."""
    per: dict[str, list[tuple[int, bool]]] = defaultdict(list)
    for kind, ids in calls:
        per[kind].append((len(ids), len(ids) == 1 and eos_id is not None and int(ids[0]) == eos_id))
    out: dict[str, float] = {}
    for kind, rows in sorted(per.items()):
        out[f"out_len/{kind}"] = sum(n for n, _ in rows) / len(rows)
        out[f"empty/{kind}"] = sum(e for _, e in rows) / len(rows)
    return out


def finish_sums(metrics: dict[str, float]) -> dict[str, float]:
    """Sums collected over micro-batches and processes (``eos_first_sum/<kind>`` with ``eos_first_n/<kind>``)
    turned into means (``eos_first/<kind>``); other keys unchanged."""
    out = {k: v for k, v in metrics.items() if not k.startswith(("eos_first_sum/", "eos_first_n/"))}
    for key, total in metrics.items():
        if key.startswith("eos_first_sum/"):
            kind = key.split("/", 1)[1]
            n = metrics.get(f"eos_first_n/{kind}", 0.0)
            if n:
                out[f"eos_first/{kind}"] = total / n
    return out


def round_warnings(steps: Sequence[TrainStep], rl_on: bool, threshold: float = EMPTY_WARN) -> list[str]:
    """Warnings for one round (or one job) of steps: the RL term had no signal on any step, or a kind's
    end-of-sequence-only share or first-token EOS mass is above ``threshold`` on the last step."""
    if not steps:
        return []
    out = []
    if rl_on:
        groups = sum(s.metrics.get("rl_groups", 0.0) for s in steps)
        live = sum(s.metrics.get("rl_groups_live", 0.0) for s in steps)
        if not live:
            out.append(f"the RL term had no signal: 0 of {int(groups)} groups had a non-zero advantage in steps "
                       f"{steps[0].step}-{steps[-1].step} (every sample of a task scored the same)")
    last = steps[-1].metrics
    for key in sorted(last):
        for prefix, what in (("empty/", "outputs were end-of-sequence only"),
                             ("eos_first/", "first-token end-of-sequence mass")):
            if key.startswith(prefix) and last[key] > threshold:
                out.append(f"{key.split('/', 1)[1]} calls at step {steps[-1].step}: {last[key]:.2f} {what} "
                           f"(above {threshold:.2f}): the student is learning to stop")
    return out


def note(step: TrainStep) -> str:
    """A short progress note of a step's dynamics: live groups, first-token EOS and length per kind, KLs."""
    m = step.metrics
    parts = []
    if m.get("rl_groups"):
        parts.append(f"live {int(m.get('rl_groups_live', 0))}/{int(m['rl_groups'])}")
    for kind in sorted(k.split("/", 1)[1] for k in m if k.startswith("out_len/")):
        eos = m.get(f"eos_first/{kind}")
        parts.append(f"{kind} len {m[f'out_len/{kind}']:.1f}" + (f" eos {eos:.2f}" if eos is not None else ""))
    for key, label in (("kl_teacher", "KL_t"), ("kl_start", "KL_0")):
        if key in m:
            parts.append(f"{label} {m[key]:.3f}")
    return " ".join(parts)

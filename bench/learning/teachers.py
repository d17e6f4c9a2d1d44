"""The teachers: candidates trained, validated and picked before any arm distils from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from agentmem import models
from agentmem.config import (
    DType,
    EvalConfig,
)
from agentmem.jobs.eval import first_read_skips
from agentmem.jobs.rollout import build_env
from agentmem.jobs.teacher_check import check_teacher
from agentmem.records import SamplingContext
from bench.common.phases import say
from bench.learning.plan import VALIDATION_SEED
from store import repository as repo


class NoTeacher(Exception):
    """No teacher candidate of a domain passed the check."""


def validation(bench, domain: str) -> EvalConfig:
    """The episodes a teacher candidate of ``domain`` is validated on (training names, a seed of their own)."""
    p = bench.plan
    if domain == "squad":
        return EvalConfig(env="squad", data=p.squad, env_knobs={"docs": p.squad_docs}, episodes=p.teacher_val,
                          seed=VALIDATION_SEED, chunk_tokens=p.chunk_tokens,
                          agent=p.agent(0.0, VALIDATION_SEED, "squad"))
    level = p.train_levels[len(p.train_levels) // 2]
    return EvalConfig(env="synthetic", env_knobs=bench.ladder(level, "train"), episodes=p.teacher_val,
                      seed=VALIDATION_SEED + level, chunk_tokens=p.chunk_tokens,
                      agent=p.agent(0.0, VALIDATION_SEED))

def teacher_first_reads(bench, key: str, pick: dict) -> dict[str, float] | None:
    """``first_read_skips`` of a ladder teacher's picked candidate on its validation episodes (read back from
    the store: folders checked before the metric existed report it too); None for another domain."""
    if not key.startswith("ladder") or not pick.get("eval_run_id"):
        return None
    config = bench.validation("ladder")
    tasks = {t.task_id: t for t in build_env(config, models.load_tokenizer(bench.base().path)).tasks(config.episodes)}
    with bench.store.session() as s:
        calls = repo.stream_invocations(s, run_ids=[pick["eval_run_id"]])
        task_of = {ep.id: tasks[ep.task_id] for ep in repo.list_episodes(s, pick["eval_run_id"])
                   if ep.task_id in tasks}
    return first_read_skips(calls, task_of)

def teacher(bench, key: str) -> str:
    """The validated teacher's checkpoint id: the best candidate whose empty rate is within bounds. ``key``
    is a domain (``ladder``, ``squad``), or ``ladder-privileged``: the teacher fine-tuned and validated under
    the privileged prompt (``teacher_key``)."""
    p = bench.plan
    domain, _, privileged = key.partition("-")
    context = SamplingContext.privileged if privileged else SamplingContext.aligned

    def train() -> list[dict]:
        say(f"teacher ({key}): SFT on oracle calls ({context.value} prompt), candidates at steps {p.teacher_steps}")
        ckpts = bench.sft(f"teacher-{key}", bench.oracle_runs(domain), p.model, max(p.teacher_steps), p.warm_lr,
                         0, p.warm_calls_per_step, save_every=int(np.gcd.reduce(p.teacher_steps)), context=context)
        return [c for c in ckpts if c["step"] in p.teacher_steps]

    candidates = bench.state.once(f"teacher/{key}/candidates", train)
    reports = []
    for c in candidates:
        def validate(c=c) -> dict:
            config = bench.validation(domain).model_copy(update={"dtype": DType(bench.eval_dtype()),
                                                                 "context": context})
            report = check_teacher(bench.store, bench.ckpt(c["id"]), config, bench.runtime)
            say(f"teacher candidate step {c['step']}: {report.line()}")
            return {**asdict(report), "step": c["step"]}
        reports.append(bench.state.once(f"teacher/{key}/check/{c['id']}", validate))
    def forgot(r: dict) -> float:
        return r.get("empty_after_evidence") or 0.0

    ok = [r for r in reports if max(r["empty_by_kind"].values(), default=0.0) <= p.max_teacher_empty
          and forgot(r) <= p.max_teacher_forgot]
    if not ok:
        worst = ", ".join(f"step {r['step']}: empty {max(r['empty_by_kind'].values(), default=0):.2f}, "
                          f"(empty) after evidence {forgot(r):.2f}" for r in reports)
        raise NoTeacher(f"no {key} teacher candidate has an empty-output rate within {p.max_teacher_empty} on "
                         f"every call kind and writes (empty) after evidence on at most {p.max_teacher_forgot} of "
                         f"its updates ({worst}): refusing to distil from a teacher that stops or drops evidence")
    # under the privileged prompt the answer call reads the gold answer, so F1 says little: that teacher is
    # picked by what it does at memory updates (the fewest `(empty)` after evidence), then by F1
    best = max(ok, key=lambda r: (-forgot(r), r["f1"], -r["step"]) if privileged else
               (r["f1"], -forgot(r), -r["step"]))
    from bench.learning.arms import prune  # arms imports this module

    bench.state.put(f"teacher/{key}/pick", best)
    for c in candidates:
        prune(c["path"], weights=c["id"] != best["teacher"])
    return best["teacher"]


@dataclass(frozen=True)
class GateLimits:
    """What a teacher must show on validation before an arm may distil from it (docs/learning.md, the
    thresholds): F1 at least ``f1_margin`` above the warm start's on the same episodes, a first-read decision
    gap (the ``(empty)`` rate on other reads minus the rate on evidence reads) of at least ``min_gap``, an
    empty-output rate of at most ``max_empty`` and a first-token EOS mass of at most ``max_eos_first`` on every
    call kind."""

    f1_margin: float = 0.10
    min_gap: float = 0.5
    max_empty: float = 0.02
    max_eos_first: float = 0.05


def decision_gap(first_reads: dict[str, float] | None) -> float | None:
    """The first-read decision gap: the share of other reads that write ``(empty)`` minus the share of evidence
    reads that do (``first_read_skips``); None when either kind of read is missing."""
    if not first_reads or "other" not in first_reads or "evidence" not in first_reads:
        return None
    return first_reads["other"] - first_reads["evidence"]


def gate(check: dict, warm_f1: float, limits: GateLimits = GateLimits()) -> dict:
    """A teacher's gate on its validation ``check`` (``f1``, ``empty_by_kind``, ``eos_first_by_kind`` and
    ``first_reads``, as ``teacher`` stores them) against the warm start's validation F1 ``warm_f1``: the
    measured values, the reasons it fails (empty when it passes) and ``passed``. Pure: it reads nothing."""
    gap = decision_gap(check.get("first_reads"))
    empty = max(check.get("empty_by_kind", {}).values(), default=0.0)
    eos = max(check.get("eos_first_by_kind", {}).values(), default=0.0)
    headroom = check["f1"] - warm_f1
    fails = []
    if headroom < limits.f1_margin - 1e-12:
        fails.append(f"validation F1 {check['f1']:.3f} is {headroom:+.3f} over the warm start's {warm_f1:.3f} "
                     f"(needs {limits.f1_margin:+.2f})")
    if gap is None or gap < limits.min_gap - 1e-12:
        fails.append("no first-read decision gap measured" if gap is None else
                     f"first-read decision gap {gap:.2f} (needs {limits.min_gap:.2f})")
    if empty > limits.max_empty:
        fails.append(f"empty-output rate {empty:.3f} (at most {limits.max_empty})")
    if eos > limits.max_eos_first:
        fails.append(f"first-token EOS mass {eos:.3f} (at most {limits.max_eos_first})")
    return {"f1": check["f1"], "warm_f1": warm_f1, "headroom": headroom, "decision_gap": gap, "max_empty": empty,
            "max_eos_first": eos, "passed": not fails, "fails": fails}

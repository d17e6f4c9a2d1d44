"""The teachers: candidates trained, validated and picked before any arm distils from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from agentmem import model_refs
from agentmem.config import (
    DType,
    EvalConfig,
)
from agentmem.jobs.eval import first_read_skips
from agentmem.jobs.rollout import build_env
from agentmem.jobs.teacher_check import check_teacher
from agentmem.records import SamplingContext
from bench.common.phases import say
from bench.learning import records
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
    if key.startswith("squad") or not pick.get("eval_run_id"):
        return None
    config = bench.validation("ladder")
    tasks = {t.task_id: t for t in build_env(config, model_refs.load_tokenizer(bench.base().path)).tasks(config.episodes)}
    with bench.store.session() as s:
        calls = list(repo.stream_invocations(s, run_ids=[pick["eval_run_id"]]))  # read inside the session
        task_of = {ep.id: tasks[ep.task_id] for ep in repo.list_episodes(s, pick["eval_run_id"])
                   if ep.task_id in tasks}
    return first_read_skips(calls, task_of)

def teacher(bench, key: str) -> str:
    """The validated teacher's checkpoint id: the best candidate whose empty rate is within bounds. ``key``
    is a domain (``ladder``, ``squad``: the default model SFT'd on oracle calls), ``ladder-privileged`` or
    ``ladder-hint`` (the same, fine-tuned and validated under the privileged or hint prompt), ``rl-SEED`` (T_rl:
    seed SEED's warm start, then the RL term alone for ``rl_teacher_steps``, candidates at
    ``rl_teacher_candidates``) or ``t0-SEED`` (T0: the warm start itself, validated, never refused)."""
    p = bench.plan
    seeded = key.startswith(("rl-", "t0-"))
    domain, _, variant = ("ladder", "", "") if seeded else key.partition("-")
    context = SamplingContext(variant) if variant in ("privileged", "hint") else SamplingContext.aligned

    def train() -> list[dict]:
        if key.startswith("t0-"):
            return [{**bench.warm("ladder", int(key[3:])), "step": 0}]
        if key.startswith("rl-"):
            seed = int(key[3:])
            say(f"teacher ({key}): the RL term alone for {p.rl_teacher_steps} steps, candidates at "
                f"{p.rl_teacher_candidates}")
            rounds = bench.on_policy("grpo", seed, steps=p.rl_teacher_steps, name=f"teacher-{key}", seed_base=200_000,
                                     keep=tuple(p.rl_teacher_candidates))
            return [{**c, "step": c["round"] * p.steps_per_round} for c in rounds
                    if c["round"] * p.steps_per_round in p.rl_teacher_candidates]
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

    ok = [r for r in reports if key.startswith("t0-") or (
        max(r["empty_by_kind"].values(), default=0.0) <= p.max_teacher_empty and forgot(r) <= p.max_teacher_forgot)]
    if not ok:
        worst = ", ".join(f"step {r['step']}: empty {max(r['empty_by_kind'].values(), default=0):.2f}, "
                          f"(empty) after evidence {forgot(r):.2f}" for r in reports)
        raise NoTeacher(f"no {key} teacher candidate has an empty-output rate within {p.max_teacher_empty} on "
                         f"every call kind and writes (empty) after evidence on at most {p.max_teacher_forgot} of "
                         f"its updates ({worst}): refusing to distil from a teacher that stops or drops evidence")
    # under the privileged prompt the answer call reads the gold answer, so F1 says little: that teacher is
    # picked by what it does at memory updates (the fewest `(empty)` after evidence), then by F1
    best = max(ok, key=lambda r: (-forgot(r), r["f1"], -r["step"]) if variant == "privileged" else
               (r["f1"], -forgot(r), -r["step"]))
    from bench.learning.arms import prune  # arms imports this module

    bench.state.put(f"teacher/{key}/pick", best)
    for c in candidates:
        if not key.startswith("t0-"):  # T0 is the warm start: its weights and AdamW state stay
            prune(c["path"], weights=c["id"] != best["teacher"])
    return best["teacher"]


def limits(plan) -> GateLimits:
    return GateLimits(plan.gate_f1_margin, plan.gate_min_gap, plan.gate_max_empty, plan.gate_max_eos_first)


def gated(bench, key: str, seed: int, enforce: bool = True) -> dict:
    """Teacher ``key``'s gate for training seed ``seed`` (``gate`` on its picked validation check against that
    seed's warm start, T0, on the same episodes), stored once and written as a teacher record; raises NoTeacher
    when it fails and ``enforce`` (the controls, T_sft and T0, are measured, not gated)."""
    from bench.learning.plan import teacher_name

    def measure() -> dict:
        bench.teacher(key)
        pick = bench.state.get(f"teacher/{key}/pick")
        bench.teacher(f"t0-{seed}")
        warm = bench.state.get(f"teacher/t0-{seed}/pick")
        check = {**pick, "first_reads": bench.teacher_first_reads(key, pick)}
        return gate(check, warm["f1"], limits(bench.plan))

    result = bench.state.once(f"gate/{key}/{seed}", measure)
    bench.write_record(records.teacher_record(asdict(bench.plan), teacher_name(key), seed, result))
    if enforce and not result["passed"]:
        raise NoTeacher(f"teacher {key} fails its gate for seed {seed}: {'; '.join(result['fails'])}")
    return result


@dataclass(frozen=True)
class GateLimits:
    """What a teacher must show on validation before an arm may distil from it (docs/learning.md, the
    thresholds): F1 at least ``f1_margin`` above the warm start's on the same episodes, a first-read decision
    gap (the ``(empty)`` rate on other reads minus the rate on evidence reads) of at least ``min_gap``, an
    empty-output rate of at most ``max_empty`` and a first-token EOS mass of at most ``max_eos_first`` on every
    call kind. None turns a check off (``--smoke``, whose tiny model measures nothing)."""

    f1_margin: float | None = 0.10
    min_gap: float | None = 0.5
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
    if limits.f1_margin is not None and headroom < limits.f1_margin - 1e-12:
        fails.append(f"validation F1 {check['f1']:.3f} is {headroom:+.3f} over the warm start's {warm_f1:.3f} "
                     f"(needs {limits.f1_margin:+.2f})")
    if limits.min_gap is not None and (gap is None or gap < limits.min_gap - 1e-12):
        fails.append("no first-read decision gap measured" if gap is None else
                     f"first-read decision gap {gap:.2f} (needs {limits.min_gap:.2f})")
    if empty > limits.max_empty:
        fails.append(f"empty-output rate {empty:.3f} (at most {limits.max_empty})")
    if eos > limits.max_eos_first:
        fails.append(f"first-token EOS mass {eos:.3f} (at most {limits.max_eos_first})")
    return {"f1": check["f1"], "warm_f1": warm_f1, "headroom": headroom, "decision_gap": gap, "max_empty": empty,
            "max_eos_first": eos, "passed": not fails, "fails": fails}

"""Arm-seeds side by side (``--jobs``): which task may start, in which order, in its own process."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from bench.common.phases import say
from bench.learning import teachers
from bench.learning.arms import Bench, open_bench, quiet_transformers
from bench.learning.plan import (
    Plan,
    arm_flags,
    arm_seeds,
    eval_key,
    teacher_key,
    teacher_keys,
    uses_teacher,
)
from bench.learning.teachers import NoTeacher


def job(work: str, plan: dict, threads: int, task: tuple[str, str | int], records_dir: str | None = None) -> str:
    """One unit of ``--jobs`` work in its own process (phases go to the shared state file): ``("teacher",
    domain)``, ``("base", 0)`` (the base model's evaluation) or ``(arm, seed)`` (train, then evaluate)."""
    quiet_transformers()
    bench = open_bench(Path(work), Plan(**plan), threads, Path(records_dir) if records_dir else None)
    kind, arg = task
    if kind == "teacher":
        try:
            bench.teacher(str(arg))
        except NoTeacher as e:  # the main process meets it again from the stored checks and refuses the arms
            return f"{arg} teacher: {e}"
    elif kind == "base":
        bench.evaluate("base", 0, bench.base(), True, True)
    else:
        try:
            bench.finish(kind, int(arg))
        except NoTeacher as e:  # a teacher past its check but not past its gate: the main process refuses the arm
            return f"{kind} {arg}: {e}"
    return f"{kind} {arg} done"


def refused_arms(bench: Bench) -> dict[str, str]:
    """Arm -> why it may not run: the distilling arms whose teacher failed its check (the teacher is
    validated here, before any arm distils from it; the other arms still run)."""
    plan = bench.plan
    refused: dict[str, str] = {}
    evaluated = {"ladder": "teacher_ladder", "ladder-hint": "teacher_hint"}
    for key in teacher_keys(plan):
        try:
            bench.teacher(key)
            for seed in (range(plan.seeds) if key.startswith(("rl-", "ladder-hint")) else ()):
                if any(uses_teacher(a) and teacher_key(plan, a, seed) == key for a in plan.arms):
                    teachers.gated(bench, key, seed)  # T_rl and T_hint distil only past their gate
        except NoTeacher as e:
            say(f"warning: {e}")
            refused |= {a: str(e) for a in plan.arms
                        if (uses_teacher(a) and any(teacher_key(plan, a, s) == key for s in arm_seeds(plan, a)))
                        or a == evaluated.get(key) or (a == "teacher_rl" and key.startswith("rl-"))}
    return refused


def done(bench: Bench, kind: str, arg: str | int) -> bool:
    """Whether a ``job`` task's phases are all in the state file."""
    state = bench.state
    if kind == "teacher":
        return state.get(f"teacher/{arg}/pick") is not None or (
            (cands := state.get(f"teacher/{arg}/candidates")) is not None
            and all(state.get(f"teacher/{arg}/check/{c['id']}") is not None for c in cands))
    ladder, real = arm_flags(kind)
    trained = kind == "base" or state.get(f"arm/{kind}/{arg}") is not None
    return trained and state.get(eval_key(kind, arg, ladder, real)) is not None


def die_with_parent() -> None:
    """A ``--jobs`` worker ends when the benchmark's process does (Linux ``PR_SET_PDEATHSIG``), so a killed
    run leaves no worker training on; elsewhere a no-op. Its finished phases are in the state file."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def needs(bench: Bench, task: tuple[str, str | int]) -> dict[str, tuple[str, str | int]]:
    """The state phases ``task`` reads before it can start, each with the task that makes it."""
    kind, arg = task
    if kind == "teacher" and str(arg).startswith(("rl-", "t0-")):  # T_rl and T0 start from a seed's warm start
        seed = int(str(arg)[3:])
        return {f"warm/ladder/{seed}": ("warm", seed)}
    if kind in ("base", "teacher", "warm", "squad_warm"):
        return {}
    if kind in ("teacher_ladder", "teacher_hint", "teacher_rl"):
        key = {"teacher_ladder": "ladder", "teacher_hint": "ladder-hint"}.get(kind, f"rl-{arg}")
        return {f"teacher/{key}/pick": ("teacher", key)}
    domain = "squad" if kind.startswith("squad") else "ladder"
    out: dict[str, tuple[str, str | int]] = {f"warm/{domain}/{arg}": ("squad_warm" if domain == "squad" else "warm", arg)}
    if uses_teacher(kind):
        key = teacher_key(bench.plan, kind, int(arg))
        out[f"teacher/{key}/pick"] = ("teacher", key)
        if key.startswith(("rl-", "ladder-hint")):  # the gate compares the teacher with the seed's warm start (T0)
            out[f"teacher/t0-{arg}/pick"] = ("teacher", f"t0-{arg}")
    if kind == "momentum" and not bench.plan.coasts:  # it reads the warm start's evaluation (Bench.evaluate)
        out[eval_key("warm", arg, *arm_flags("warm"))] = ("warm", arg)
    return out


def run_jobs(bench: Bench, tasks: list[tuple[str, str | int]], jobs: int, threads: int) -> None:
    """Run ``tasks`` in ``jobs`` processes of ``threads`` threads each. A task starts as soon as a process is
    free and the phases it needs (``needs``) are in the state file, the first such in list order (an arm
    starts once its warm start's checkpoint is saved, while that warm start is still being evaluated); a
    phase whose maker is not in the list is made by the task itself. A task whose teacher was refused is
    dropped (the report names it). Every finished phase is in the state file, so a killed run goes on where
    it stopped. Raises the first failure after every running task has ended."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    queue = list(tasks)
    if not queue:
        return
    say(f"{len(queue)} tasks in {jobs} processes of {threads} thread(s): {', '.join(f'{a}/{b}' for a, b in queue)}")
    running: dict = {}
    finished: set[tuple[str, str | int]] = set()
    errors: list[Exception] = []
    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"),
                             initializer=die_with_parent) as pool:
        while queue or running:
            bench.state.refresh()
            waiting = set(queue) | set(running.values())
            for t in list(queue):
                if len(running) >= jobs or errors:
                    break
                blocked = False
                for phase, maker in needs(bench, t).items():
                    if bench.state.get(phase) is not None:
                        continue
                    if maker in finished and maker[0] == "teacher":  # checked, and refused: no pick
                        queue.remove(t)
                        blocked = True
                        break
                    if maker in waiting:
                        blocked = True
                        break
                if not blocked and t in queue:
                    queue.remove(t)
                    records_dir = str(bench.records_dir) if bench.records_dir else None
                    running[pool.submit(job, str(bench.work), asdict(bench.plan), threads, t, records_dir)] = t
            if errors and not running:
                break
            if not running:
                if queue:  # nothing can start and nothing runs: a dependency cycle cannot happen; guard anyway
                    raise RuntimeError(f"tasks cannot start: {queue}")
                break
            done_now, _ = wait(list(running), timeout=15, return_when=FIRST_COMPLETED)
            for f in done_now:
                t = running.pop(f)
                finished.add(t)
                try:
                    say(f.result())
                except Exception as e:  # noqa: BLE001 - reported, then raised once the running ones end
                    say(f"error: {t[0]} {t[1]}: {type(e).__name__}: {e}")
                    errors.append(e)
    bench.state.refresh()
    if errors:
        raise errors[0]

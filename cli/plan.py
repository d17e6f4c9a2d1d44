"""A job's planned work, the first line after its run id: ``plan: 8 episodes, about 40 calls, about 2 min 10 s (at
0.31 calls/s, the rate of this model's last finished run in this store)``.

Counted before the job starts, from what the job will read: a rollout's or eval's tasks (its environment built
with the model's tokenizer: one call a chunk and one answer call an episode, so "about": an agent may answer
early, a memory policy make more calls) and a score's stored calls. The time is the calls at a measured rate:
the same model's last finished run in this store, else for the default model the rate of the README's first
rollout on 2 idle cores (slower when the cores are busy), else none (the progress lines give it once calls run). Nothing here loads weights or prepares the default model: without its tokenizer at hand
the plan names the episodes only.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentmem.records import RunKind

# calls per second of the untrained default model in the README's first command on 2 idle cores: `agentmem
# rollout`, 8 synthetic tasks (30 calls sampled at temperature 1), 2 min 45 s with its start-up (cli/rollout.py).
# A greedy evaluation of a trained checkpoint, with its short answers and 32 episodes a batch, runs near 3.7 calls/s.
DEFAULT_MODEL_CALLS_PER_SECOND = 30 / 165


@dataclass(frozen=True)
class Plan:
    episodes: int | None
    calls: int | None
    rate: float | None  # calls per second
    basis: str  # where the rate comes from

    def line(self) -> str:
        from cli.agent_progress import duration

        parts = []
        if self.episodes is not None:
            parts.append(f"{self.episodes} episode{'' if self.episodes == 1 else 's'}")
        if self.calls is not None:
            parts.append(f"about {self.calls} calls" if self.episodes is not None else f"{self.calls} calls")
            if self.rate:
                parts.append(f"about {duration(self.calls / self.rate)} (at {self.rate:.2f} calls/s, {self.basis})")
            else:
                parts.append("time shown once calls run")
        else:
            parts.append(f"calls counted once {self.basis}")
        return "plan: " + ", ".join(parts)


def sum_plans(plans: list[Plan]) -> Plan:
    """The plan of several runs in a row (a sweep's): episodes and calls added, the first rate."""
    if len(plans) == 1:
        return plans[0]

    def total(values):
        return None if any(v is None for v in values) else sum(values)

    return Plan(total([p.episodes for p in plans]), total([p.calls for p in plans]), plans[0].rate, plans[0].basis)


def _model_rate(store, kinds: tuple[RunKind, ...], matches, count) -> float | None:
    """Calls per second of the newest finished run of ``kinds`` whose config ``matches``, ``count`` its calls."""
    from store import repository as repo

    with store.session() as s:
        runs = [r for kind in kinds for r in repo.list_runs_of_kind(s, kind)
                if r.status == "finished" and r.finished_at is not None and matches(r.config)]
        if not runs:
            return None
        run = max(runs, key=lambda r: r.created_at)
        seconds = (run.finished_at - run.created_at).total_seconds()
        calls = count(s, run.id)
    return calls / seconds if calls and seconds > 0 else None


def _tokenizer_path(store, model: str) -> str | None:
    """The folder of ``model``'s tokenizer, without preparing the default model (None when it is not yet)."""
    from agentmem import model_refs
    from agentmem.backends.model_files import DEFAULT_MODEL, default_cache_dir, is_model_folder

    if model in ("default", DEFAULT_MODEL):
        folder = default_cache_dir() / DEFAULT_MODEL
        return str(folder) if is_model_folder(folder) else None
    return model_refs.resolve(store, model).path


def agent_plan(config, db: str | None) -> Plan:
    """The plan of a new rollout or eval run of ``config`` (a ``RolloutConfig``)."""
    from agentmem.config import PolicySource
    from agentmem.jobs.rollout import build_env
    from store import repository as repo
    from store.engine import open_store

    store = open_store(db, create=True)
    try:
        path = _tokenizer_path(store, config.model)
        if path is None:
            return Plan(config.episodes * config.group_size, None, None, "the default model is prepared")
        from agentmem import model_refs

        tasks = build_env(config, model_refs.load_tokenizer(path)).tasks(config.episodes)
        calls = sum(len(t.chunks) + 1 for t in tasks) * config.group_size
        if config.policy is PolicySource.oracle:
            return Plan(len(tasks) * config.group_size, calls, None, "")
        rate = _model_rate(store, (RunKind.rollout, RunKind.eval),
                           lambda c: c.get("model") == config.model and c.get("policy", "model") == "model",
                           lambda s, rid: repo.count_invocations(s, [rid]))
        basis = "the rate of this model's last finished run in this store"
        if rate is None and config.model in ("default", None):
            rate, basis = DEFAULT_MODEL_CALLS_PER_SECOND, "the default model's first rollout on 2 idle cores"
        return Plan(len(tasks) * config.group_size, calls, rate, basis)
    finally:
        store.dispose()


def score_plan(config, db: str | None) -> Plan:
    """The plan of a score run of ``config``: the stored calls of its runs (those scored before are skipped)."""
    from agentmem.jobs.runs import check_runs
    from store import repository as repo
    from store.engine import open_store

    store = open_store(db)
    try:
        with store.session() as s:
            calls = repo.count_invocations(s, check_runs(store, list(config.run_ids)))
        rate = _model_rate(store, (RunKind.score,), lambda c: c.get("teacher") == config.teacher,
                           repo.count_teacher_scores)
        return Plan(None, calls, rate, "the rate of this teacher's last finished score run in this store")
    finally:
        store.dispose()

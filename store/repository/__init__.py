"""Repository functions: records in, records out. Every function takes the session; the caller owns the
transaction (commit after each unit of completed work, so a killed job loses at most the work in flight).

Inserts are idempotent: a row whose id or natural key (episode+step for invocations, run+task+sample for
episodes, invocation+teacher+context for teacher scores, run+step for train steps) already exists is
skipped, so a resumed job can re-offer what it is not sure was written.

A run's life: ``start_run`` (running, with this process's pid and host), ``heartbeat`` as work completes,
``finish_run`` (finished, failed with its error, or interrupted), ``claim_run`` to take it over for a
resume. ``run_liveness`` tells a live running run from one whose process was killed.

One module per record type: ``runs``, ``checkpoints``, ``episodes``, ``invocations``, ``teacher_scores``,
``train_steps``, ``eval_results`` (``rows`` holds what they share: text columns, idempotent inserts, rows by
abbreviated id; ``stored`` the check of a run's rows a job makes before it reads them). Every function of these is
re-exported here, so callers write ``from store import repository as repo`` and ``repo.get_run(...)`` whatever module
holds it.

Four modules serve one part each and are imported by name (``from store.repository import leases``), since their
names would clash in one namespace: ``leases`` (a rollout run's episodes as work items that workers claim),
``serve`` (``agentmem serve``'s episodes, growing one call at a time, and its ``serve_calls``), ``memories`` (workflow
memories) and ``memory_log`` (the ``log`` memory policy's entries).
"""

from store.repository.checkpoints import (
    checkpoint_id_for_path,
    find_checkpoint_by_path,
    get_checkpoint,
    insert_checkpoint,
    list_checkpoints,
    register_checkpoint,
)
from store.repository.episodes import (
    EPISODE_SORTS,
    EpisodeStats,
    count_episodes,
    episode_f1s,
    episode_record,
    get_episode,
    insert_episodes,
    list_episode_stats,
    list_episodes,
    outcome_values,
    update_episode,
)
from store.repository.eval_results import (
    insert_eval_result,
    list_eval_results,
)
from store.repository.invocations import (
    count_invocations,
    episode_invocations,
    insert_invocations,
    stream_invocations,
)
from store.repository.rows import (
    text_column,
)
from store.repository.runs import (
    STALE_AFTER,
    RunSummary,
    claim_run,
    count_runs,
    delete_run,
    finish_run,
    get_run,
    heartbeat,
    insert_run,
    list_runs,
    list_runs_of_kind,
    pid_alive,
    run_liveness,
    run_policy_versions,
    start_run,
)
from store.repository.stored import check_stored_rows
from store.repository.teacher_scores import (
    count_teacher_scores,
    get_teacher_scores,
    insert_teacher_scores,
    scored_invocation_ids,
    teacher_score_keys,
    teacher_score_summary,
)
from store.repository.train_steps import (
    count_train_steps,
    insert_train_step,
    list_train_steps,
)

__all__ = [
    "EPISODE_SORTS",
    "EpisodeStats",
    "RunSummary",
    "STALE_AFTER",
    "check_stored_rows",
    "checkpoint_id_for_path",
    "claim_run",
    "count_episodes",
    "delete_run",
    "count_invocations",
    "count_runs",
    "count_teacher_scores",
    "count_train_steps",
    "episode_f1s",
    "episode_invocations",
    "episode_record",
    "find_checkpoint_by_path",
    "finish_run",
    "get_checkpoint",
    "get_episode",
    "get_run",
    "get_teacher_scores",
    "heartbeat",
    "insert_checkpoint",
    "insert_episodes",
    "insert_eval_result",
    "insert_invocations",
    "insert_run",
    "insert_teacher_scores",
    "insert_train_step",
    "list_checkpoints",
    "list_episode_stats",
    "list_episodes",
    "list_eval_results",
    "list_runs",
    "list_runs_of_kind",
    "list_train_steps",
    "outcome_values",
    "pid_alive",
    "register_checkpoint",
    "run_liveness",
    "run_policy_versions",
    "scored_invocation_ids",
    "start_run",
    "stream_invocations",
    "teacher_score_keys",
    "teacher_score_summary",
    "text_column",
    "update_episode",
]

"""The export job: stored invocations as a Hugging Face ``datasets`` table (Parquet or a saved dataset folder), one
row per invocation with its episode's outcome, for analysis or training outside agentmem. Token ids and
log-probs are exported exactly (int32 / float32 lists); a call stored without sampler log-probs (``role``
``oracle``) has ``output_logprobs`` null. A privileged call (PSD's off-policy samples) carries its
``privileged_ids`` apart from ``prompt_ids`` (the sampler read both, in that order); a ReOPD replay call
names the teacher call it branched from in ``parent_invocation_id``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentmem.errors import RunError
from store import repository as repo
from store.engine import Store

if TYPE_CHECKING:
    import datasets


def features() -> datasets.Features:
    """The exported table's columns (``datasets`` loads here, not at import: a fast CLI start)."""
    import datasets

    return datasets.Features({
        "invocation_id": datasets.Value("string"), "run_id": datasets.Value("string"),
        "episode_id": datasets.Value("string"), "task_id": datasets.Value("string"),
        "sample_index": datasets.Value("int32"), "step": datasets.Value("int32"), "kind": datasets.Value("string"),
        "memory_policy": datasets.Value("string"), "role": datasets.Value("string"),
        "policy_version": datasets.Value("string"),
        "prompt_ids": datasets.Sequence(datasets.Value("int32")),
        "output_ids": datasets.Sequence(datasets.Value("int32")),
        "output_logprobs": datasets.Sequence(datasets.Value("float32")),
        "prompt_text": datasets.Value("string"), "output_text": datasets.Value("string"),
        "memory_before": datasets.Value("string"), "memory_after": datasets.Value("string"),
        "finish_reason": datasets.Value("string"), "temperature": datasets.Value("float32"),
        "question": datasets.Value("string"), "gold_answers": datasets.Sequence(datasets.Value("string")),
        "prediction": datasets.Value("string"), "reward": datasets.Value("float32"),
        "episode_status": datasets.Value("string"),
        "sampled_context": datasets.Value("string"),
        "privileged_ids": datasets.Sequence(datasets.Value("int32")),
        "parent_invocation_id": datasets.Value("string"),
    })


def _rows(store: Store, run_ids: Sequence[str]) -> Iterator[dict[str, Any]]:
    with store.session() as s:
        run_ids = [repo.get_run(s, r).id for r in run_ids]
        episodes = {e.id: e for e in repo.list_episodes(s, run_ids)}
        for inv in repo.stream_invocations(s, run_ids=run_ids):
            ep = episodes[inv.episode_id]
            yield {
                "invocation_id": inv.id, "run_id": ep.run_id, "episode_id": ep.id, "task_id": ep.task_id,
                "sample_index": ep.sample_index, "step": inv.step, "kind": str(inv.kind),
                "memory_policy": inv.memory_policy, "role": inv.role,
                "policy_version": inv.policy_version, "prompt_ids": inv.prompt_ids, "output_ids": inv.output_ids,
                "output_logprobs": inv.output_logprobs, "prompt_text": inv.prompt_text,
                "output_text": inv.output_text, "memory_before": inv.memory_before, "memory_after": inv.memory_after,
                "finish_reason": inv.finish_reason.value, "temperature": inv.temperature,
                "question": ep.question, "gold_answers": ep.gold_answers, "prediction": ep.prediction,
                "reward": ep.reward, "episode_status": ep.status.value,
                "sampled_context": inv.sampled_context.value, "privileged_ids": inv.privileged_ids,
                "parent_invocation_id": inv.parent_invocation_id,
            }


def export_invocations(store: Store, run_ids: Sequence[str], out: Path) -> datasets.Dataset:
    """Write ``out`` (``.parquet`` file, else a ``save_to_disk`` folder); returns the dataset. A stored row it
    cannot read, or an outcome the store no longer takes (a reward that is not finite), is one ``StoredRowError``
    naming the run and the row, before anything is written."""
    with store.session() as s:
        repo.check_stored_rows(s, [repo.get_run(s, r).id for r in run_ids])
    rows = list(_rows(store, run_ids))
    if not rows:
        raise RunError(f"no stored invocations in run(s) {', '.join(run_ids)}")
    import datasets  # here, after the run ids are checked: a bad id answers at once
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    quiet = are_progress_bars_disabled()
    disable_progress_bars()  # library code prints nothing: no tqdm bar from datasets' writers
    try:
        ds = datasets.Dataset.from_list(rows, features=features())
        out = Path(out)
        if out.suffix == ".parquet":
            ds.to_parquet(str(out))
        else:
            ds.save_to_disk(str(out))
    finally:
        if not quiet:
            enable_progress_bars()
    return ds


def run_export(store: Store, run_ids: Sequence[str], out: Path | str) -> datasets.Dataset:
    """The export job (no run row: it only reads). ``out`` ending in ``.parquet`` is one Parquet file,
    anything else a ``save_to_disk`` folder."""
    return export_invocations(store, run_ids, Path(out))

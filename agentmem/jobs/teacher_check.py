"""Validate a teacher before any distillation uses it: a greedy evaluation of it as a policy, with its
held-out F1, its end-of-sequence-only output rate per call kind, its first-token EOS mass per kind, and
``empty_after_evidence`` (the share of its memory updates, once a fact was read, that write ``(empty)``).

A teacher whose empty-output rate on any kind is above the threshold is refused (``ConfigError``): on-policy
distillation from it pulls the student towards stopping at once. So is one that writes ``(empty)`` after
evidence more often than ``max_forgot``: it pulls the student towards dropping what it read (measured: an
SFT teacher 16 steps into its schedule did so on 0.92 of such updates, at step 24 on 0.16, with the same F1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentmem import model_refs
from agentmem.config import EvalConfig
from agentmem.errors import ConfigError
from agentmem.jobs.eval import run_eval
from agentmem.records import Checkpoint
from agentmem.runtime import CPU, Runtime
from store import repository as repo
from store.engine import Store


@dataclass(frozen=True)
class TeacherReport:
    teacher: str  # checkpoint id
    eval_run_id: str
    f1: float
    empty_rate: float
    empty_by_kind: dict[str, float] = field(default_factory=dict)
    out_len_by_kind: dict[str, float] = field(default_factory=dict)
    eos_first_by_kind: dict[str, float] = field(default_factory=dict)
    empty_after_evidence: float | None = None

    def worst_empty(self) -> tuple[str, float]:
        return max(self.empty_by_kind.items(), key=lambda kv: kv[1], default=("none", 0.0))

    def line(self) -> str:
        kinds = ", ".join(f"{k}: empty {self.empty_by_kind[k]:.2f}, eos@1 {self.eos_first_by_kind.get(k, 0.0):.2f}, "
                          f"len {self.out_len_by_kind.get(k, 0.0):.1f}" for k in self.empty_by_kind)
        forgot = "" if self.empty_after_evidence is None else f"; (empty) after evidence {self.empty_after_evidence:.2f}"
        return f"teacher {self.teacher[:12]}: F1 {self.f1:.3f}; {kinds}{forgot}"


def check_teacher(store: Store, teacher: Checkpoint, config: EvalConfig, runtime: Runtime = CPU,
                  max_empty: float | None = None, max_forgot: float | None = None,
                  eos_prompts: int | None = 64) -> TeacherReport:
    """Evaluate ``teacher`` greedily with ``config`` (its model is set to the teacher; ``config.context``
    privileged: under the privileged prompt, a privileged teacher's own) and measure its first-token EOS mass
    on the calls it made, on the ids it read. Raises ConfigError when ``max_empty`` is given and some call
    kind's end-of-sequence-only share is above it, or when ``max_forgot`` is given and its
    ``empty_after_evidence`` is above that. ``eos_prompts``: the prompts of each call kind the first-token EOS
    mass is measured on (``first_token_eos``'s ``max_per_kind``: a forward pass each)."""
    from agentmem.training.validation import first_token_eos  # torch: after the job's flags are checked

    backend = model_refs.backend(config.backend, teacher.path, config.dtype, runtime)
    row = run_eval(store, config.model_copy(update={"model": teacher.path}), runtime, backend=backend,
                   policy=teacher)
    with store.session() as s:
        # what the teacher read: the privileged splice too when ``config.context`` is privileged
        prompts = [(str(i.kind), i.sampled_prompt_ids.tolist())
                   for i in repo.stream_invocations(s, run_ids=[row.run_id])]
    model = getattr(backend, "model", None)
    own = model is None
    if own:
        model, _ = model_refs.load(teacher.path, config.dtype, runtime)
    eos = backend.tokenizer.eos_token_id
    eos_first = first_token_eos(model, prompts, eos, runtime.device, eos_prompts) if eos is not None else {}
    report = TeacherReport(teacher.id, row.run_id, row.f1, float(row.metrics.get("empty_rate", 0.0)),
                           dict(row.metrics.get("empty_by_kind", {})), dict(row.metrics.get("out_len_by_kind", {})),
                           eos_first, row.metrics.get("empty_after_evidence"))
    kind, worst = report.worst_empty()
    if max_empty is not None and worst > max_empty:
        raise ConfigError(f"teacher {teacher.id} ({teacher.path}) writes end-of-sequence-only outputs on {worst:.0%} "
                          f"of its {kind} calls (limit {max_empty:.0%}, eval run {row.run_id}): distilling from it "
                          "teaches the student to stop at once. Train the teacher on outputs that are never empty "
                          "(agentmem rollout --policy oracle writes none) or with a lower learning rate")
    forgot = report.empty_after_evidence
    if max_forgot is not None and forgot is not None and forgot > max_forgot:
        raise ConfigError(f"teacher {teacher.id} ({teacher.path}) writes an empty memory on {forgot:.0%} of its updates "
                          f"made after a fact was read (limit {max_forgot:.0%}, eval run {row.run_id}): distilling "
                          "from it teaches the student to drop what it read. Train the teacher longer (an SFT "
                          "teacher passes through this phase) or pick a later checkpoint")
    return report

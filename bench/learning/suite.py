"""The arms: one table of ``Arm`` records. Each trained arm is a config file of ``agentmem train`` in
``examples/learning/`` that extends ``base.yaml``; the driver (``campaign``) runs it as the command line
``agentmem train --config examples/learning/ARM.yaml --student WARM_START --seed N`` would, and evaluates it.

``core`` is the suite that answers the question (does on-policy distillation from a teacher that knows more add
to SFT and to RL?); ``ablations`` are runnable with ``--suite ablations``, outside the core plan. The docs' arm
table is ``markdown_table()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = ROOT / "examples" / "learning"


@dataclass(frozen=True)
class Arm:
    """An arm: ``overlay`` (a file in ``examples/learning``; None: a model evaluated as it is), the teacher it
    learns from (``hint``: the committed hint teacher; ``warm``: the seed's warm start itself, T0; ``base``: the
    base model, as its file names it; None), its
    ``tags`` (``core`` or ``ablation``; ``once``: no training seed changes it, so it is evaluated once and pairs
    with every seed), ``sweep``: flag -> values picked on validation (the first seed picks, the others reuse it),
    and what it is, in one line."""

    name: str
    overlay: str | None
    teacher: str | None
    tags: tuple[str, ...]
    about: str
    sweep: tuple[str, tuple[float, ...]] | None = None

    @property
    def trained(self) -> bool:
        return self.overlay is not None

    @property
    def path(self) -> Path:
        assert self.overlay is not None
        return OVERLAYS / self.overlay


ARMS: tuple[Arm, ...] = (
    Arm("base", None, None, ("core", "once"), "the base model, untrained"),
    Arm("warm", None, None, ("core",), "the seed's warm start: 16 SFT steps on oracle calls (every arm starts here)"),
    Arm("teacher_hint", None, "hint", ("core", "once"), "the hint teacher itself, reading its hint line"),
    Arm("momentum", "momentum.yaml", None, ("core",), "the null method: zero gradients, the carried AdamW state"),
    Arm("sft_more", "sft_more.yaml", None, ("core",), "SFT continued on the oracle's calls of each round's tasks"),
    Arm("seqkd_hint", "seqkd_hint.yaml", "hint", ("core",), "SeqKD: cross-entropy on the hint teacher's samples"),
    Arm("opd_hint", "opd_hint.yaml", "hint", ("core",), "on-policy distillation from the hint teacher"),
    Arm("grpo", "grpo.yaml", None, ("core",), "the RL term alone"),
    Arm("opd_grpo_hint", "opd_grpo_hint.yaml", "hint", ("core",),
        "the RL term with the hint teacher in its advantage, c on validation", ("--kd-weight", (0.1, 0.3, 1.0))),
    Arm("opd_t0", "opd_t0.yaml", "warm", ("ablation",), "on-policy distillation from the warm start itself (T0)"),
    Arm("opd_grpo", "opd_grpo.yaml", "hint", ("ablation",), "the teacher term beside the RL term, weight 1"),
    Arm("opd_persistent", "opd_persistent.yaml", "hint", ("ablation",),
        "the teacher reads the flattened history (persistent), not the student's state"),
    Arm("opd_centered", "opd_centered.yaml", "hint", ("ablation",),
        "the teacher's first-token push centred over each call kind"),
    Arm("opd_privileged", "opd_privileged.yaml", "base", ("ablation",),
        "the base model as teacher, reading the gold answer and evidence (self-distillation)"),
    Arm("psd_off", "psd_off.yaml", "base", ("ablation",),
        "PSD off-policy: distils on the privileged base model's own samples"),
)
BY_NAME = {a.name: a for a in ARMS}
SUITES = {"core": tuple(a.name for a in ARMS if "core" in a.tags),
          "ablations": tuple(a.name for a in ARMS if "ablation" in a.tags)}
PILOT = ("base", "warm", "teacher_hint", "sft_more", "seqkd_hint", "opd_hint")


def arm(name: str) -> Arm:
    if name not in BY_NAME:
        import difflib

        close = difflib.get_close_matches(name, BY_NAME, n=1)
        raise KeyError(f"unknown arm {name!r}" + (f" (did you mean {close[0]}?)" if close else "")
                       + f": one of {', '.join(BY_NAME)}")
    return BY_NAME[name]


def markdown_table() -> str:
    """The docs' arm table (docs/learning.md holds it verbatim; a test compares them)."""
    rows = ["| arm | suite | config | teacher | what it is |", "|---|---|---|---|---|"]
    for a in ARMS:
        config = f"`examples/learning/{a.overlay}`" if a.overlay else "(evaluated as it is)"
        suite = "core" if "core" in a.tags else "ablations"
        rows.append(f"| `{a.name}` | {suite} | {config} | {a.teacher or '-'} | {a.about} |")
    return "\n".join(rows)

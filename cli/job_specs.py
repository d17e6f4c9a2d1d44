"""The options of every job, as ``JobSpec``s of its config (``cli.config_options``): the one place that says
which fields a job sets itself and which fields follow another (the flags' names are ``FLAG_NAMES``').

The commands (``cli/rollout.py`` ...) and ``agentmem config show JOB`` use the same specs, so ``config show``
prints the config the job would store.
"""

from __future__ import annotations

from typing import Annotated

import typer

from agentmem.config import (
    DistillConfig,
    EvalConfig,
    MemoriesConfig,
    RolloutConfig,
    ScoreConfig,
    ServeConfig,
    SftConfig,
    TrainConfig,
)
from cli.config_options import CommandLineError, JobSpec
from cli.options import EnvName, GenDType

LevelOption = Annotated[int | None, typer.Option(
    min=0, max=4, help="Synthetic task ladder level: 0 (one fact in one short chunk) .. 4 (three hops among "
    "distractors over about 9 chunks at --chunk-tokens 128); sets the context_tokens, hops and distractors knobs "
    "(an explicit --knob wins). Synthetic only.", show_default=False, rich_help_panel="Config options")]


def _with_level(section: str):
    """``prepare`` of a job with an environment: ``--level`` folded into the section's ``env_knobs``; a
    ``dtype`` of ``auto`` (measured later by the command) validates as float32."""

    def prepare(data: dict, given: set[str], extras: dict) -> None:
        rollout = data.setdefault(section, {}) if section else data
        if rollout.get("dtype") == "auto":
            rollout["dtype"] = "float32"
        rollout["env_knobs"] = with_level(rollout.get("env", "synthetic"), rollout.get("env_knobs") or {},
                                          extras.get("level"))

    return prepare


def with_level(env: str, knobs: dict, level: int | None) -> dict:
    """The environment knobs ``knobs`` plus ``--level`` (the synthetic ladder)."""
    if level is None:
        return knobs
    if env != "synthetic":
        raise CommandLineError(f"--level is the synthetic task ladder; environment {env!r} has no levels")
    if "level" in knobs and knobs["level"] != level:
        raise CommandLineError(f"--level {level} and --knob level={knobs['level']} disagree: give one")
    return {"level": level, **knobs}


def _train_prepare(data: dict, given: set[str], extras: dict) -> None:
    # the recipe's default knobs are the synthetic task's: another environment starts from none
    if "rollout.env_knobs" not in given and data["rollout"].get("env", "synthetic") != "synthetic":
        data["rollout"]["env_knobs"] = {}
    _with_level("rollout")(data, given, extras)


_LEVEL = {"level": (LevelOption, None)}
# The flags `--help` shows per job (`--help-all` shows every one): the few a first run sets.
_ALWAYS = ("--config", "--resume", "--device", "--db", "--help", "--help-all")
_ENV = ("--level", "--env", "--data", "--knob", "--episodes", "--seed", "--memory", "--memory-option")

ROLLOUT = JobSpec(RolloutConfig, panels=("agent",), types={"env": EnvName, "dtype": GenDType},
                  ties={"agent.seed": "seed"}, extras=_LEVEL, prepare=_with_level(""),
                  common=frozenset((*_ALWAYS, *_ENV, "--workers", "--model", "--policy", "--group-size",
                                    "--sample-temperature", "--chunk-tokens", "--memory-tokens", "--dtype",
                                    "--replay-from")))
EVAL = JobSpec(EvalConfig, panels=("agent",), types={"env": EnvName, "dtype": GenDType},
               ties={"agent.seed": "seed"}, extras=_LEVEL, prepare=_with_level(""),
               common=frozenset((*_ALWAYS, *_ENV, "--model", "--docs", "--sweep", "--plot", "--chunk-tokens",
                                 "--memory-tokens", "--dtype")))
SCORE = JobSpec(ScoreConfig)
DISTILL = JobSpec(DistillConfig,
                  common=frozenset((*_ALWAYS, "--run", "--student", "--teacher", "--teacher-context", "--loss",
                                    "--rl", "--kinds", "--steps", "--lr", "--invocations-per-step", "--out",
                                    "--report-to")))
SFT = JobSpec(SftConfig, common=frozenset((*_ALWAYS, "--run", "--student", "--kinds", "--min-f1", "--steps", "--lr",
                                           "--invocations-per-step", "--lora-rank", "--out", "--keep-last",
                                           "--train-dtype", "--report-to")))
TRAIN = JobSpec(
    TrainConfig, parts={"rollout": "", "distill": "", "warm_start": "warm-start-"},
    panels=("distill", "rollout", "rollout.agent", "warm_start"), types={"env": EnvName},
    common=frozenset((*_ALWAYS, *_ENV, "--rounds", "--student", "--teacher", "--group-size", "--steps",
                      "--lr", "--out", "--warm-start-run", "--warm-start-steps")),
    # each round sets its rollout's model and seeds, and its distill's run ids, seed and schedule position; the
    # warm start trains the student under its own prompt (never the privileged one)
    set_by_job=frozenset({"rollout.model", "rollout.seed", "rollout.agent.seed", "distill.run_ids", "distill.seed",
                          "distill.optim.schedule_offset", "distill.optim.schedule_steps", "warm_start.context"}),
    ties={"warm_start.out": "distill.out", "warm_start.seed": "seed",
          "warm_start.mixed_precision": "distill.mixed_precision",
          "warm_start.batch.invocations_per_step": "distill.batch.invocations_per_step"},
    extras=_LEVEL, prepare=_train_prepare)

SERVE = JobSpec(ServeConfig, common=frozenset(("--config", "--model", "--backend", "--run-name", "--upstream",
                                                "--chat-template", "--db", "--host", "--port", "--api-key",
                                                "--device", "--help", "--help-all")))
MEMORIES = JobSpec(MemoriesConfig)  # `agentmem memories build`

JOBS = {"rollout": ROLLOUT, "eval": EVAL, "score": SCORE, "distill": DISTILL, "sft": SFT, "train": TRAIN,
        "serve": SERVE}

"""Help that fits a screen (``cli.command``): a job's ``--help`` shows its common flags and ``--help-all`` every
one, each name whole; switches carry no type and values read as a user writes them; help is plain text (no
markup eats ``[tensorboard]``) with no config field name; a teacher's temperature and context and a training
job's dtype have their own flags (the old names still parse, unlisted); the commands come in the order of the
workflow."""

from __future__ import annotations

import re

import pytest
import yaml
from helpers import run_main

from cli.command import WORKFLOW
from cli.job_specs import JOBS

OTHER = ["worker", "replay-audit", "serve", "runs", "sql", "view", "report", "export", "models prepare",
         "memories build", "config show train", "config schema", "db upgrade", "show episode"]


def agentmem(capsys, monkeypatch, *args: str, columns: int = 80) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``agentmem ARGS`` in a terminal ``columns`` wide."""
    monkeypatch.setenv("COLUMNS", str(columns))
    return run_main(capsys, monkeypatch, *args)


def flags(text: str) -> list[str]:
    """The option names a help text lists (the first word of each option row)."""
    return re.findall(r"^  (--[\w.-]+)", text, flags=re.M)


def test_train_help_fits_a_screen_and_help_all_lists_every_option_whole(capsys, monkeypatch):
    code, short, _ = agentmem(capsys, monkeypatch, "train", "--help")
    assert code == 0 and len(short.splitlines()) <= 80, len(short.splitlines())
    assert "more options: agentmem train --help-all, or as a config file: agentmem config show train" in " ".join(
        short.split())
    code, full, _ = agentmem(capsys, monkeypatch, "train", "--help-all")
    assert code == 0 and "--warm-start-invocations-per-step INTEGER" in full
    assert set(flags(short)) < set(flags(full))


@pytest.mark.parametrize("job", list(JOBS))
def test_help_all_lists_each_option_by_its_first_name(capsys, monkeypatch, job):
    code, text, _ = agentmem(capsys, monkeypatch, job, "--help-all")
    assert code == 0
    listed = flags(text)
    assert all(o.flags[0].split("/")[0] in listed for o in JOBS[job].options())
    assert "…" not in text


@pytest.mark.parametrize("command", [*JOBS, *OTHER, ""])
def test_types_read_as_written_and_switches_take_no_value(capsys, monkeypatch, command):
    code, text, _ = agentmem(capsys, monkeypatch, *command.split(), "--help-all" if command in JOBS else "--help")
    assert code == 0
    assert not re.search(r"<(str|int|float|bool|list|path)", text), text
    assert "BOOLEAN" not in text
    assert "hub name" not in text  # nothing is downloaded
    for row in re.findall(r"^  (--[\w.-]+(?: / --[\w.-]+)?)(?: (\S+))?", text, flags=re.M):
        name, value = row
        if name in ("--help", "--help-all", "--debug") or " / --no-" in name:
            assert value == "" or not value.isupper(), row  # a switch: no value follows its name


def test_markup_is_not_eaten_and_required_is_marked(capsys, monkeypatch):
    _, text, _ = agentmem(capsys, monkeypatch, "sft", "--help-all", columns=200)
    assert "pip install 'agentmem[tensorboard]'" in text
    assert "[required]" in text.split("\n  --run TEXT,...")[1].split("\n  --")[0], text
    _, rollout, _ = agentmem(capsys, monkeypatch, "rollout", "--help", columns=200)
    assert "--write / --no-write" in agentmem(capsys, monkeypatch, "sql", "--help")[1]
    assert "hub" not in rollout and "minutes of wall time" not in rollout


def test_help_names_flags_not_config_fields(capsys, monkeypatch):
    fields = {part for spec in JOBS.values() for path in spec.fields() for part in path.split(".") if "_" in part}
    for job in JOBS:
        _, text, _ = agentmem(capsys, monkeypatch, job, "--help-all", columns=200)
        leaked = sorted(f for f in fields if re.search(rf"(?<![\w-]){f}(?![\w-])", text))
        assert leaked == [], (job, leaked)


def test_a_teacher_temperature_and_context_have_their_own_flags(capsys, monkeypatch):
    for job in ("score", "distill", "train"):
        _, text, _ = agentmem(capsys, monkeypatch, job, "--help-all")
        assert {"--kd-temperature", "--teacher-context"} <= set(flags(text)), job
        assert "--temperature" not in flags(text), job
    # the old names are gone, not hidden
    code, _, err = agentmem(capsys, monkeypatch, "config", "show", "distill", "--run", "r", "--temperature", "2")
    assert code == 2 and "No such option: --temperature" in err
    # one name, one field: train's --sample-temperature is its rollout's, as in rollout
    code, out, err = agentmem(capsys, monkeypatch, "config", "show", "train", "--sample-temperature", "0.5",
                              "--context", "hint", "--teacher-context", "persistent")
    train = yaml.safe_load(out)
    assert code == 0, err
    assert (train["rollout"]["agent"]["temperature"], train["distill"]["loss"]["temperature"]) == (0.5, 1.0)
    assert (train["rollout"]["context"], train["distill"]["teacher"]["context"]) == ("hint", "persistent")
    code, out, _ = agentmem(capsys, monkeypatch, "config", "show", "score", "--run", "r", "--kd-temperature", "3",
                            "--teacher-context", "privileged")
    assert code == 0 and "\ntemperature: 3.0\n" in out and "\ncontext: privileged\n" in out
    _, rollout, _ = agentmem(capsys, monkeypatch, "rollout", "--help-all")
    assert {"--sample-temperature", "--context", "--dtype"} <= set(flags(rollout))
    # a training job's weights dtype is its own flag (`rollout --dtype` also takes auto)
    for job in ("sft", "distill"):
        _, text, _ = agentmem(capsys, monkeypatch, job, "--help-all")
        assert "--train-dtype" in flags(text) and "--dtype" not in flags(text), job
    code, out, _ = agentmem(capsys, monkeypatch, "config", "show", "sft", "--run", "r", "--train-dtype", "bfloat16")
    assert code == 0 and "\ndtype: bfloat16\n" in out


def test_commands_are_listed_in_the_order_of_the_workflow(capsys, monkeypatch):
    code, text, _ = agentmem(capsys, monkeypatch, "--help")
    listed = re.findall(r"^  ([a-z-]+)  ", text.split("Commands:")[1], flags=re.M)
    assert code == 0 and listed == [c for c in WORKFLOW if c in listed]
    assert listed[:6] == ["rollout", "eval", "sft", "score", "distill", "train"]
    assert "--debug" in text and "<bool>" not in text


def _commands() -> list[str]:
    """Every command and group under ``agentmem`` (``""`` is the top), as the words that name it."""
    from typer.main import get_command

    from cli.app import app

    def walk(group, prefix: tuple[str, ...]):
        yield " ".join(prefix)
        for name, command in group.commands.items():
            if getattr(command, "commands", None):
                yield from walk(command, (*prefix, name))
            else:
                yield " ".join((*prefix, name))

    return list(walk(get_command(app), ()))


@pytest.mark.parametrize("command", _commands())
def test_every_help_fits_80_lines_at_80_columns(capsys, monkeypatch, command):
    code, text, _ = agentmem(capsys, monkeypatch, *command.split(), "--help")
    lines = text.splitlines()
    assert code == 0 and len(lines) <= 80, (command, len(lines))
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    assert "..." not in text.split("Commands:")[-1] if "Commands:" in text else True  # no cut descriptions
    if command in JOBS:
        code, full, _ = agentmem(capsys, monkeypatch, *command.split(), "--help-all")
        assert code == 0 and max(len(line) for line in full.splitlines()) <= 80, command


def test_a_long_choice_list_is_named_and_listed_in_its_help(capsys, monkeypatch):
    _, text, _ = agentmem(capsys, monkeypatch, "rollout", "--help")
    assert "  --env ENV " in text and "[synthetic|" not in text
    assert "(one of: synthetic, hotpotqa, squad, locomo, longmemeval, ruler_hotpotqa, needle, musique, " \
           "2wikimultihopqa, quality)" in " ".join(text.split())
    assert "  --policy [model|oracle] " in text  # a short list stays in place


def test_help_shows_each_option_s_first_clause_and_help_all_the_whole(capsys, monkeypatch):
    _, short, _ = agentmem(capsys, monkeypatch, "rollout", "--help", columns=200)
    _, full, _ = agentmem(capsys, monkeypatch, "rollout", "--help-all", columns=200)
    row = next(line for line in short.splitlines() if line.startswith("  --workers "))
    assert row.split("INTEGER", 1)[1].strip() == "Local worker processes  [default: 1; x>=1]"
    assert "Local worker processes: 1 does the calls in this process;" in full
    knob = next(line for line in short.splitlines() if line.startswith("  --knob "))
    assert knob.endswith("Environment knob KEY=VALUE, e.g. hops=3, context_tokens=4096, docs=20")


def test_first_clause():
    from cli.command import first_clause, summary

    assert first_clause("ReOPD: branch from run RUN_ID instead of an environment: per episode one step.") == \
        "ReOPD: branch from run RUN_ID instead of an environment"
    assert first_clause("A file (YAML; or TOML). Flags override it.") == "A file (YAML; or TOML)"
    assert first_clause("Knob KEY=VALUE, e.g. hops=3. More.") == "Knob KEY=VALUE, e.g. hops=3"
    assert summary("Serve a model through the OpenAI API (`/v1/chat`, ...). Every call stored.\n\nMore.") == \
        "Serve a model through the OpenAI API (`/v1/chat`, ...)"

"""The job configs are the one source of every option: each config field has an option whose
default is the config's, ``--config FILE`` sets any field with flags over it, ``agentmem config show`` prints
what a job stores, ``examples/`` files load, and a stored run's config runs again to the same config."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from agentmem.config import DistillConfig, RolloutConfig, ScoreConfig, TrainConfig
from agentmem.records import Run, RunKind
from cli.app import app
from cli.job_specs import JOBS
from store import repository as repo
from store.engine import open_store

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {"rollout": "rollout", "eval": "eval", "score": "score", "distill": "distill", "sft": "sft",
            "train": "train", "serve": "serve"}


def show(*args: str) -> dict:
    result = CliRunner().invoke(app, ["config", "show", *args])
    assert result.exit_code == 0, (result.output, result.exception)
    return yaml.safe_load(result.output)


def _plain(value):
    return value.value if hasattr(value, "value") and not isinstance(value, (int, float, str)) else value


@pytest.mark.parametrize("job", sorted(JOBS))
def test_every_config_field_has_an_option_with_the_config_default(job):
    """A field without an option, or an option whose default differs from its field's, fails here."""
    spec = JOBS[job]
    command = typer.main.get_command(app).commands[COMMANDS[job]]
    params = {p.name: p for p in command.params}
    fields = spec.fields()
    assert set(fields) - spec.set_by_job == {o.path for o in spec.options()}
    for option in spec.options():
        param = params[option.param]
        default = fields[option.path]
        if isinstance(default, (list, dict)):  # shown, not passed: an absent flag leaves the field alone
            assert param.default is None, option.path
            continue
        if default is None or default.__class__.__name__ == "PydanticUndefinedType":
            assert param.default is None, option.path
            continue
        assert _plain(param.default) == _plain(default), (option.path, param.default, default)
    assert {"config_file", "db"} <= set(params)


@pytest.mark.parametrize("job", sorted(JOBS))
def test_no_flags_is_the_configs_own_default(job):
    runs = ["--run", "r"] if job in ("score", "distill", "sft") else []
    expected = JOBS[job].model.model_validate({"run_ids": ["r"]} if runs else {})
    assert show(job, *runs) == expected.model_dump(mode="json")


def test_the_memory_budget_default_is_one_number():
    """AgentConfig's memory budget and the rollout and eval options agree (they were 256 and 128)."""
    assert show("rollout")["agent"]["memory_tokens"] == 128
    assert show("eval")["agent"]["memory_tokens"] == 128


def test_a_file_sets_nested_fields_and_only_given_flags_override_it(tmp_path):
    file = tmp_path / "exp.yaml"
    file.write_text("rollout:\n  episodes: 3\n  agent: {memory_tokens: 20}\ndistill:\n  optim: {lr: 2.0e-5, steps: 5}\n"
                    "rounds: 4\n")
    config = show("train", "--config", str(file), "--steps", "2", "--memory-tokens", "48")
    recipe = TrainConfig().model_dump(mode="json")
    # --steps 2 and --memory-tokens 48 are the defaults, given: they beat the file
    assert (config["rounds"], config["distill"]["optim"]["steps"], config["distill"]["optim"]["lr"]) == (4, 2, 2e-5)
    assert config["rollout"]["episodes"] == 3 and config["rollout"]["agent"]["memory_tokens"] == 48
    # what neither sets keeps the recipe's section defaults, not the bare models'
    assert config["rollout"]["group_size"] == recipe["rollout"]["group_size"] == 4
    assert config["rollout"]["env_knobs"] == recipe["rollout"]["env_knobs"]
    assert config["distill"]["batch"]["oversize"] == "skip"
    toml = tmp_path / "exp.toml"
    toml.write_text('rounds = 3\n[distill.optim]\nlr = 3e-6\n[rollout.agent]\nmemory_tokens = 30\n')
    config = show("train", "--config", str(toml))
    assert (config["rounds"], config["distill"]["optim"]["lr"], config["rollout"]["agent"]["memory_tokens"]) == (
        3, 3e-6, 30)


def test_distill_files_take_their_fields_in_sections(tmp_path):
    """A distill section (of distill or train) is read nested; a field of a section given at the top level, or
    any unknown key, names the file, the key path and its line, and the closest key."""
    nested = tmp_path / "nested.yaml"
    nested.write_text("run_ids: [r]\nteacher: {model: t1, context: privileged}\noptim:\n  lr: 2.0e-5\n")
    config = show("distill", "--config", str(nested))
    assert (config["teacher"]["model"], config["teacher"]["context"], config["optim"]["lr"]) == ("t1", "privileged",
                                                                                                 2e-5)
    assert show("distill", "--config", str(nested), "--lr", "1e-4")["optim"]["lr"] == 1e-4  # a flag beats the file
    train = tmp_path / "train.yaml"
    train.write_text("distill:\n  teacher: {model: t2}\n  loss: {kd_weight: 0.5}\n")
    config = show("train", "--config", str(train))
    assert (config["distill"]["teacher"]["model"], config["distill"]["loss"]["kd_weight"]) == ("t2", 0.5)
    for text, needle in [
        ("run_ids: [r]\noptim:\n  lr: 1.0e-5\n  warmup_stepz: 1\n",
         "bad.yaml, line 4: unknown key optim.warmup_stepz (did you mean optim.warmup_steps?)"),
        ("run_ids: [r]\nlr: 1.0e-5\n", "bad.yaml, line 2: unknown key lr"),
        ("run_ids: [r]\nteacher: t1\n", "bad.yaml, line 2: teacher: Input should be a valid dictionary"),
        ("run_ids: [r]\noptim:\n  lr: -1\n", "bad.yaml, line 3: optim.lr: Input should be greater than 0"),
    ]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        result = CliRunner().invoke(app, ["config", "show", "distill", "--config", str(bad)])
        assert needle in " ".join(str(result.exception).split()), (text, result.exception)


def test_a_stored_distill_run_exports_in_sections(tmp_path):
    """`config show --run` of a distill run prints its sections, which run again."""
    db = f"sqlite:///{tmp_path / 'd.db'}"
    store = open_store(db, create=True)
    stored = DistillConfig(run_ids=["r"], student="s", teacher=dict(model="t", context="privileged"),
                           loss=dict(divergence="forward_kl"), rl=dict(kind="none"), optim=dict(lr=3e-6, steps=4),
                           batch=dict(invocations_per_step=2)).model_dump(mode="json")
    run = Run(kind=RunKind.distill, config=stored)
    with store.session() as s:
        repo.start_run(s, run)
        s.commit()
    result = CliRunner().invoke(app, ["config", "show", "--run", run.id, "--db", db])
    assert result.exit_code == 0, result.output
    exported = yaml.safe_load(result.output)
    assert exported == stored
    file = tmp_path / "again.yaml"
    file.write_text(result.output)
    assert show("distill", "--config", str(file)) == exported


def test_show_prints_the_config_the_job_stores(tmp_path):
    config = show("rollout", "--episodes", "2", "--memory", "log", "--memory-option", "x=1", "--knob", "hops=2",
                  "--seed", "7", "--level", "1")
    expected = RolloutConfig(episodes=2, seed=7, env_knobs={"level": 1, "hops": 2},
                             agent={"memory_policy": "log", "memory_options": {"x": 1}, "seed": 7})
    assert config == expected.model_dump(mode="json")
    assert show("distill", "--run", "a,b", "--teacher", "none", "--kinds", "update", "--rl-weight", "1") == \
        DistillConfig(run_ids=["a", "b"], kinds=["memory_update"], teacher=dict(model=None)).model_dump(mode="json")
    assert show("score", "--run", "a", "--kinds", "answer")["kinds"] == ["answer"]
    train = show("train", "--warm-start-run", "o1", "--out", "ck", "--seed", "3", "--env", "hotpotqa")
    assert train["warm_start"]["run_ids"] == ["o1"] and train["warm_start"]["optim"]["steps"] == 16
    assert (train["warm_start"]["out"], train["warm_start"]["seed"]) == ("ck", 3)  # follow the loop's
    assert train["rollout"]["env_knobs"] == {}  # the recipe's knobs are the synthetic task's


def test_bad_files_and_values_are_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("episodes: 2\nagent: {memory_tokenz: 3}\n")
    for args, needle in [(["rollout", "--config", str(bad)], "memory_tokenz"),
                         (["rollout", "--config", str(tmp_path / "none.yaml")], "no such file"),
                         (["distill", "--run", "r", "--knob", "x"], "No such option")]:
        result = CliRunner().invoke(app, ["config", "show", *args])
        assert result.exit_code != 0 and (needle in result.output or needle in str(result.exception)), result.output


def test_a_file_extends_another_and_its_keys_override_key_by_key(tmp_path):
    (tmp_path / "base.yaml").write_text("rounds: 3\nrollout:\n  episodes: 4\n  group_size: 8\n"
                                        "distill:\n  optim: {lr: 2.0e-05, steps: 2}\n")
    (tmp_path / "arms").mkdir()
    arm = tmp_path / "arms" / "arm.yaml"
    arm.write_text("extends: ../base.yaml\nrollout: {group_size: 2}\ndistill: {optim: {lr: 1.0e-05}}\n")
    train = show("train", "--config", str(arm))
    assert (train["rounds"], train["rollout"]["episodes"], train["rollout"]["group_size"]) == (3, 4, 2)
    assert train["distill"]["optim"]["lr"] == 1e-5 and train["distill"]["optim"]["steps"] == 2
    (tmp_path / "base.yaml").write_text("rounds: 3\nrollout:\n  episodez: 4\n")  # a bad key of the base ...
    result = CliRunner().invoke(app, ["config", "show", "train", "--config", str(arm)])
    assert f"{tmp_path / 'arms' / '../base.yaml'}, line 3: unknown key rollout.episodez" in str(result.exception)
    for text, needle in [("extends: nothere.yaml\n", "extends nothere.yaml, which is no file"),
                         ("extends: arm.yaml\n", "makes a cycle"), ("extends: [a]\n", "extends names a file")]:
        arm.write_text(text)
        result = CliRunner().invoke(app, ["config", "show", "train", "--config", str(arm)])
        assert needle in str(result.exception) and f"{arm}, line 1" in str(result.exception), result.exception


def test_schema_has_every_field_with_its_description():
    result = CliRunner().invoke(app, ["config", "schema", "distill"])
    schema = json.loads(result.output)
    assert set(schema["properties"]) == set(DistillConfig.model_fields)
    assert schema["properties"]["optim"]["properties"]["lr"]["description"] == "Peak AdamW learning rate."
    assert "Section" not in json.dumps(schema)  # no class names: every section written out in place


EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_file_loads(path):
    """Each example names its job on its first line (``# ... agentmem JOB --config examples/NAME``)."""
    job = re.search(r"agentmem (\w+) --config", path.read_text().splitlines()[0]).group(1)
    config = show(job, "--config", str(path))
    data = yaml.safe_load(path.read_text())
    assert _subset(data, config), (data, config)


def test_the_examples_are_the_four_of_the_docs():
    assert {p.name for p in EXAMPLES} == {"quick_start.yaml", "learning_recipe.yaml", "psd_distill.yaml",
                                          "postgres_workers.yaml"}
    docs = (ROOT / "README.md").read_text() + "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    for path in EXAMPLES:
        assert f"examples/{path.name}" in docs, path.name


def _subset(small, big) -> bool:
    if isinstance(small, dict):
        return all(k in big and _subset(v, big[k]) for k, v in small.items())
    return small == big


def test_a_stored_run_from_before_exports_through_its_model(tmp_path):
    """A score run stores its teacher's path beside the config; an old one its ``truncate`` name: the export
    reads both through ScoreConfig, and the file runs again."""
    db = f"sqlite:///{tmp_path / 's.db'}"
    store = open_store(db, create=True)
    old = ScoreConfig(run_ids=["r"]).model_dump(mode="json")
    old["truncate"] = old.pop("teacher_truncation")
    run = Run(kind=RunKind.score, config={**old, "teacher_name": "/models/t"})
    with store.session() as s:
        repo.start_run(s, run)
        s.commit()
    result = CliRunner().invoke(app, ["config", "show", "--run", run.id[:8], "--db", db])
    assert result.exit_code == 0, result.output
    exported = yaml.safe_load(result.output)
    assert exported == ScoreConfig(run_ids=["r"]).model_dump(mode="json")
    file = tmp_path / "again.yaml"
    file.write_text(result.output)
    assert show("score", "--config", str(file)) == exported


ENV = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1"}


def am(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.app", *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=300)


def _stored(db: str, run_id: str) -> dict:
    with open_store(db).session() as s:
        return repo.get_run(s, run_id).config


def test_a_stored_run_runs_again_from_its_exported_file(tmp_path):
    """rollout, score, distill, sft and eval on a tiny model: each run's exported config, run again with
    --config alone, stores the same config (the first runs were made from flags, the rollout and the distill
    from examples/ files with flags over them)."""
    from agentmem.testing.tiny_models import save_tiny

    model = save_tiny(tmp_path / "tiny")
    db = f"sqlite:///{tmp_path / 'a.db'}"
    small = ["--chunk-tokens", "48", "--memory-tokens", "6", "--answer-tokens", "3", "--knob", "context_tokens=100"]
    first = am("rollout", "--config", "examples/quick_start.yaml", "--model", model, "--episodes", "1", *small,
               "--seed", "4", "--context", "privileged", "--device", "cpu", "--db", db)
    assert first.returncode == 0, first.stderr
    run_id = first.stdout.split("run_id=")[1].split()[0]
    out = str(tmp_path / "ck")
    jobs = {"rollout": run_id}
    for job, args in [
        ("score", ["--run", run_id, "--teacher", model, "--kinds", "answer"]),
        ("distill", ["--config", "examples/psd_distill.yaml", "--run", run_id, "--student", model, "--teacher",
                     model, "--steps", "1", "--invocations-per-step", "2", "--out", out]),
        ("sft", ["--run", run_id, "--student", model, "--steps", "1", "--invocations-per-step", "2", "--out", out]),
        ("eval", ["--model", model, "--episodes", "1", *small]),
    ]:
        done = am(job, *args, "--device", "cpu", "--db", db)
        assert done.returncode == 0, (job, done.stderr)
        jobs[job] = done.stdout.split("run_id=")[1].split()[0]
    distilled = _stored(db, jobs["distill"])
    assert distilled["teacher"]["psd"] == "off_policy" and distilled["run_ids"] == [run_id]
    assert _stored(db, run_id)["episodes"] == 1 and _stored(db, run_id)["context"] == "privileged"
    for job, rid in jobs.items():
        exported = am("config", "show", "--run", rid, "--db", db)
        assert exported.returncode == 0, exported.stderr
        file = tmp_path / f"{job}.yaml"
        file.write_text(exported.stdout)
        again = am(job, "--config", str(file), "--device", "cpu", "--db", db)
        assert again.returncode == 0, (job, again.stderr)
        again_id = again.stdout.split("run_id=")[1].split()[0]
        assert again_id != rid and _stored(db, again_id) == _stored(db, rid), job


def test_a_stored_train_config_exports_and_loads_again(tmp_path):
    """A train run's stored config (with a warm start) exports to a file that builds the same config."""
    db = f"sqlite:///{tmp_path / 't.db'}"
    store = open_store(db, create=True)
    config = TrainConfig(rounds=3, warm_start={"run_ids": ["o1"], "optim": {"steps": 4}}, distill={"optim": {"lr": 3e-6}})
    run = Run(kind=RunKind.train, config=config.model_dump(mode="json"))
    with store.session() as s:
        repo.start_run(s, run)
        s.commit()
    result = CliRunner().invoke(app, ["config", "show", "--run", run.id, "--db", db])
    assert result.exit_code == 0, result.output
    file = tmp_path / "train.yaml"
    file.write_text(result.output)
    assert show("train", "--config", str(file)) == run.config
    assert show("train", "--config", str(file), "--rounds", "5")["rounds"] == 5


def test_train_runs_from_the_recipe_file_and_again_from_its_exported_config(tmp_path):
    """`train --config examples/learning_recipe.yaml` with flags over it runs (warm start, rollout, distill) on
    a tiny model; its stored config, exported and run again with --config alone, stores the same config."""
    from agentmem.testing.tiny_models import save_tiny

    model = save_tiny(tmp_path / "tiny")
    db = f"sqlite:///{tmp_path / 'a.db'}"
    small = ["--chunk-tokens", "48", "--memory-tokens", "6", "--answer-tokens", "3", "--knob", "context_tokens=100"]
    oracle = am("rollout", "--policy", "oracle", "--model", model, "--episodes", "2", *small, "--device", "cpu",
                "--db", db)
    assert oracle.returncode == 0, oracle.stderr
    oracle_run = oracle.stdout.split("run_id=")[1].split()[0]
    first = am("train", "--config", "examples/learning_recipe.yaml", "--warm-start-run", oracle_run,
               "--warm-start-steps", "1", "--student", model, "--teacher", model, "--rounds", "1",
               "--steps", "1", "--invocations-per-step", "2", "--episodes", "1", "--group-size", "2",
               *small, "--teacher-check-episodes", "0", "--out", str(tmp_path / "ck"), "--device", "cpu",
               "--db", db)
    assert first.returncode == 0, first.stderr
    train_id = first.stdout.split("train_run_id=")[1].split()[0]
    stored = _stored(db, train_id)
    assert stored["warm_start"]["run_ids"] == [oracle_run] and stored["distill"]["teacher"]["context"] == "privileged"
    assert stored["rollout"]["agent"]["memory_tokens"] == 6 and stored["rounds"] == 1
    exported = am("config", "show", "--run", train_id, "--db", db)
    assert exported.returncode == 0, exported.stderr
    file = tmp_path / "train.yaml"
    file.write_text(exported.stdout)
    again = am("train", "--config", str(file), "--device", "cpu", "--db", db)
    assert again.returncode == 0, again.stderr
    again_id = again.stdout.split("train_run_id=")[1].split()[0]
    assert again_id != train_id and _stored(db, again_id) == stored


def _commands(command, words=()):
    """(words, command) of every command under ``command`` (``config show train``: ("config", "show", "train"))."""
    subs = getattr(command, "commands", None)
    if subs is None:
        yield words, command
        return
    for name, sub in subs.items():
        yield from _commands(sub, (*words, name))


def test_a_flag_names_one_field_in_every_command():
    """Walk every command's config flags: a flag sets one field wherever it is given (the field's place in its
    job's config, train's rollout and distill parts as in rollout's and distill's, and its type), unless
    ``FLAG_NAMES`` lists each of the places under that flag: one setting that two jobs keep in two places."""
    from typer.main import get_command

    from cli.app import app as root
    from cli.config_options import _PREFIX, FLAG_NAMES, _leaves, _strip_none

    fields: dict[str, dict[str, set[str]]] = {}  # flag -> field -> commands
    for words, command in _commands(get_command(root)):
        spec = JOBS.get(words[-1]) if words else None
        if spec is None:
            continue
        annotations = {path: _strip_none(info.annotation) for path, info, _, _ in
                       _leaves(spec.model, "", spec.model_defaults())}
        for param in command.params:
            if not param.name.startswith(_PREFIX):
                continue
            path = param.name[len(_PREFIX):].replace("__", ".")
            prefix, relative, qualified = spec.key(path)
            field = qualified if qualified in FLAG_NAMES else \
                f"{prefix}{relative}: {getattr(annotations[path], '__name__', annotations[path])}"
            fields.setdefault(param.opts[0], {}).setdefault(field, set()).add(" ".join(words))
    assert "--sample-temperature" in fields and "--temperature" not in fields
    two = {flag: places for flag, places in fields.items() if len(places) > 1 and not all(
        FLAG_NAMES.get(place.partition(":")[0]) == flag for place in places)}
    assert two == {}


def test_the_flag_table_in_the_docs_is_flag_names():
    from cli.config_options import FLAG_NAMES

    text = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text().split("\n## Flags\n")[1]
    rows = re.findall(r"^\| `(--[\w-]+)` \| (.*) \|$", text, flags=re.M)
    assert {(key, flag) for flag, keys in rows for key in re.findall(r"`([\w.]+)`", keys)} == {
        (key, flag) for key, flag in FLAG_NAMES.items()}


# A command's own option whose flag is also a config flag: the same setting, never a default of its own.
OWN_FLAGS = {"--run": "the run(s) a command reads, as a job's run ids",
             "--batch": "worker: the run's agent.max_batch, for this worker",
             "--out": "the path a command writes (report, export: a file; a training job: its checkpoints)"}


def test_no_command_restates_a_config_field_or_its_default():
    """An option of a command's own that takes a config flag is the same setting (``OWN_FLAGS``) and has no
    default of its own: every default lives in the config class."""
    from typer.main import get_command

    from cli.app import app as root
    from cli.config_options import _PREFIX

    config_flags = {option.flags[0].split("/")[0] for spec in JOBS.values() for option in spec.options()}
    own = {}
    for words, command in _commands(get_command(root)):
        for param in command.params:
            if param.name.startswith(_PREFIX) or not getattr(param, "opts", None):
                continue
            for flag in param.opts:
                if flag in config_flags:
                    own[(" ".join(words), flag)] = param.default
    assert {flag for _, flag in own} <= set(OWN_FLAGS), own
    assert {key: default for key, default in own.items() if default is not None and key[1] != "--out"} == {}

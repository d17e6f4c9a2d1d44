"""Every name the docs give exists: each repository path in backticks (``agentmem/replay/pack.py``), each test
written ``path::name`` (a ``def name`` in that file), each ``python -m bench.NAME``, each ``agentmem`` command, each ``--flag`` written after an ``agentmem`` command (in that
command's options: what ``--help-all`` lists) and each dotted config key (``optim.lr``) of a job's config.

The docs are README.md, CONTRIBUTING.md, tests/README.md and docs/*.md (not CHANGELOG.md: history names what
was). A path resolves from the repository root or from its doc's folder. A flag named alone (`--smoke`) is an
option of some ``agentmem`` command or of a benchmark, script or example. The command tree is read in-process
from the typer app, so the whole check takes about a second.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pydantic

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "CONTRIBUTING.md", "tests/README.md",
        *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
TOP = ("agentmem/", "cli/", "envs/", "store/", "tests/", "bench/", "docs/", "examples/", "scripts/", "alembic/")
SPAN = re.compile(r"`([^`\n]+)`")
PLACEHOLDER = re.compile(r"[A-Z]{2,}|<|\*|\.\.\.|\{|~|\$")


def texts(doc: str) -> tuple[list[str], list[str]]:
    """The inline code spans and the lines of fenced code blocks of ``doc``."""
    spans, code, fenced = [], [], False
    for line in (ROOT / doc).read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced:
            code.append(line)
        else:
            spans += SPAN.findall(line)
    return spans, code


@cache
def commands() -> dict[tuple[str, ...], frozenset[str]]:
    """Every command path under ``agentmem`` (groups too) and the options it takes."""
    import typer.main

    from cli.app import app

    out: dict[tuple[str, ...], frozenset[str]] = {}

    def walk(cmd, path: tuple[str, ...], inherited: frozenset[str]) -> None:
        opts = inherited | {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}
        out[path] = opts | {"--help"}
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, (*path, name), frozenset())

    walk(typer.main.get_command(app), (), frozenset())
    return out


def invocations(text: str) -> list[tuple[tuple[str, ...], list[str], str]]:
    """Each ``agentmem ...`` in ``text``: its command path (the longest that exists), the flags after it and the
    words (to report)."""
    found = []
    for match in re.finditer(r"(?:^|[\s(/])agentmem((?: +[^\s|;&#)`]+)*)", text):
        words = match.group(1).split()
        while words and words[0].startswith("--"):  # agentmem --debug COMMAND
            words = words[1:] if words[0] != "--db" else words[2:]
        path: tuple[str, ...] = ()
        for word in words:
            if (*path, word) in commands():
                path = (*path, word)
            else:
                break
        first = words[len(path)].strip("[]") if len(words) > len(path) else ""
        flags = re.findall(r"(?<![\w-])--[a-z][\w.-]*[\w]", " ".join(words[len(path):]))
        found.append((path, flags, first, match.group(0).strip()))
    return found


def other_flags() -> set[str]:
    """The flags of the benchmarks, scripts and examples (``--smoke``, ``--fast``), and of the outside tools the docs
    name."""
    found = {"--durations", "--no-deps", "--kill-on-bad-exit", "--logprobs-mode"}  # pytest, pip, srun, vllm
    for folder in ("bench", "scripts", "examples"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".sh"):
                found |= set(re.findall(r"(--[a-z][\w-]*\w)", path.read_text(encoding="utf-8")))
    return found


def test_named_flags_exist_somewhere():
    known = set().union(*commands().values()) | other_flags()
    wrong = []
    for doc in DOCS:
        spans, _ = texts(doc)
        for span in spans:
            match = re.fullmatch(r"(--[a-z][\w.-]*\w)(?:[ =].*)?", span.strip())
            if match and match.group(1) not in known:
                wrong.append(f"{doc}: no flag {match.group(1)}")
    assert wrong == []


CONFIGS = ("RolloutConfig", "EvalConfig", "ReplayConfig", "ScoreConfig", "DistillConfig", "SftConfig", "TrainConfig",
           "ServeConfig", "MemoriesConfig", "AgentConfig", "WarmStartConfig")


def config_keys(prefix_class: bool = False) -> set[str]:
    """The dotted keys of every job's config (``optim.lr``), or with ``prefix_class`` each config class's
    (``DistillConfig.optim.lr``)."""
    from agentmem import config

    keys: set[str] = set()

    def walk(model: type[pydantic.BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            keys.add(prefix + name)
            kind = field.annotation
            for sub in (kind, *getattr(kind, "__args__", ())):
                if isinstance(sub, type) and issubclass(sub, pydantic.BaseModel):
                    walk(sub, f"{prefix}{name}.")

    for name in CONFIGS:
        walk(getattr(config, name), f"{name}." if prefix_class else "")
    return keys


def test_named_paths_exist():
    missing = []
    for doc in DOCS:
        spans, code = texts(doc)
        for span in spans:
            for word in span.split():
                word = word.rstrip(".,:;)").split("::")[0].split("#")[0]
                if (word.startswith(TOP) and not PLACEHOLDER.search(word) and not (ROOT / word).exists()
                        and not (ROOT / doc).parent.joinpath(word).exists()):
                    missing.append(f"{doc}: {word}")
        for line in [*spans, *code]:
            for module in re.findall(r"python -m (bench\.[\w.]+)", line):
                if PLACEHOLDER.search(module):
                    continue
                rel = module.replace(".", "/")
                if not ((ROOT / f"{rel}.py").exists() or (ROOT / rel / "__main__.py").exists()):
                    missing.append(f"{doc}: python -m {module}")
    assert missing == []


def test_named_tests_exist():
    missing = []
    for doc in DOCS:
        spans, _ = texts(doc)
        for path, name in re.findall(r"^((?:tests|bench)/[\w/.-]+\.py)::(\w+)$", "\n".join(spans), re.M):
            if not (ROOT / path).exists() or not re.search(rf"^(?:async )?def {name}\(", (ROOT / path).read_text(
                    encoding="utf-8"), re.M):
                missing.append(f"{doc}: {path}::{name}")
    assert missing == []


def test_named_commands_and_flags_exist():
    wrong = []
    for doc in DOCS:
        spans, code = texts(doc)
        for text in [*spans, *code]:
            for path, flags, first, said in invocations(text):
                if not path and first and not PLACEHOLDER.search(first) and first not in ("COMMAND", "X"):
                    wrong.append(f"{doc}: no command 'agentmem {first}' ({said})")
                    continue
                if first and PLACEHOLDER.fullmatch(first.rstrip(".,")):  # `agentmem config show JOB --config FILE`
                    below = [opts for sub, opts in commands().items() if sub[:len(path)] == path and sub != path]
                    known = frozenset().union(*below) if below else commands()[path]
                else:
                    known = commands()[path]
                for flag in flags:
                    if flag not in known:
                        wrong.append(f"{doc}: 'agentmem {' '.join(path)}' has no {flag} ({said})")
    assert wrong == []


def test_named_config_keys_exist():
    from agentmem import config

    keys, class_keys = config_keys(), config_keys(prefix_class=True)
    sections = {k.split(".")[0] for k in keys if "." in k}
    field = re.compile(rf"^((?:{'|'.join(CONFIGS)})\.[a-z_][\w.]*)$")
    wrong = []
    for doc in DOCS:
        spans, _ = texts(doc)
        for span in spans:
            for key in re.findall(r"^([a-z_]+(?:\.[a-z_]+)+)$", span.strip()):
                if key.split(".")[0] in sections and key not in keys:
                    wrong.append(f"{doc}: no config key {key}")
            for key in field.findall(span.strip()):
                cls, _, attr = key.partition(".")
                if key not in class_keys and not callable(getattr(getattr(config, cls), attr, None)):  # a method
                    wrong.append(f"{doc}: no config field {key}")
    assert wrong == []


def test_a_wrong_command_or_flag_is_found():
    path, flags, first, _ = invocations("agentmem config show train [--bogus N] --lr 1e-5")[0]
    assert path == ("config", "show", "train") and flags == ["--bogus", "--lr"]
    assert "--lr" in commands()[path] and "--bogus" not in commands()[path]
    assert invocations("agentmem rolout --episodes 2")[0][:3] == ((), ["--episodes"], "rolout")

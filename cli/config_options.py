"""A job's typer options, generated from its pydantic config: the config is the one source of every option.

``JobSpec`` names a job's config model and the few things the model cannot say: the parts that are another
job's config (train's ``rollout``, ``distill`` and ``warm_start``), the fields the job sets itself (no option),
the fields that follow another one unless set (a rollout's sampling seed follows ``--seed``), and a ``prepare``
hook for the convenience flags that fold into a field (``--level`` into ``env_knobs``).

``job_command(spec)`` decorates a command function (its own options: ``--db``, ``--device``, ``--resume``,
...) with one option per config field and ``--config FILE``; inside, ``job_config(ctx)`` is the config:

- the field's ``description`` is the help, its Enum the choice list, its default the default shown;
- a field's flag is its name (``agent.memory_tokens`` -> ``--memory-tokens``) unless ``FLAG_NAMES``, the one
  table of other names, gives it one (``agent.temperature`` -> ``--sample-temperature``); a flag means the same
  field in every command that has it, and a field has one flag (a train's warm start: ``--warm-start-`` and the
  flag the field has in ``sft``);
- lists take repeated or comma-separated values, dicts ``KEY=VALUE`` (values parsed as JSON when they are);
- the config is the model's defaults, under the ``--config`` file (YAML or TOML; any field, sections
  nested), under the flags actually given on the command line (click's parameter source, never a
  comparison with a default).

Only this module turns a model into options; it imports no torch (``tests/cli/test_app_startup.py``).
"""

from __future__ import annotations

import contextlib
import copy
import enum
import functools
import inspect
import json
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from agentmem.errors import ConfigError
from cli.command import HelpAllOption


class CommandLineError(ConfigError):
    """The command line or its ``--config`` file is wrong: a value that fails its check, an unknown key, a
    file that does not parse. ``cli.app.main`` prints it as one line with exit code 2, as click's own usage
    errors; an error found later (files, the database, runs, models, the job itself) exits 1."""


# The one table of flag names: the flag of every config field whose flag is not ``--`` + its name. A field is
# keyed by its place in its job's config (``agent.temperature``; train's rollout and distill parts keyed as in
# rollout's and distill's configs), or by ``Config.field`` where one place names different things in two jobs'
# configs (score's ``context`` is the teacher's, rollout's the sampler's). A flag has one meaning in every command:
# two keys under one flag are one setting that two jobs keep in different places (score's ``teacher`` and distill's
# ``teacher.model``), and ``tests/cli/test_config_options.py`` fails on any flag that sets two fields not listed here.
FLAG_NAMES: dict[str, str] = {
    "run_ids": "--run",
    "env_knobs": "--knob",
    "agent.answer_max_new_tokens": "--answer-tokens",
    "agent.memory_policy": "--memory",
    "agent.memory_options": "--memory-option",
    "agent.max_batch": "--batch",
    "agent.temperature": "--sample-temperature",
    "agent.seed": "--sample-seed",
    "teacher.model": "--teacher", "ScoreConfig.teacher": "--teacher",
    "teacher.source": "--teacher-source",
    "teacher.context": "--teacher-context", "ScoreConfig.context": "--teacher-context",
    "teacher.temperature": "--teacher-temperature",
    "teacher.min_confidence": "--teacher-min-confidence",
    "teacher.truncation": "--teacher-truncation", "ScoreConfig.teacher_truncation": "--teacher-truncation",
    "loss.divergence": "--loss",
    "loss.temperature": "--kd-temperature", "ScoreConfig.temperature": "--kd-temperature",
    "loss.terms": "--loss-terms",
    "loss.anchor_weight": "--anchor-weight", "SftConfig.anchor_weight": "--anchor-weight",
    "loss.weighting": "--weighting", "SftConfig.weighting": "--weighting",
    "rl.kind": "--rl",
    "batch.path": "--attention", "ScoreConfig.path": "--attention",
    "batch.row_tokens": "--row-tokens", "ScoreConfig.row_tokens": "--row-tokens",
    "batch.packing": "--packing", "ScoreConfig.packing": "--packing",
    "DistillConfig.dtype": "--train-dtype", "SftConfig.dtype": "--train-dtype",
    "ServeConfig.max_batch": "--batch", "MemoriesConfig.batch": "--batch",
    "MemoriesConfig.run": "--run",
}
CONFIG_FILE = "config_file"
_PREFIX = "cfg__"
# click's ParameterSource names (typer may carry its own click, so the names, not the class)
_GIVEN = ("COMMANDLINE", "ENVIRONMENT", "PROMPT")


@contextlib.contextmanager
def usage_error(*kinds: type[Exception]) -> Iterator[None]:
    """Inside: a ``ConfigError`` (a value that fails a library's check), or one of ``kinds``, is the command
    line's: re-raised as a ``CommandLineError`` (exit 2)."""
    try:
        yield
    except CommandLineError:
        raise
    except (ConfigError, *kinds) as exc:
        raise CommandLineError(str(exc)) from exc


def flag_of(path: str) -> str:
    """The flag of the config field at dotted ``path`` (or of its longest tail the table names), for one-line
    error messages."""
    parts = path.split(".")
    for start in range(len(parts)):
        if ".".join(parts[start:]) in FLAG_NAMES:
            return FLAG_NAMES[".".join(parts[start:])]
    return f"--{parts[-1].replace('_', '-')}"


def _base(model: type[BaseModel], name: str) -> type[BaseModel]:
    """The first class of ``model``'s bases that has field ``name`` (``EvalConfig.seed``: ``RolloutConfig``)."""
    for cls in reversed(model.__mro__):
        if isinstance(cls, type) and issubclass(cls, BaseModel) and name in getattr(cls, "model_fields", {}):
            return cls
    return model


@dataclass(frozen=True)
class JobSpec:
    """What the options of one job's config need beside the model itself (see the module docstring)."""

    model: type[BaseModel]
    # a part of the config that is another job's config (train's ``rollout``, ``distill``, ``warm_start``) -> the
    # prefix of its flags: its fields are keyed in ``FLAG_NAMES`` as in that job's config
    parts: Mapping[str, str] = field(default_factory=dict)
    panels: tuple[str, ...] = ()  # the sections whose options `--help` shows under their own heading
    set_by_job: frozenset[str] = frozenset()
    types: Mapping[str, Any] = field(default_factory=dict)
    ties: Mapping[str, str] = field(default_factory=dict)
    extras: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)  # name -> (Annotated option, default)
    prepare: Callable[[dict, set[str], dict], None] | None = None
    common: frozenset[str] = frozenset()  # the flags `--help` shows (none: all); `--help-all` shows every one

    def options(self) -> list[Option]:
        return self._options

    def key(self, path: str) -> tuple[str, str, str]:
        """(flag prefix, ``FLAG_NAMES`` key, the ``Config.field`` key) of the field at ``path``: its place
        within the part of the config it belongs to, and that part's config class with its top-level name."""
        part = max((p for p in self.parts if path.startswith(p + ".")), key=len, default="")
        relative = path[len(part) + 1:] if part else path
        model = self.model
        for name in part.split(".") if part else ():
            sub = _section(model.model_fields[name].annotation)
            assert sub is not None
            model = sub
        top = relative.partition(".")[0]
        return self.parts.get(part, ""), relative, f"{_base(model, top).__name__}.{relative}"

    def flag(self, path: str) -> str:
        """The flag of the field at ``path``: ``FLAG_NAMES``'s, else ``--`` and its name, after its part's prefix."""
        prefix, relative, qualified = self.key(path)
        name = FLAG_NAMES.get(qualified) or FLAG_NAMES.get(relative) or f"--{relative.rpartition('.')[2].replace('_', '-')}"
        return f"--{prefix}{name[2:]}"

    @functools.cached_property
    def _options(self) -> list[Option]:
        out = []
        seen: dict[str, str] = {}
        for path, info, default, title in _leaves(self.model, "", self.model_defaults()):
            if path in self.set_by_job:
                continue
            flag = self.flag(path)
            if flag in seen:
                raise ValueError(f"{self.model.__name__}: {seen[flag]} and {path} both get {flag}: name one in "
                                 "FLAG_NAMES")
            seen[flag] = path
            panel = max((p for p in self.panels if title == p or title.startswith(p + ".")), key=len, default="")
            out.append(_option(path, (flag,), info, default, self.types.get(path.rpartition(".")[2]), panel))
        return out

    def fields(self) -> dict[str, Any]:
        """Every leaf field of the config (sections expanded), with its default (PydanticUndefined when
        required): the options are these, less ``set_by_job``."""
        return {path: default for path, _, default, _ in _leaves(self.model, "", self.model_defaults())}

    def model_defaults(self) -> dict:
        """The defaults of every section that has one (nested dicts); leaves come from the model itself."""
        return _section_defaults(self.model)


@dataclass(frozen=True)
class Option:
    path: str
    param: str
    flags: tuple[str, ...]
    kind: str  # scalar | list | map
    annotation: Any
    default: Any  # the config's default (PydanticUndefined when the field is required)
    typer_default: Any
    nullable: bool = False  # the field takes None: the word ``none`` gives it (``--teacher none``)

    def value(self, raw: Any) -> Any:
        """The config value of what the command line gave."""
        if self.kind == "list":
            return [part.strip() for item in raw for part in str(item).split(",") if part.strip()]
        if self.kind == "map":
            return parse_pairs(raw, self.flags[0])
        if isinstance(raw, enum.Enum):
            return raw.value
        if raw == "none" and self.nullable:
            return None  # e.g. --teacher none
        return raw


def parse_pairs(values: list[str], flag: str) -> dict:
    """``KEY=VALUE`` items into a dict; a value is JSON when it parses as JSON."""
    out = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise CommandLineError(f"{flag} expects KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def _optional(annotation: Any) -> bool:
    return type(None) in typing.get_args(annotation)


def _strip_none(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _section(annotation: Any) -> type[BaseModel] | None:
    inner = _strip_none(annotation)
    return inner if inspect.isclass(inner) and issubclass(inner, BaseModel) else None


def _default(info: Any) -> Any:
    return info.get_default(call_default_factory=True)


def _section_defaults(model: type[BaseModel]) -> dict:
    """The dumped default of every section field of ``model`` that has one (not None)."""
    out = {}
    for name, info in model.model_fields.items():
        value = _default(info) if _section(info.annotation) is not None else None
        if isinstance(value, BaseModel):
            out[name] = value.model_dump(mode="json")
    return out


def _leaves(model: type[BaseModel], prefix: str, defaults: dict | None,
            title: str = "") -> Iterator[tuple[str, Any, Any, str]]:
    """(path, field info, default, section title) of every non-section field, sections expanded."""
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        sub = _section(info.annotation)
        if sub is not None:
            yield from _leaves(sub, f"{path}.", (defaults or {}).get(name), path)
            continue
        default = defaults[name] if defaults is not None and name in defaults else _default(info)
        yield path, info, default, title


def _option(path: str, flags: tuple[str, ...], info: Any, default: Any, cli_type: Any, section: str) -> Option:
    """The typer option of one field: a list or dict field takes repeated values (an absent flag leaves the
    field alone, so its typer default is None and its shown default the field's); any other field its own
    type (or ``cli_type``, a wider Enum), defaulting to the field's default."""
    inner = _strip_none(info.annotation)
    origin = typing.get_origin(inner)
    help_text = " ".join((info.description or "").split())  # a docstring's line breaks are not the help's
    missing = default is None or default is PydanticUndefined
    if origin in (list, tuple, set, dict):
        kind = "map" if origin is dict else "list"
        help_text += " (KEY=VALUE, repeatable)" if kind == "map" else " (repeatable or comma-separated)"
        cli: Any = list[str] | None
        show: Any = ",".join(map(str, default)) if kind == "list" and not missing and default else False
        typer_default = None
    else:
        kind = "scalar"
        simple = inspect.isclass(inner) and issubclass(inner, (enum.Enum, bool, int, float, str))
        base = cli_type or (inner if simple else str)
        cli = base | None if missing or _optional(info.annotation) else base
        value = default.value if isinstance(default, enum.Enum) else default
        typer_default = None if missing else (base(value) if issubclass(base, enum.Enum) else value)
        show = not missing
        if base is bool:
            flags = (f"{flags[0]}/--no-{flags[0][2:]}", *flags[1:])
    if default is PydanticUndefined and not section:
        help_text += "  [required]"
    metavar = {"list": "TEXT,...", "map": "KEY=VALUE"}.get(kind)
    option = typer.Option(*flags, help=help_text, show_default=show, metavar=metavar,
                          rich_help_panel=f"{section.replace('_', ' ').replace('.', ' ')} options" if section
                          else "Config options")
    return Option(path, _PREFIX + path.replace(".", "__"), flags, kind, Annotated[cli, option], default,
                  typer_default, nullable=_optional(info.annotation) and inner is str)


HELP_ALL = "help_all"
HelpAllFlag = Annotated[bool, HelpAllOption]
ConfigFileOption = Annotated[str | None, typer.Option(
    "--config", help="Experiment file (YAML, or TOML by its .toml suffix) that sets any config field, nested "
    "sections included (`agentmem config show JOB` prints one; `extends: FILE` starts from another); flags "
    "given on the command line override it.",
    show_default=False)]


@dataclass(frozen=True)
class ConfigFile:
    """A ``--config`` file: its mapping and the line of each key (dotted path -> 1-based line); ``files``: the
    file a key came from when it is not ``path`` (a key of the file it ``extends``)."""

    path: str
    data: dict
    lines: Mapping[str, int]
    files: Mapping[str, str] = field(default_factory=dict)

    def where(self, key: str) -> str:
        """``FILE, line N`` of dotted ``key`` (or of its nearest section that has a line)."""
        while key and key not in self.lines:
            key = key.rpartition(".")[0]
        return f"{self.files.get(key, self.path)}, line {self.lines[key]}" if key else self.path

    def check_keys(self, model: type[BaseModel]) -> None:
        """A ``ConfigError`` for the first key that is no field of ``model`` (sections nested), naming the
        file, the line and the closest field."""
        import difflib

        def walk(data: dict, model: type[BaseModel], prefix: str) -> None:
            for key, value in data.items():
                info = model.model_fields.get(key)
                if info is None:
                    close = difflib.get_close_matches(str(key), list(model.model_fields), n=1)
                    hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
                    raise CommandLineError(f"--config {self.where(prefix + str(key))}: unknown key {prefix}{key}{hint}")
                sub = _section(info.annotation)
                if sub is not None and isinstance(value, dict):
                    walk(value, sub, f"{prefix}{key}.")

        walk(self.data, model, "")


def _yaml_lines(text: str) -> dict[str, int]:
    import yaml

    out: dict[str, int] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                path = f"{prefix}{key.value}"
                out[path] = key.start_mark.line + 1
                walk(value, path + ".")

    walk(yaml.compose(text, Loader=yaml.SafeLoader), "")
    return out


def _toml_lines(text: str) -> dict[str, int]:
    import re

    out: dict[str, int] = {}
    section = ""
    for number, line in enumerate(text.splitlines(), 1):
        header = re.match(r"\s*\[\s*([^\]]+?)\s*\]\s*(#.*)?$", line)
        if header:
            section = header.group(1).replace('"', "") + "."
            out[section[:-1]] = number
            continue
        key = re.match(r"\s*([A-Za-z0-9_.\"-]+?)\s*=", line)
        if key:
            out[section + key.group(1).replace('"', "")] = number
    return out


EXTENDS = "extends"


def read_config_file(path: str, _seen: tuple[str, ...] = ()) -> ConfigFile:
    """A ``--config`` file (YAML, or TOML by suffix); a syntax error names the line and column. A top-level
    ``extends: BASE`` (a path relative to the file) starts from that file: this file's keys override it, a
    section merged key by key, any other value (a list too) replaced whole."""
    own = _read_one(path)
    base_ref = own.data.pop(EXTENDS, None)
    if base_ref is None:
        return own
    if not isinstance(base_ref, str) or not base_ref:
        raise CommandLineError(f"--config {own.where(EXTENDS)}: extends names a file, got {base_ref!r}")
    base_path = str(Path(path).parent / base_ref)
    if str(Path(base_path).resolve()) in _seen + (str(Path(path).resolve()),):
        raise CommandLineError(f"--config {own.where(EXTENDS)}: extends {base_ref} makes a cycle")
    if not Path(base_path).is_file():
        raise CommandLineError(f"--config {own.where(EXTENDS)}: extends {base_ref}, which is no file "
                               f"({base_path})")
    base = read_config_file(base_path, _seen + (str(Path(path).resolve()),))
    lines = {k: v for k, v in own.lines.items() if k != EXTENDS}
    files = {k: base.files.get(k, base.path) for k in base.lines if k not in lines}
    return ConfigFile(path, _deep_merge(base.data, own.data), {**base.lines, **lines}, files)


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _read_one(path: str) -> ConfigFile:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"--config {path}: no such file")  # found in the world, as a missing --data
    text = file.read_text()
    if file.suffix == ".toml":
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise CommandLineError(f"--config {path}: {exc}") from None
        lines = _toml_lines(text)
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            at = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise CommandLineError(f"--config {path}{at}: {exc.problem or exc.context} (not valid YAML)") from None
        except yaml.YAMLError as exc:
            raise CommandLineError(f"--config {path}: {str(exc).splitlines()[0]}") from None
        lines = _yaml_lines(text) if isinstance(data, dict) else {}
    if data is None:
        return ConfigFile(path, {}, {})
    if not isinstance(data, dict):
        raise CommandLineError(f"--config {path}: expected a mapping of config fields, got {type(data).__name__}")
    return ConfigFile(path, data, lines)


def load_file(path: str) -> dict:
    """A config file's mapping (YAML, or TOML by suffix)."""
    return read_config_file(path).data


@dataclass
class Invocation:
    """One command line of a job: its spec, the raw generated values, the file and the extra options."""

    spec: JobSpec
    ctx: typer.Context
    values: dict[str, Any]
    file: str | None
    extras: dict[str, Any]

    def passed(self, param: str) -> bool:
        """Whether option ``param`` (a command's own parameter name) was given on the command line."""
        source = self.ctx.get_parameter_source(param)
        return source is not None and source.name in _GIVEN

    def refuse_on_resume(self, resume: str | None, allowed: frozenset[str] = frozenset()) -> None:
        """On ``--resume RUN`` the run's stored config is used: a config flag (other than the ``allowed``
        paths), ``--level`` or ``--config`` given as well is a ``ConfigError``, never ignored."""
        if resume is None:
            return
        given = ["--config"] if self.file else []
        given += [o.flags[0].split("/")[0] for o in self.spec.options()
                  if o.path not in allowed and self.passed(o.param)]
        given += [f"--{name.replace('_', '-')}" for name, value in self.extras.items() if value is not None]
        if given:
            raise CommandLineError(f"--resume {resume} finishes the run with its stored config: {', '.join(given)} "
                              f"cannot change it (leave {'it' if len(given) == 1 else 'them'} out, or start a new "
                              "run)")

    def config_file(self) -> ConfigFile | None:
        """The ``--config`` file read and its keys checked against the job's config (None: no file)."""
        if not self.file:
            return None
        file = read_config_file(self.file)
        file.check_keys(self.spec.model)
        return file

    def given(self) -> tuple[dict, set[str]]:
        """The file's mapping with the command-line flags over it (nested), and the paths they set."""
        file = self.config_file()
        data = copy.deepcopy(file.data) if file else {}
        paths = set(_paths(data, self.spec.model))
        for option in self.spec.options():
            if self.passed(option.param):
                _put(data, option.path, option.value(self.values[option.param]))
                paths.add(option.path)
        return data, paths

    def config(self) -> BaseModel:
        """The job's config: defaults < ``--config`` file < flags given. A bad value that came from the file
        (not a flag) is a ``ConfigError`` naming the file, the key and its line."""
        from pydantic import ValidationError

        data, paths = self.given()
        for target, source in self.spec.ties.items():
            section = target.rpartition(".")[0]
            if target not in paths and source in paths and (not section or get_path(data, section) is not None):
                _put(data, target, get_path(data, source))
        merged = _merge(self.spec.model, self.spec.model_defaults(), data)
        if self.spec.prepare is not None:
            self.spec.prepare(merged, paths, self.extras)
        try:
            return self.spec.model.model_validate(merged)
        except ValidationError as exc:
            raise CommandLineError(self._message(exc)) from exc

    def _message(self, exc: Any) -> str:
        """A validation error in the user's words: each problem under its flag (or, for a value the
        ``--config`` file gave, under the file, its line and the key path), the config's field names in the
        message turned into flags."""
        file = self.config_file()
        options = self.spec.options()
        flag = {o.path: o.flags[0].split("/")[0] for o in options}
        given = {o.path for o in options if self.passed(o.param)}
        keys = [".".join(str(x) for x in err["loc"] if not isinstance(x, int)) for err in exc.errors()]
        from_file = [k for k in keys if file is not None and k in file.lines and k not in given]
        problems = []
        for key, err in zip(keys, exc.errors(), strict=True):
            text = "is required" if err["type"] == "missing" else _flags_in(err["msg"].removeprefix("Value error, "),
                                                                            flag)
            name = key if from_file else flag.get(key) or (flag_of(key) if key else "")
            problems.append(f"{name} {text}" if err["type"] == "missing" else f"{name}: {text}" if name else text)
        if from_file and file is not None:
            return f"--config {file.where(from_file[0])}: {'; '.join(problems)}"
        return "; ".join(problems)


def _flags_in(message: str, flags: Mapping[str, str]) -> str:
    """``message`` with the config's field names as the flags that set them: ``kd_weight`` -> ``--kd-weight``,
    ``context=privileged`` -> ``--teacher-context privileged`` (a one-word name only in that form: as a word it
    is English)."""
    import re

    names: dict[str, str] = {}
    for path, name in flags.items():
        parts = path.split(".")
        for start in range(len(parts)):  # every tail of the path: distill.loss.kd_weight, loss.kd_weight, kd_weight
            names.setdefault(".".join(parts[start:]), name)
    for name in sorted(names, key=len, reverse=True):
        flag = names[name]
        message = re.sub(rf"(?<![\w.-]){re.escape(name)}=([^\s,;:)]+)", rf"{flag} \1", message)
        if "_" in name or "." in name:
            message = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", flag, message)
    return message


def _paths(data: dict, model: type[BaseModel] | None, prefix: str = "") -> Iterator[str]:
    for key, value in data.items():
        info = model.model_fields.get(key) if model is not None else None
        sub = _section(info.annotation) if info is not None else None
        if sub is not None and isinstance(value, dict):
            yield from _paths(value, sub, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def get_path(data: dict, path: str) -> Any:
    """The value at dotted ``path`` of nested ``data`` (None when absent)."""
    for key in path.split("."):
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _put(data: dict, path: str, value: Any) -> None:
    *sections, leaf = path.split(".")
    for key in sections:
        data = data.setdefault(key, {})
    data[leaf] = value


def _merge(model: type[BaseModel], base: dict, over: dict) -> dict:
    """``over`` on ``base``: a section given in both merges field by field; any other value is replaced
    (a dict field such as ``env_knobs`` too)."""
    out = dict(base)
    for key, value in over.items():
        info = model.model_fields.get(key)
        sub = _section(info.annotation) if info is not None else None
        if sub is not None and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(sub, out[key], value)
        else:
            out[key] = value
    return out


def job_command(spec: JobSpec) -> Callable[[Callable], Callable]:
    """Add one option per config field of ``spec`` (and ``--config``, and ``spec.extras``) to a command
    function whose first parameter is ``ctx: typer.Context``; ``job_config(ctx)`` then builds the config."""
    options = spec.options()

    def wrap(func: Callable) -> Callable:
        hints = typing.get_type_hints(func, include_extras=True)
        own = [p.replace(annotation=hints.get(p.name, p.annotation))
               for p in inspect.signature(func).parameters.values()]
        generated = [inspect.Parameter(o.param, inspect.Parameter.KEYWORD_ONLY, annotation=o.annotation,
                                       default=o.typer_default) for o in options]
        extras = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
                  for name, (annotation, default) in spec.extras.items()]
        config_file = inspect.Parameter(CONFIG_FILE, inspect.Parameter.KEYWORD_ONLY, annotation=ConfigFileOption,
                                        default=None)
        help_all = inspect.Parameter(HELP_ALL, inspect.Parameter.KEYWORD_ONLY, annotation=HelpAllFlag, default=False)
        params = [own[0].replace(kind=inspect.Parameter.KEYWORD_ONLY), config_file, *generated, *extras,
                  *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own[1:]), help_all]

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            ctx = kwargs[own[0].name]
            ctx.meta["agentmem.invocation"] = Invocation(
                spec, ctx, {o.param: kwargs.pop(o.param) for o in options}, kwargs.pop(CONFIG_FILE),
                {name: kwargs.pop(name) for name in spec.extras})
            kwargs.pop(HELP_ALL)
            return func(**kwargs)

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return wrap


def invocation(ctx: typer.Context) -> Invocation:
    return ctx.meta["agentmem.invocation"]


def job_config(ctx: typer.Context) -> Any:
    """The config of the command line ``ctx`` (see ``Invocation.config``)."""
    return invocation(ctx).config()

"""The click classes behind every agentmem command: help that fits a screen, and one error style.

Help is plain text (no rich markup: a help string's ``[tensorboard]`` is printed as written), wrapped to the
terminal (at most 100 columns) with every flag's name whole:

- the commands are listed in the order of the workflow (``WORKFLOW``), then the rest;
- an option shows its first name only (a flag's other names are aliases kept for old scripts), a switch as
  ``--write / --no-write``, a value as the user writes it (``TEXT``, ``INTEGER``, ``NUMBER``, ``[a|b]``,
  ``TEXT,...``);
- a job whose ``JobSpec.common`` names its common flags shows those (its own options grouped as they are
  declared) and one line that ``--help-all`` (or ``agentmem config show JOB``) shows the rest.

Errors: a usage error (an unknown flag, a bad value, a missing argument) is one line ``error: ...`` with exit
code 2, any other click error exit code 1; the jobs' own errors are printed by ``cli.app.main`` (exit 2 for a
``CommandLineError``: a bad value, config file or flag; 1 for the rest).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

# The commands in the order of the workflow (collect, evaluate, train), then the utilities and inspection.
WORKFLOW = ("rollout", "eval", "sft", "score", "distill", "train", "worker", "replay-audit", "serve", "memories",
            "runs", "show", "sql", "view", "report", "export", "config", "models", "db")
HELP_ALL = "agentmem.help_all"
MAX_WIDTH = 100
MAX_CHOICES_WIDTH = 24  # a wider ``[a|b|...]`` is named (``ENV``) and its choices listed in the help, wrapped
_TYPES = {"str": "TEXT", "int": "INTEGER", "int range": "INTEGER", "float": "NUMBER", "float range": "NUMBER",
          "path": "PATH", "file": "PATH", "directory": "PATH", "dir": "PATH", "bool": "BOOLEAN"}


def metavar(display: str) -> str:
    """What a value is, as a user writes it, from typer's ``<type>`` (``<list[str]>`` -> ``TEXT,...``)."""
    inner = display.strip("<>").removesuffix("...")
    if inner.startswith("list[") and inner.endswith("]"):
        return metavar(inner[5:-1]) + ",..."
    if "|" in inner:
        return f"[{inner}]"
    return _TYPES.get(inner, inner.upper())


def _common(command: Any) -> frozenset[str]:
    from cli.job_specs import JOBS

    spec = JOBS.get(command.name or "")
    return spec.common if spec is not None else frozenset()


def first_clause(text: str) -> str:
    """``text`` up to its first ``. ``, ``; `` or ``: `` outside parentheses (a colon only after the first 20
    characters: ``ReOPD: branch ...`` keeps its label), without the end's full stop: an option's help in
    ``--help``, where ``--help-all`` has it whole."""
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch in "([") - (ch in ")]")
        after = text[i + 1:i + 2]
        if text[:i + 1].endswith(("e.g.", "i.e.", "etc.", "vs.")):
            continue
        if depth == 0 and after in (" ", "") and (ch in ".;" or (ch == ":" and i >= 20)):
            return text[:i]
    return text.rstrip(".")


def summary(text: str) -> str:
    """A command's line in its group's list: the first sentence of its help, whole (wrapped, never cut)."""
    paragraph = " ".join(text.split("\n\n")[0].split())
    end = paragraph.find(". ")
    return paragraph[:end] if end != -1 else paragraph.rstrip(".")


def _help_all(ctx: typer.Context, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        ctx.meta[HELP_ALL] = True
        typer.echo(ctx.get_help())
        raise typer.Exit()


HelpAllOption = typer.Option("--help-all", is_eager=True, callback=_help_all, show_default=False,
                             help="Show every option (`agentmem config show JOB` prints them as a config file).")


class Command(TyperCommand):
    """A command with the help of the module docstring (plain, grouped, common flags first)."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        common = _common(self)
        show_all = ctx.meta.get(HELP_ALL, False) or not common
        panels: dict[str, list[tuple[str, str]]] = {}
        left = 0
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if isinstance(param, TyperArgument):
                panels.setdefault("Arguments", []).append((param.metavar or param.name.upper(), record[1]))
                continue
            name = param.opts[0]
            if not show_all and name not in common and name not in ("--help", "--help-all"):
                left += 1
                continue
            names = name + (f" / {param.secondary_opts[0]}" if param.secondary_opts else "")
            if not param.is_flag and not param.count:
                names += f" {param.metavar or metavar(param.display_type(ctx))}"
            text = record[1]
            if not show_all:  # the first clause and the [default: ...] note; --help-all has the rest
                help_part, note = re.fullmatch(r"(.*?)((?:  \[[^\]]*\])?)", text, flags=re.S).groups()
                text = first_clause(help_part) + note
            choices = getattr(param, "agentmem_choices", None)
            if choices:
                text = re.sub(r"^(.*?)((?:  \[[^\]]*\])?)$", rf"\1 (one of: {', '.join(choices)})\2", text,
                              count=1, flags=re.S)
            panels.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append((names, text))
        for panel, rows in panels.items():
            with formatter.section(panel):
                formatter.write_dl(rows)
        if left:
            words = command_words(ctx)
            formatter.write_paragraph()
            formatter.write_text(f"Each option's full help, and {left} more options: agentmem {' '.join(words)} "
                                 f"--help-all, or as a config file: agentmem config show {words[-1]}")


class Group(TyperGroup):
    """A command group: workflow order, plain help, and the one error style (``main``)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        plain(self)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The commands with the first sentence of each one's help, wrapped (click cuts them with "...")."""
        rows = [(name, summary(command.help or "")) for name in self.list_commands(ctx)
                if (command := self.get_command(ctx, name)) is not None and not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def list_commands(self, ctx: Any) -> list[str]:
        names = list(self.commands)
        order = {name: i for i, name in enumerate(WORKFLOW)}
        return sorted(names, key=lambda n: (order.get(n, len(order)), names.index(n)))

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        from typer._click import exceptions as click_errors

        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click_errors.NoArgsIsHelpError as exc:
            if not standalone_mode:
                raise
            typer.echo(exc.format_message())
            sys.exit(0)
        except click_errors.ClickException as exc:
            if not standalone_mode:
                raise
            typer.echo(f"error: {usage_message(exc)}", err=True)
            sys.exit(exc.exit_code)
        except typer.Abort:
            if not standalone_mode:
                raise
            typer.echo("error: aborted", err=True)
            sys.exit(1)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)


def command_words(ctx: Any) -> list[str]:
    """The words of ``ctx``'s command under ``agentmem`` (``["config", "show", "train"]``), however the
    program was started (``agentmem``, ``python -m cli.app``)."""
    words = []
    while ctx.parent is not None:
        words.insert(0, ctx.info_name)
        ctx = ctx.parent
    return words


# what a choice is called in an error, where its flag's own words do not say it
_NOUNS = {"--env": "environment", "--memory": "memory policy"}


def unknown_choice(noun: str, value: str, choices: Sequence[str]) -> str:
    """``unknown NOUN 'VALUE' (did you mean CLOSEST?); known: A, B, ...``: the one wording of a value that is not
    among its choices (``(did you mean ...)`` only when one is close)."""
    import difflib

    close = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown {noun} {value!r}{hint}; known: {', '.join(choices)}"


def _choice_message(exc: Any) -> str | None:
    """A bad choice of an option (typer's ``Value error, 'x' is not one of 'a', 'b'.``) in ``unknown_choice``'s
    words, or None for any other error."""
    import re

    match = re.fullmatch(r"Value error, '(.*)' is not one of (.*)\.", str(getattr(exc, "message", "")), flags=re.S)
    param = getattr(exc, "param", None)
    if match is None or param is None:
        return None
    flag = param.opts[0]
    noun = _NOUNS.get(flag) or flag.removeprefix("--").replace("-", " ").replace(".", " ")
    return unknown_choice(noun, match.group(1), re.findall(r"'([^']*)'", match.group(2)))


def usage_message(exc: Any) -> str:
    """A click error in one line, with where to read the command's help."""
    text = _choice_message(exc) or " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    if ctx is not None and exc.exit_code == 2:
        text += f" (see: {' '.join(['agentmem', *command_words(ctx)])} --help)"
    return text


def plain(command: Any) -> None:
    """``command`` and every command under it: plain help (no rich markup), the values' metavars, the
    commands' ``Command`` class. Run once, when the top group is built."""
    command.rich_markup_mode = None
    command.context_settings.setdefault("max_content_width", MAX_WIDTH)
    if type(command) is TyperCommand:
        command.__class__ = Command
    elif type(command) is TyperGroup:
        command.__class__ = Group
    for param in command.params:
        if isinstance(param, TyperOption) and not param.is_flag and param.metavar is None:
            param.metavar = metavar(param.display_type(typer.Context(command)))
            if param.metavar.startswith("[") and len(param.metavar) > MAX_CHOICES_WIDTH:
                param.agentmem_choices = param.metavar.strip("[]").split("|")  # listed in the help, wrapped
                param.metavar = param.opts[0].lstrip("-").upper().replace("-", "_").replace(".", "_")
        elif isinstance(param, TyperArgument) and param.metavar is None:
            param.metavar = param.name.upper() + ("..." if param.nargs != 1 else "")
    for sub in getattr(command, "commands", {}).values():
        plain(sub)

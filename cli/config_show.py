"""``agentmem config``: a job's effective config as YAML (``show``), its JSON schema (``schema``), and a stored
run's config as a file to run again (``show --run RUN_ID``).

``config show JOB [--config FILE] [flags]`` builds the config exactly as ``agentmem JOB`` would (the same
``cli.job_specs`` spec), so what it prints is what the job stores in ``runs.config``; the one exception is
``--dtype auto``, measured only when the job runs (printed as float32 with a comment).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from cli.config_options import invocation, job_command
from cli.job_specs import JOBS, MEMORIES
from cli.options import DbOption

app = typer.Typer(help="Experiment configs: print a job's effective config or schema, or a stored run's config.",
                  no_args_is_help=True)
show_app = typer.Typer(help="Print the config a job would store (YAML): `config show JOB`, with the job's "
                       "--config FILE and flags, or a stored run's with --run RUN_ID (`agentmem JOB --config` runs "
                       "it again).",
                       invoke_without_command=True)
app.add_typer(show_app, name="show")

# the job whose config a stored run of each kind holds
_RUN_JOBS = {"rollout": "rollout", "eval": "eval", "score": "score", "distill": "distill", "sft": "sft",
             "train": "train", "replay": "replay"}


def to_yaml(data: dict) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def stored_config(run) -> dict:
    """A stored run's config read through its job's model (extra keys a job stores beside it dropped), as the
    JSON a job would store now."""
    from agentmem.config import ReplayConfig, RolloutConfig
    from agentmem.errors import ConfigError

    job = _RUN_JOBS.get(run.kind.value)
    if job is None:
        raise ConfigError(f"run {run.id} is a {run.kind.value} run: no job config to export")
    if job == "replay":
        return ReplayConfig.model_validate(run.config).model_dump(mode="json")
    model = JOBS[job].model
    known = {k: v for k, v in run.config.items() if k in model.model_fields}
    reader = RolloutConfig.stored if job == "rollout" else model.model_validate
    return reader(known).model_dump(mode="json")


@show_app.callback()
def show(ctx: typer.Context,
         run: Annotated[str | None, typer.Option("--run", help="Print stored run RUN_ID's config instead.",
                                                 show_default=False)] = None,
         db: DbOption = None) -> None:
    if ctx.invoked_subcommand is not None:
        return
    if run is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    from store import repository as repo
    from store.engine import open_store

    with open_store(db).session() as s:
        stored = repo.get_run(s, run)
    typer.echo(f"# run {stored.id} ({stored.kind.value}): agentmem {_RUN_JOBS.get(stored.kind.value, '?')} "
               f"--config FILE runs it again", nl=True)
    typer.echo(to_yaml(stored_config(stored)), nl=False)


def _printer(job: str):
    def print_config(ctx: typer.Context) -> None:
        call = invocation(ctx)
        config = call.config()
        if call.given()[0].get("dtype") == "auto":
            typer.echo("# dtype auto: measured when the job runs; stored as the dtype it picks")
        typer.echo(to_yaml(config.model_dump(mode="json")), nl=False)

    command = "memories build" if job == "memories" else job
    print_config.__doc__ = f"The config `agentmem {command}` would store, with the same flags and --config FILE."
    return print_config


for _job, _spec in {**JOBS, "memories": MEMORIES}.items():
    show_app.command(_job)(job_command(_spec)(_printer(_job)))


def effective_config(job: str, args: list[str]):
    """The config ``agentmem JOB ARGS`` would run with (what ``config show JOB ARGS`` prints), built by the same
    spec: for a driver (a benchmark) that runs a job exactly as its command line would. Raises ``ConfigError``
    as the command does."""
    import typer.main

    made: list = []

    def capture(ctx: typer.Context) -> None:
        made.append(invocation(ctx).config())

    one = typer.Typer()
    one.command(job)(job_command(JOBS[job])(capture))
    one.command("help")(lambda: None)  # a second command keeps JOB a subcommand
    typer.main.get_command(one).main([job, *args], prog_name="agentmem", standalone_mode=False)
    return made[0]


@app.command()
def schema(job: Annotated[str, typer.Argument(help=f"One of {', '.join(JOBS)}.")]) -> None:
    """Print a job config's JSON schema (every field, its type, default and description)."""
    from cli.command import unknown_choice
    from cli.config_options import CommandLineError

    if job not in JOBS:
        raise CommandLineError(unknown_choice("job", job, list(JOBS)))
    typer.echo(json.dumps(user_schema(JOBS[job].model, job), indent=2))


def user_schema(model, job: str) -> dict:
    """``model``'s JSON schema as a config file's author reads it: every section and choice written out in
    place (no ``$defs``: their names are the code's classes), each field with its type, default and help."""
    raw = model.model_json_schema()
    defs = raw.pop("$defs", {})

    def inline(node):
        if isinstance(node, list):
            return [inline(n) for n in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            target = dict(defs[node["$ref"].rsplit("/", 1)[1]])
            target.pop("title", None)
            if "enum" in target or "properties" in target:
                target.pop("description", None)  # a class's docstring, not a field's help
            return inline({**target, **{k: v for k, v in node.items() if k != "$ref"}})
        return {k: inline(v) for k, v in node.items()}

    out = inline(raw)
    out.pop("description", None)
    out["title"] = f"agentmem {job} config"
    return out


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="config")

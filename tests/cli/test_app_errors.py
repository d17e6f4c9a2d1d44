"""One error style (``cli.command``, ``cli.app``, ``cli.config_options``): every user error is one line
``error: ...``, exit code 2 when the command line does not parse and 1 otherwise; a ``--config`` file's
error names the file, the line and the key path (with the closest key for a misspelt one); messages name
flags, never config fields, library classes or rewritten URLs; ``--resume`` refuses the config flags it
cannot apply; ``view`` and ``serve`` have their own default ports and a port in use is one line."""

from __future__ import annotations

import socket

import pytest
from helpers import run_main

from cli.serve import SERVE_PORT


def agentmem(capsys, monkeypatch, *args: str) -> tuple[int, list[str], str]:
    """(exit code, stderr lines, stdout) of ``agentmem ARGS``."""
    code, out, err = run_main(capsys, monkeypatch, *args)
    return code, err.strip().splitlines(), out


@pytest.mark.parametrize(("args", "line"), [
    (["rollout", "--kob", "x"], "error: No such option: --kob (Possible options: --db, --knob) "
                                "(see: agentmem rollout --help)"),
    (["rollout", "--episodes", "many"], "error: Invalid value for '--episodes': Input should be a valid integer, "
                                        "unable to parse string as an integer (see: agentmem rollout --help)"),
    (["sql"], "error: Missing argument 'QUERY'. (see: agentmem sql --help)"),
    (["nosuch"], "error: No such command 'nosuch'. (see: agentmem --help)"),
    (["sql", "--write", "true", "select 1", "--db", "x.db"],
     "error: Got unexpected extra argument(s) (select 1) (see: agentmem sql --help)"),
])
def test_a_usage_error_is_one_line_with_exit_code_2(capsys, monkeypatch, args, line):
    code, lines, out = agentmem(capsys, monkeypatch, *args)
    assert (code, lines, out) == (2, [line], "")


@pytest.fixture
def files(tmp_path):
    (tmp_path / "typo.yaml").write_text("episodes: 2\nagent:\n  memory_tokns: 3\n")
    (tmp_path / "typo.toml").write_text("episodes = 2\n\n[agent]\ntop_p = 0.5\nmemory_tokns = 3\n")
    (tmp_path / "value.yaml").write_text("seed: 1\nagent:\n  temperature: -1\n")
    (tmp_path / "broken.yaml").write_text("episodes: 2\nagent: [\n  x: : 3\n")
    (tmp_path / "top.yaml").write_text("# a comment\nepisdes: 2\n")
    return tmp_path


@pytest.mark.parametrize(("name", "line"), [
    ("typo.yaml", "typo.yaml, line 3: unknown key agent.memory_tokns (did you mean agent.memory_tokens?)"),
    ("typo.toml", "typo.toml, line 5: unknown key agent.memory_tokns (did you mean agent.memory_tokens?)"),
    ("top.yaml", "top.yaml, line 2: unknown key episdes (did you mean episodes?)"),
    ("value.yaml", "value.yaml, line 3: agent.temperature: Input should be greater than or equal to 0"),
    ("broken.yaml", "broken.yaml, line 3, column 6: expected the node content, but found ':' (not valid YAML)"),
])
def test_a_config_file_error_names_the_file_line_and_key(capsys, monkeypatch, files, name, line):
    code, lines, _ = agentmem(capsys, monkeypatch, "config", "show", "rollout", "--config", str(files / name))
    assert (code, lines) == (2, [f"error: --config {files / line}"])
    assert "--memory-tokns" not in lines[0] and "Extra inputs" not in lines[0]


def test_a_flag_over_a_bad_file_value_is_reported_as_the_flag(capsys, monkeypatch, files):
    code, lines, _ = agentmem(capsys, monkeypatch, "config", "show", "rollout", "--config",
                              str(files / "value.yaml"), "--sample-temperature", "-2")
    assert (code, lines) == (2, ["error: --sample-temperature: Input should be greater than or equal to 0"])


@pytest.mark.parametrize(("args", "line"), [
    (["distill", "--run", "r", "--psd", "mixed"],
     "error: --psd mixed distils from the privileged teacher: set --teacher-context privileged"),
    (["distill", "--run", "r", "--teacher-source", "scores", "--teacher-temperature", "2"],
     "error: --teacher-temperature: --teacher-temperature 2.0 reads the teacher's full distribution: "
     "--teacher-source scores stores only the sampled token's log-prob (use --teacher-source model or shards)"),
    (["distill", "--run", "r", "--kd-weight", "0", "--rl", "none"],
     "error: every loss term has weight 0: set --kd-weight (with a teacher), --rl-weight (with --rl grpo), "
     "--ce-weight, --anchor-weight or a --loss-terms weight"),
    (["eval", "--sample-temperature", "1"], "error: an evaluation is greedy: --sample-temperature must be 0, got 1.0"),
    (["sft"], "error: --run is required"),
])
def test_a_validation_error_names_flags_not_fields(capsys, monkeypatch, args, line):
    code, lines, _ = agentmem(capsys, monkeypatch, "config", "show", *args)
    assert (code, lines) == (2, [line])


@pytest.mark.parametrize(("args", "line"), [
    (["rollout", "--resume", "abc", "--episodes", "20"],
     "error: --resume abc finishes the run with its stored config: --episodes cannot change it (leave it out, "
     "or start a new run)"),
    (["sft", "--resume", "abc", "--steps", "3", "--lr", "1"],
     "error: --resume abc finishes the run with its stored config: --lr cannot change it (leave it out, or start "
     "a new run)"),
    (["train", "--resume", "abc", "--level", "2", "--rounds", "3"],
     "error: --resume abc finishes the run with its stored config: --rounds, --level cannot change it (leave "
     "them out, or start a new run)"),
])
def test_resume_refuses_what_it_cannot_apply(capsys, monkeypatch, tmp_path, args, line):
    code, lines, _ = agentmem(capsys, monkeypatch, *args, "--db", str(tmp_path / "x.db"))
    assert (code, lines) == (2, [line])
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize(("url", "code", "line"), [
    ("bogus://x", 2, "error: unknown database kind 'bogus' in bogus://x: give sqlite:///PATH or "
                     "postgresql://USER@HOST/DB"),
    ("postgresql://someone@127.0.0.1:1/agentmem", 1, "error: cannot reach database "
                                                     "postgresql://someone@127.0.0.1:1/agentmem: "),
])
def test_database_messages_show_the_url_as_written(capsys, monkeypatch, url, code, line):
    got, lines, _ = agentmem(capsys, monkeypatch, "runs", "--db", url)
    assert got == code and len(lines) == 1 and lines[0].startswith(line), lines
    assert "sqlalchemy" not in lines[0] and "+psycopg" not in lines[0]


@pytest.mark.parametrize(("url", "line"), [
    ("notaurl", "--db notaurl: not a database URL: give sqlite:///notaurl for a SQLite file of that name, or "
                "postgresql://USER@HOST/DB"),
    ("sqlite:/x.db", "--db sqlite:/x.db: a SQLite URL has three slashes before a relative path and four before an "
                     "absolute one: sqlite:///x.db or sqlite:////x.db"),
    ("sqlite://x.db", "--db sqlite://x.db: a SQLite URL has three slashes before a relative path and four before an "
                      "absolute one: sqlite:///x.db or sqlite:////x.db"),
    ("sqlite3:///x.db", "unknown database kind 'sqlite3' in sqlite3:///x.db (did you mean sqlite:///x.db?): give "
                        "sqlite:///PATH or postgresql://USER@HOST/DB"),
    ("postgres:/host/db", "--db postgres:/host/db: not a database URL: give postgresql://USER@HOST/DB"),
])
@pytest.mark.parametrize("command", [["runs"], ["db", "upgrade"], ["rollout", "--policy", "oracle"]])
def test_a_database_url_is_parsed_before_use_with_a_hint(capsys, monkeypatch, tmp_path, url, line, command):
    monkeypatch.chdir(tmp_path)
    code, lines, out = agentmem(capsys, monkeypatch, *command, "--db", url)
    assert (code, lines, out) == (2, [f"error: {line}"], "")
    assert list(tmp_path.iterdir()) == []  # no file named notaurl, x.db or x.db.lock


def test_a_database_url_from_the_environment_is_parsed_too(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AGENTMEM_DB", "notaurl")
    code, lines, _ = agentmem(capsys, monkeypatch, "runs")
    assert (code, lines) == (2, ["error: $AGENTMEM_DB notaurl: not a database URL: give sqlite:///notaurl for a "
                                 "SQLite file of that name, or postgresql://USER@HOST/DB"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("args", "line"), [
    (["rollout", "--env", "hotpotqaa"], "unknown environment 'hotpotqaa' (did you mean hotpotqa?); known: synthetic, "
                                        "hotpotqa, squad, locomo, longmemeval, ruler_hotpotqa, needle, musique, "
                                        "2wikimultihopqa, quality (see: agentmem rollout --help)"),
    (["rollout", "--policy", "orcle"], "unknown policy 'orcle' (did you mean oracle?); known: model, oracle "
                                       "(see: agentmem rollout --help)"),
    (["sql", "select 1", "--format", "xml"], "unknown format 'xml'; known: table, csv, json (see: agentmem sql --help)"),
    (["score", "--run", "r", "--teacher-context", "algned"],
     "unknown teacher context 'algned' (did you mean aligned?); known: aligned, persistent, privileged, "
     "persistent_chat, hint (see: agentmem score --help)"),
    (["rollout", "--memory", "overwrit"], "unknown memory policy 'overwrit' (did you mean overwrite?); known: events, "
                                          "log, overwrite, routed, teacher"),
])
def test_a_choice_error_reads_like_the_rest_with_the_closest_choice(capsys, monkeypatch, tmp_path, args, line):
    code, lines, _ = agentmem(capsys, monkeypatch, *args, "--db", str(tmp_path / "x.db"))
    assert (code, lines) == (2, [f"error: {line}"])


def test_serve_and_view_default_to_different_ports():
    from typer.main import get_command

    from cli.app import app

    ports = {name: next(p.default for p in get_command(app).commands[name].params if p.name == "port")
             for name in ("view", "serve")}
    assert ports == {"view": 8000, "serve": SERVE_PORT} and SERVE_PORT == 8001


@pytest.mark.parametrize("command", ["view", "serve"])
def test_a_port_in_use_is_one_line_before_anything_starts(capsys, monkeypatch, tmp_path, command):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code, lines, out = agentmem(capsys, monkeypatch, command, "--port", str(port), "--db", str(tmp_path / "x.db"))
    assert (code, lines, out) == (1, [f"error: port {port} on 127.0.0.1 is in use (another server?): give another "
                                      "--port"], "")


# Every command's bad inputs, walked: (command line, exit code, the error line's start). 2 when the command line
# itself is wrong, 1 when the world disagrees (a run, file, model or database that is not there). {db} is a migrated
# empty store, {root} its folder; ids that name nothing are 0123456789ab.
NONE = "0123456789ab"
WALK = [
    ("rollout --episodes 0", 2, "error: --episodes: Input should be greater than or equal to 1"),
    ("rollout --level 2 --knob level=3", 2, "error: --level 2 and --knob level=3 disagree: give one"),
    ("rollout --kappa 0.5", 2, "error: --kappa weights the branch steps of a replay: give --replay-from RUN_ID"),
    (f"rollout --resume {NONE}", 1, f"error: no run with id '{NONE}'"),
    ("eval --sweep nosuch=1,2", 2, "error: environment 'synthetic' has no knob 'nosuch' to sweep"),
    ("eval --docs 50,abc", 2, "error: --docs expects comma-separated integers, got '50,abc'"),
    ("eval --docs 1 --sweep docs=2", 2, "error: give --docs or --sweep, not both"),
    ("eval --model {root}/no/such/model", 1, "error: "),
    ("sft", 2, "error: --run is required"),
    (f"sft --run {NONE}", 1, f"error: no run with id '{NONE}'"),
    ("score --run r --teacher-context algned", 2, "error: unknown teacher context 'algned' (did you mean aligned?)"),
    (f"score --run {NONE}", 1, f"error: no run with id '{NONE}'"),
    ("distill --run r --loss kl", 2, "error: unknown loss 'kl'"),
    (f"distill --run {NONE}", 1, f"error: no run with id '{NONE}'"),
    ("train --report-to nosuch", 2, "error: --report-to 'nosuch': choose from"),
    (f"train --resume {NONE}", 1, f"error: no run with id '{NONE}'"),
    ("worker --max-attempts 0", 2, "error: Invalid value for '--max-attempts'"),
    (f"worker --run {NONE}", 1, f"error: no run with id '{NONE}'"),
    ("replay-audit --student-run a", 2, "error: Missing option '--teacher-run'"),
    (f"replay-audit --student-run {NONE} --teacher-run {NONE}", 1, f"error: no run with id '{NONE}'"),
    ("serve --backend nosuch", 2, "error: unknown backend 'nosuch'"),
    ("serve --model {root}/no/such/model", 1, "error: "),
    ("memories build", 2, "error: --run is required"),
    (f"memories build --run {NONE}", 1, f"error: no run with id '{NONE}'"),
    ("memories list --full=yes", 2, "error: "),
    ("memories list --db {root}/nothing.db", 1, "error: no database at"),
    ("runs --db notaurl", 2, "error: --db notaurl: not a database URL"),
    ("runs --db {root}/nothing.db", 1, "error: no database at"),
    ("show episode", 2, "error: Missing argument 'EPISODE_ID'"),
    (f"show episode {NONE}", 1, "error: no episode"),
    ("sql ''", 2, "error: empty SQL statement ''"),
    ("sql 'selec 1'", 1, "error: SQL failed: "),
    ("view --port 0", 2, "error: Invalid value for '--port'"),
    ("view --db {root}/nothing.db", 1, "error: no database at"),
    ("report", 2, "error: Missing option '--run'"),
    (f"report --run {NONE}", 1, f"error: no run with id '{NONE}'"),
    ("export --run r", 2, "error: Missing option '--out'"),
    (f"export --run {NONE} --out {{root}}/x.parquet", 1, f"error: no run with id '{NONE}'"),
    ("config show nosuch", 2, "error: No such command 'nosuch'"),
    ("config schema nosuch", 2, "error: unknown job 'nosuch'"),
    (f"config show --run {NONE}", 1, f"error: no run with id '{NONE}'"),
    ("models prepare --nosuch", 2, "error: No such option: --nosuch"),
    ("db downgrade", 2, "error: Missing argument 'REVISION'"),
    ("db upgrade --db sqlite:/x.db", 2, "error: --db sqlite:/x.db: a SQLite URL has three slashes"),
    ("db downgrade nosuchrev --db {root}/new.db", 2, "error: unknown schema revision 'nosuchrev': known revisions "
                                                     "are base, 0001"),
    ("db downgrade base --db {root}/no/folder/x.db", 1, "error: cannot create SQLite database"),
    ("db upgrade --db {root}/no/folder/x.db", 1, "error: cannot create SQLite database"),
    ("db current --db bogus://x", 2, "error: unknown database kind 'bogus'"),
    ("db current --db postgresql://nobody@127.0.0.1:1/x", 1, "error: cannot reach database"),
    ("config show rollout --episodes 0", 2, "error: --episodes: Input should be greater than or equal to 1"),
    ("config show rollout --config {root}/nope.yaml", 1, "error: --config {root}/nope.yaml: no such file"),
]
NO_DB = ("config schema", "config show rollout", "models prepare")  # commands without --db


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory):
    from store.engine import open_store

    root = tmp_path_factory.mktemp("walk")
    open_store(str(root / "store.db"), create=True).dispose()
    return root


def test_the_walk_covers_every_command():
    from typer.main import get_command

    from cli.app import app

    def leaves(group, prefix=()):
        for name, command in group.commands.items():
            sub = getattr(command, "commands", None)
            yield from leaves(command, (*prefix, name)) if sub else [" ".join((*prefix, name))]

    commands = {c for c in leaves(get_command(app)) if not c.startswith("config show ")} | {"config show"}
    for command in commands - {"models prepare", "config schema"}:  # no world error (a package) or none at all
        codes = {code for line, code, _ in WALK if line == command or line.startswith(command + " ")}
        assert codes == {1, 2}, (command, codes)
    assert any(line.startswith("models prepare ") for line, _, _ in WALK)
    assert any(line.startswith("config schema ") for line, _, _ in WALK)


@pytest.mark.parametrize(("line", "code", "start"), WALK, ids=[w[0] for w in WALK])
def test_every_command_s_bad_input_is_one_line_with_its_exit_code(capsys, monkeypatch, empty_store, line, code,
                                                                 start):
    import shlex

    args = shlex.split(line.format(root=empty_store))
    if "--db" not in args and not line.startswith(NO_DB):
        args += ["--db", str(empty_store / "store.db")]
    def files() -> list[str]:  # SQLite's -wal and -shm files come and go with connections
        return sorted(p.name for p in empty_store.iterdir() if not p.name.endswith(("-wal", "-shm")))

    before = files()
    got, lines, out = agentmem(capsys, monkeypatch, *args)
    assert (got, len(lines)) == (code, 1), (lines, out)
    assert lines[0].startswith(start.format(root=empty_store)), lines[0]
    assert files() == before  # no database file made

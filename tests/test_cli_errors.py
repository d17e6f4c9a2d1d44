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
                              str(files / "value.yaml"), "--temperature", "-2")
    assert (code, lines) == (2, ["error: --temperature: Input should be greater than or equal to 0"])


@pytest.mark.parametrize(("args", "line"), [
    (["distill", "--run", "r", "--psd", "mixed"],
     "error: --psd mixed distils from the privileged teacher: set --teacher-context privileged"),
    (["distill", "--run", "r", "--teacher-source", "scores", "--teacher-temperature", "2"],
     "error: --teacher-temperature: --teacher-temperature 2.0 reads the teacher's full distribution: "
     "--teacher-source scores stores only the sampled token's log-prob (use --teacher-source model or shards)"),
    (["distill", "--run", "r", "--kd-weight", "0", "--rl", "none"],
     "error: every loss term has weight 0: set --kd-weight (with a teacher), --rl-weight (with --rl grpo), "
     "--ce-weight, --anchor-weight or a --loss-terms weight"),
    (["eval", "--temperature", "1"], "error: an evaluation is greedy: --temperature must be 0, got 1.0"),
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


@pytest.mark.parametrize(("url", "line"), [
    ("bogus://x", "error: unknown database kind 'bogus' in bogus://x: give sqlite:///PATH or "
                  "postgresql://USER@HOST/DB"),
    ("postgresql://someone@127.0.0.1:1/agentmem", "error: cannot reach database "
                                                  "postgresql://someone@127.0.0.1:1/agentmem: "),
])
def test_database_messages_show_the_url_as_written(capsys, monkeypatch, url, line):
    code, lines, _ = agentmem(capsys, monkeypatch, "runs", "--db", url)
    assert code == 1 and len(lines) == 1 and lines[0].startswith(line), lines
    assert "sqlalchemy" not in lines[0] and "+psycopg" not in lines[0]


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

"""The docs run as pasted: every shell block of README.md and of the docs' quick starts runs in bash, line by
line, in a fresh folder laid out as a clone, on a tiny random model standing in for the default one
(``$AGENTMEM_CACHE/models/SmolLM2-135M-Instruct``), and every line must exit 0. Every command a job prints for the
user to paste (``inspect:``, ``next:``, ``resume with:``) is run the same way, on SQLite and on Postgres.

A block runs verbatim unless the HTML comment right above its fence says otherwise:

- ``<!-- docs-test: smoke -->``: a long block, run with its sizes cut (``SMOKE_CUTS``: fewer episodes and
  workers, shorter contexts, no install);
- ``<!-- docs-test: skip: REASON -->``: not run, for the reason given (this suite itself, a GPU, hours).

The placeholders a doc writes for ids a command printed before (``RUN_ID``, ``ORACLE_RUN``, ``CHECKPOINT``,
``EPISODE_ID``, ``RUN``) are filled with the ids the commands printed; ``path/to/FILE`` with a small file in that
benchmark's format (``fixtures_envs``); ``USER@HOST:5432/agentmem`` with the test's Postgres database. A line that
starts ``agentmem view`` or ``agentmem serve`` is a server: it is started, asked for a page until it answers, and
stopped at once, or at the end of the block when it runs in the background (``&``, ``# terminal 1``). A line that
reports to trackers not installed here (``--report-to``) is left out.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from fixtures_envs import write_fixture

ROOT = Path(__file__).resolve().parents[2]
# the docs and, for a doc whose other sections are not a user's first commands, its quick-start section
DOCS = {"README.md": None, "docs/cli.md": None, "docs/serve.md": "From a fresh clone", "docs/workers.md": "Running",
        "docs/learning.md": "Reproduce"}
MARK = re.compile(r"<!--\s*docs-test:\s*(smoke|skip:\s*(.+?))\s*-->")
SMOKE_CUTS = [
    (re.compile(r"bash scripts/install\.sh( && )?"), ""),  # the suite runs in the installed environment
    (re.compile(r"--episodes \d+"), "--episodes 2"),
    (re.compile(r"--workers \d+"), "--workers 2"),
    (re.compile(r"context_tokens=\d+"), "context_tokens=512"),
    (re.compile(r"--device cuda:\d+"), "--device cpu"),
    (re.compile(r"--min-f1 0\.5"), "--min-f1 0"),  # a random model answers nothing right
    (re.compile(r"(--config examples/postgres_workers\.yaml)"), r"\1 --episodes 2 --group-size 1"),
]
# a line a job prints for the user to paste: the command after its label
PASTE = re.compile(r"(?:^|; )(?:inspect|next|resume with|start again with): (agentmem .+)$", re.M)
SERVER = re.compile(r"^(?:\S*/)?agentmem (view|serve)\b")
DATA = {"hotpot_dev_distractor_v1.json": "hotpotqa", "locomo10.json": "locomo", "dev-v1.1.json": "squad"}
TIMEOUT = 600


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # the fence's line, from 1
    text: str
    mark: str  # "" | "smoke" | "skip"
    reason: str = ""

    def lines(self) -> list[str]:
        """The block's commands: continuation lines joined, blank and comment lines dropped; cut in ``smoke``."""
        out: list[str] = []
        for raw in self.text.replace("\\\n", " ").splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if self.mark == "smoke":
                for pattern, repl in SMOKE_CUTS:
                    line = pattern.sub(repl, line).strip()
            if line:
                out.append(line)
        return out


def blocks(doc: str) -> list[Block]:
    """The ``bash`` blocks of ``doc`` (in its quick-start section when ``DOCS`` names one), with their marks."""
    section = DOCS[doc]
    lines = (ROOT / doc).read_text(encoding="utf-8").splitlines()
    out, heading, i = [], "", 0
    while i < len(lines):
        if lines[i].startswith("#"):
            heading = lines[i].lstrip("#").strip()
        if lines[i].startswith("```bash"):
            end = lines.index("```", i + 1)
            mark = MARK.search(lines[i - 1]) if i else None
            if section is None or heading == section:
                kind = "" if mark is None else "skip" if mark.group(2) else "smoke"
                out.append(Block(doc, i + 1, "\n".join(lines[i + 1:end]), kind, mark.group(2) if mark and
                                 mark.group(2) else ""))
            i = end
        i += 1
    return out


def command_env(work: Path, cache: Path, db: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENTMEM_DB"}
    env.update({"PATH": f"{work / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}", "AGENTMEM_CACHE": str(cache),
                "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                "PYTHONUNBUFFERED": "1", "COLUMNS": "200"})
    if db:
        env["AGENTMEM_DB"] = db
    return env


def tiny_without_nul():
    """A tiny random model that never writes a NUL character (byte 0's token), which ``agentmem serve`` refuses
    in a request, so an agent that sends its memory back cannot trip on it: dimension 0 of the residual stream is
    a constant no layer writes, and the token's (tied) weight on it is strongly negative."""
    import torch

    from agentmem.testing.tiny_models import tiny_llama, tiny_tokenizer

    model = tiny_llama()
    nul = tiny_tokenizer().convert_tokens_to_ids("\u0100")  # the byte-level form of byte 0
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.model.embed_tokens.weight[nul, 0] = -100.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0] = 0.0
            layer.mlp.down_proj.weight[0] = 0.0
    return model


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """An ``$AGENTMEM_CACHE`` whose default model is a tiny random one."""
    from agentmem.backends.model_files import DEFAULT_MODEL
    from agentmem.testing.tiny_models import save_tiny

    root = tmp_path_factory.mktemp("cache")
    save_tiny(root / "models" / DEFAULT_MODEL, tiny_without_nul())
    return root


def clone(work: Path) -> Path:
    """``work`` laid out as a clone: every entry of the checkout linked, nothing the commands write."""
    work.mkdir(parents=True, exist_ok=True)
    for entry in ROOT.iterdir():
        if entry.name in (".git", "agentmem.db", "agentmem.db.lock", "checkpoints") or entry.name.startswith(
                "agentmem.db"):
            continue
        (work / entry.name).symlink_to(entry)
    return work


@dataclass
class Shell:
    """Runs a doc's lines in bash in ``work``: placeholders filled, ids kept, pasted commands run too."""

    work: Path
    env: dict[str, str]
    pg_url: str | None = None
    ids: dict[str, str] = field(default_factory=dict)
    servers: list[subprocess.Popen] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)

    def db(self) -> str:
        return self.env.get("AGENTMEM_DB") or f"sqlite:///{self.work / 'agentmem.db'}"

    def fill(self, line: str) -> str:
        for name, kind in DATA.items():
            if f"path/to/{name}" in line:
                (self.work / "data").mkdir(exist_ok=True)
                line = line.replace(f"path/to/{name}", str(write_fixture(kind, self.work / "data")))
        if self.pg_url:
            line = line.replace("postgresql://USER@HOST:5432/agentmem", self.pg_url)
        if "EPISODE_ID" in line:
            engine = sa.create_engine(self.db().replace("postgresql://", "postgresql+psycopg://", 1))
            with engine.connect() as con:
                episode = con.execute(sa.text("select id from episodes where run_id = :r limit 1"),
                                      {"r": self.ids["RUN_ID"]}).scalar_one()
            engine.dispose()
            line = line.replace("EPISODE_ID", episode)
        for name in ("ORACLE_RUN", "RUN_ID", "CHECKPOINT", "RUN"):
            if re.search(rf"(?<![\w$=]){name}(?![\w=])", line):
                assert name in self.ids or name == "RUN" and "RUN_ID" in self.ids, f"{name} before any: {line}"
                line = re.sub(rf"(?<![\w$=]){name}(?![\w=])", self.ids.get(name) or self.ids["RUN_ID"], line)
        return line

    def run(self, line: str) -> str:
        """Run one line (or a server); its stdout. A non-zero exit fails the test with the line's output."""
        line = self.fill(line)
        if SERVER.match(line):
            return self.server(line)
        assign = re.match(r"(?:export\s+)?([A-Za-z_]\w*)=(.*)$", line)
        script = f'{line}\nprintf %s "${assign.group(1)}"' if assign else line
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", script], cwd=self.work, env=self.env, text=True,
                              capture_output=True, timeout=TIMEOUT)
        self.ran.append(line)
        assert proc.returncode == 0, f"$ {line}\nexit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        if assign:
            self.env[assign.group(1)] = proc.stdout
            return ""
        self.keep_ids(line, proc.stdout)
        for pasted in PASTE.findall(proc.stdout + proc.stderr):
            self.run(pasted)
        return proc.stdout

    def keep_ids(self, line: str, out: str) -> None:
        for run_id in re.findall(r"(?:^|\s)run_id=(\w+)", out, flags=re.M)[:1]:
            self.ids["RUN_ID"] = run_id
            if "--policy oracle" in line:
                self.ids["ORACLE_RUN"] = run_id
        for checkpoint in re.findall(r"\scheckpoint=(\w+)", out)[-1:]:
            self.ids["CHECKPOINT"] = checkpoint

    def server(self, line: str) -> str:
        """Start a server line, wait until its address answers; stop it unless it runs in the background."""
        background = line.rstrip().endswith("&") or "terminal 1" in line
        command = line.split("#")[0].strip().rstrip("&").strip()
        log = self.work / f"server-{len(self.ran)}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=self.work, env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT)
        self.servers.append(proc)
        deadline = time.monotonic() + 180
        url = None
        while True:
            if url is None and (match := re.search(r"http://[\d.]+:\d+/(?:v1)?", log.read_text())):
                url = match.group(0) + ("/models" if match.group(0).endswith("/v1") else "")
            try:
                if url is not None and httpx.get(url, timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, f"$ {command}\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        self.ran.append(line)
        if not background:
            self.stop()
        return log.read_text()

    def stop(self) -> None:
        for proc in self.servers:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        self.servers.clear()


def missing(line: str) -> str | None:
    """Why ``line`` cannot run here (a tracker or program not installed), or None."""
    trackers = re.search(r"--report-to (\S+)", line)
    for name in (trackers.group(1).split(",") if trackers else []):
        if importlib.util.find_spec(name) is None:
            return f"tracker {name} not installed"
    program = line.split()[0]
    if "/" not in program and "=" not in program and shutil.which(program) is None and program not in (
            "agentmem", "for", "export", "python"):
        return f"{program} not installed"
    return None


def run_doc(doc: str, work: Path, env: dict[str, str], pg_url: str | None = None) -> Shell:
    shell = Shell(clone(work), env, pg_url)
    try:
        for block in blocks(doc):
            if block.mark == "skip":
                continue
            for line in block.lines():
                if (why := missing(line)) is None:
                    shell.run(line)
                else:
                    print(f"left out ({why}): {line}")
            shell.stop()
    finally:
        shell.stop()
    return shell


def test_every_block_is_run_or_skipped_for_a_reason():
    """The marks parse: each skip says why, each smoke block is cut, and each doc has its blocks."""
    for doc in DOCS:
        found = blocks(doc)
        assert found, doc
        for block in found:
            assert block.mark != "skip" or block.reason, (doc, block.line)
            if block.mark == "smoke":
                assert block.lines() != Block(doc, block.line, block.text, "").lines(), (doc, block.line)


def test_smoke_cuts_sizes_and_keeps_the_command():
    block = Block("x", 1, "bash scripts/install.sh && .venv/bin/agentmem rollout --episodes 512 --workers 4\n"
                          "# a comment\nagentmem worker --run RUN --device cuda:0   # on each machine", "smoke")
    assert block.lines() == [".venv/bin/agentmem rollout --episodes 2 --workers 2",
                             "agentmem worker --run RUN --device cpu   # on each machine"]


def test_placeholders_are_filled_with_the_printed_ids(tmp_path):
    shell = Shell(tmp_path, {}, ids={"RUN_ID": "r1", "ORACLE_RUN": "o1", "CHECKPOINT": "c1"})
    assert shell.fill("agentmem sft --run ORACLE_RUN") == "agentmem sft --run o1"
    assert shell.fill("agentmem report --run RUN_ID --out x") == "agentmem report --run r1 --out x"
    assert shell.fill("agentmem worker --run RUN  # prints run_id=RUN") == "agentmem worker --run r1  # prints run_id=RUN"
    assert shell.fill('agentmem score --run $RUN --teacher default') == "agentmem score --run $RUN --teacher default"
    assert shell.fill("agentmem eval --model CHECKPOINT") == "agentmem eval --model c1"


def test_the_stand_in_model_never_writes_nul():
    import torch

    from agentmem.testing.tiny_models import tiny_tokenizer

    tok = tiny_tokenizer()
    ids = torch.tensor([tok("Question: where does Bob live? Memory: Bob lives in Oslo.")["input_ids"]])
    with torch.no_grad():
        probs = tiny_without_nul()(ids).logits.softmax(-1)
    nul = tok.convert_tokens_to_ids("\u0100")
    assert tok.decode([nul]) == "\x00" and float(probs[..., nul].max()) < 1e-12


def test_pasted_commands_are_found_after_their_label():
    out = ("run_id=r\ninspect: agentmem sql \"select 1\" --db x.db\nreplay_run_id=r episodes=1 calls=1\n"
           "next: agentmem distill --run r --rl none\ninterrupted: 3 calls stored; resume with: agentmem rollout "
           "--resume r\n")
    assert PASTE.findall(out) == ['agentmem sql "select 1" --db x.db', "agentmem distill --run r --rl none",
                                  "agentmem rollout --resume r"]


@pytest.mark.slow
@pytest.mark.parametrize("doc", [d for d in DOCS if d != "docs/workers.md"])
def test_the_docs_run_as_pasted(doc, cache, tmp_path):
    shell = run_doc(doc, tmp_path / "clone", command_env(tmp_path / "clone", cache))
    assert shell.ran or all(b.mark == "skip" for b in blocks(doc))


@pytest.mark.slow
@pytest.mark.postgres
def test_the_workers_quick_start_runs_on_postgres(cache, tmp_path, db_url):
    if not db_url.startswith("postgresql"):
        pytest.skip("the workers' quick start is a Postgres one")
    shell = run_doc("docs/workers.md", tmp_path / "clone", command_env(tmp_path / "clone", cache), pg_url=db_url)
    assert any("agentmem worker" in line for line in shell.ran)


@pytest.mark.slow
def test_every_printed_command_runs_as_pasted(db_url, cache, tmp_path):
    """The commands the jobs print (``inspect:`` after rollout, eval and score; ``next:`` after a replay;
    ``resume with:`` after Ctrl-C) run in bash as printed, each naming the database its job was given."""
    shell = Shell(clone(tmp_path / "clone"), command_env(tmp_path / "clone", cache))
    db = f"--db {db_url}"
    shell.run(f"agentmem db upgrade {db}")  # a Postgres database is made by hand (a SQLite file by rollout)
    shell.run(f"agentmem rollout --episodes 2 {db}")
    rollout = shell.ids["RUN_ID"]
    shell.run(f"agentmem eval --episodes 2 {db}")
    shell.run(f"agentmem score --run {rollout} --teacher default {db}")
    shell.run(f"agentmem rollout --replay-from {rollout} --group-size 2 {db}")
    proc = subprocess.Popen(["bash", "-c", f"exec agentmem rollout --episodes 4 {db}"], cwd=shell.work, env=shell.env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = proc.stdout.readline() if proc.stdout else ""
    assert first.startswith("run_id="), first
    proc.send_signal(signal.SIGINT)
    out = first + proc.communicate(timeout=TIMEOUT)[0]
    assert proc.returncode == 130, out
    pasted = PASTE.findall(out)
    assert len(pasted) == 1 and pasted[0].startswith("agentmem rollout --resume ") and pasted[0].endswith(db), out
    shell.run(pasted[0])
    assert all(line.endswith(db) for line in shell.ran), shell.ran
    assert [line.split()[1] for line in shell.ran] == ["db", "rollout", "sql", "eval", "sql", "score", "sql",
                                                        "rollout", "distill", "rollout", "sql"], shell.ran

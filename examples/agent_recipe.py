"""End to end: an OpenAI Agents SDK agent runs tasks through `agentmem serve` on a teacher, rewards are posted,
a student is trained on that run with `agentmem sft` then `agentmem distill`, and every model is evaluated on the
same tasks through `agentmem serve` again. See docs/frameworks.md.

    python examples/agent_recipe.py --tiny        # tiny random teacher and student: the pipeline only
    python examples/agent_recipe.py --teacher TEACHER_FOLDER --student default --tasks 32 --level 1

The teacher needs the student's tokenizer (distill compares their distributions token by token): for the default
student SmolLM2-135M-Instruct, a larger SmolLM2 Instruct model's folder.

Each stage is the command a user types (`agentmem serve`, `sft`, `distill`), run as a child process on one
SQLite store (`--workdir`/recipe.db); the last lines are a table of mean F1 per model.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI

from agentmem.records import Task
from envs.metrics import score_answer
from envs.synthetic import SyntheticEnv

INSTRUCTIONS = "Read the text and answer the question with the answer's words only."
AGENTMEM = [sys.executable, "-m", "cli.app"]


def tasks(n: int, level: int, seed: int) -> list[Task]:
    """The synthetic environment's first ``n`` tasks at ``level``: a question, its text and its gold answer."""
    return SyntheticEnv(count_tokens=lambda s: len(s.split()), chunk_tokens=10_000, seed=seed, level=level).tasks(n)


async def run_task(root: str, task: Task, episode: str, temperature: float, max_tokens: int) -> float:
    """One agent run in its own episode (`/episodes/EPISODE/v1`), then its F1 posted as the episode's reward.
    The chat completions model, not the SDK's default Responses model: that one raises on a reply cut by
    `max_tokens` (`response.incomplete`), where a cut answer should just score low."""
    async with AsyncOpenAI(base_url=f"{root}/episodes/{episode}/v1", api_key="unused", max_retries=0) as client:
        agent = Agent(name="reader", instructions=INSTRUCTIONS, model=OpenAIChatCompletionsModel("agent", client),
                      model_settings=ModelSettings(temperature=temperature, max_tokens=max_tokens,
                                                   extra_headers={"X-Agentmem-Task": task.task_id,
                                                                  "X-Agentmem-Kind": "answer"}))
        result = await Runner.run(agent, f"Text: {' '.join(task.chunks)}\n\nQuestion: {task.question}",
                                  max_turns=1)
    prediction = str(result.final_output)
    f1 = score_answer(prediction, task.answers).f1  # HotpotQA's answer F1, best over the gold answers
    async with httpx.AsyncClient() as http:
        posted = await http.post(f"{root}/agentmem/episodes/{episode}/reward",
                                 json={"reward": f1, "metrics": {"f1": f1}, "prediction": prediction})
        posted.raise_for_status()
    return f1


@contextlib.contextmanager
def serving(model: str, db: str, device: str, log: Path) -> Iterator[tuple[str, str]]:
    """`agentmem serve --model MODEL` (a new serve run) on a free port; yields (root URL, run id); stopped with
    SIGINT."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(log, "a") as out:
        proc = subprocess.Popen([*AGENTMEM, "serve", "--model", model, "--served-model-name", "agent", "--db", db,
                                 "--port", str(port), "--device", device],
                                stdout=out, stderr=subprocess.STDOUT)
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"agentmem serve exited with {proc.returncode}: see {log}")
            with contextlib.suppress(httpx.HTTPError):
                health = httpx.get(f"{root}/health")
                if health.status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"agentmem serve did not start in 600 s: see {log}")
            time.sleep(0.2)
        yield root, health.json()["run"]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)


def run_agent(model: str, db: str, device: str, log: Path, items: list[Task], samples: int,
              temperature: float, max_tokens: int) -> tuple[str, float]:
    """Serve ``model`` and run every task ``samples`` times, concurrently; the serve run id and the mean F1."""
    with serving(model, db, device, log) as (root, run_id):
        async def all_tasks() -> list[float]:
            return await asyncio.gather(*(run_task(root, task, f"{task.task_id}.{k}", temperature, max_tokens)
                                          for task in items for k in range(samples)))
        f1s = asyncio.run(all_tasks())
    return run_id, sum(f1s) / len(f1s)


def train(command: str, args: list[str], log: Path) -> str:
    """Run `agentmem sft|distill ARGS`; the folder of the checkpoint it printed last."""
    with open(log, "a") as out:
        done = subprocess.run([*AGENTMEM, command, *args], stdout=subprocess.PIPE, stderr=out, text=True)
        out.write(done.stdout)
    if done.returncode != 0:
        raise RuntimeError(f"agentmem {command} failed ({done.returncode}): see {log}")
    return re.findall(r" path=(\S+)", done.stdout)[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny random teacher and student, short runs (CI)")
    parser.add_argument("--teacher", default="default", help="the teacher: a model folder or checkpoint id")
    parser.add_argument("--student", default="default", help="the student to train: a model folder or 'default'")
    parser.add_argument("--workdir", type=Path, default=Path("agent_recipe"), help="store, checkpoints and logs")
    parser.add_argument("--tasks", type=int, default=16, help="tasks of the synthetic environment")
    parser.add_argument("--level", type=int, default=1, help="the synthetic environment's level (0..4)")
    parser.add_argument("--samples", type=int, default=4, help="teacher runs per task (a GRPO group)")
    parser.add_argument("--min-f1", type=float, default=0.5, help="sft trains on episodes with F1 >= this")
    parser.add_argument("--sft-steps", type=int, default=16)
    parser.add_argument("--distill-steps", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    set_tracing_disabled(True)  # the Agents SDK would send traces to OpenAI
    args.workdir.mkdir(parents=True, exist_ok=True)
    db, log = f"sqlite:///{args.workdir.resolve() / 'recipe.db'}", args.workdir / "recipe.log"
    if args.tiny:
        from agentmem.testing.tiny_models import save_tiny, tiny_llama

        args.teacher = save_tiny(args.workdir / "teacher", tiny_llama(seed=1))
        args.student = save_tiny(args.workdir / "student", tiny_llama(seed=2))
        args.tasks, args.level, args.samples, args.min_f1 = 4, 0, 2, 0.0
        args.sft_steps, args.distill_steps, args.max_tokens = 2, 2, 8
    items, device = tasks(args.tasks, args.level, seed=0), "cpu" if args.tiny else "auto"
    start = time.monotonic()

    def say(line: str) -> None:
        print(f"[{time.monotonic() - start:5.0f} s] {line}", flush=True)


    teacher_run, teacher_f1 = run_agent(args.teacher, db, device, log, items, args.samples, 1.0,
                                        args.max_tokens)
    say(f"teacher run {teacher_run}: {len(items) * args.samples} episodes, mean F1 {teacher_f1:.3f} (T=1)")
    common = ["--run", teacher_run, "--db", db, "--device", device]
    sft = train("sft", [*common, "--student", args.student, "--min-f1", str(args.min_f1),
                        "--steps", str(args.sft_steps), "--out", str(args.workdir / "sft")], log)
    say(f"sft checkpoint {sft}")
    distilled = train("distill", [*common, "--student", sft, "--teacher", args.teacher, "--teacher-context",
                                  "aligned", "--steps", str(args.distill_steps),
                                  "--out", str(args.workdir / "distill")], log)
    say(f"distill checkpoint {distilled}")

    rows = []
    for label, model in (("teacher", args.teacher), ("student", args.student), ("student + sft", sft),
                         ("student + sft + distill", distilled)):
        run_id, f1 = run_agent(model, db, device, log, items, 1, 0.0, args.max_tokens)
        rows.append((label, run_id, f1))
        say(f"evaluated {label}")
    print(f"\nmean F1 on the same {len(items)} tasks, greedy, through agentmem serve:")
    print(f"{'model':<24} {'serve run':<12} {'F1':>6}")
    for label, run_id, f1 in rows:
        print(f"{label:<24} {run_id[:12]:<12} {f1:>6.3f}")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()

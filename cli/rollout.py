"""``agentmem rollout``: collect agent trajectories into the store."""

from __future__ import annotations

from typing import Annotated

import typer

from agentmem.config import BackendKind, Device, DType, PolicySource, PromptLayout
from agentmem.records import SamplingContext
from cli.options import DbOption, DeviceOption, EnvName, GenDType, GenDTypeOption, LevelOption, ThreadsOption


def rollout(
    env: Annotated[EnvName, typer.Option(help="Environment.")] = EnvName("synthetic"),
    data: Annotated[str | None, typer.Option(help="Data file in the benchmark's official JSON format.")] = None,
    knob: Annotated[list[str], typer.Option(help="Environment knob KEY=VALUE (repeatable), e.g. hops=3, "
                                                 "context_tokens=4096, docs=20.")] = [],  # noqa: B006
    level: LevelOption = None,
    model: Annotated[str, typer.Option(help="Model folder, hub name, checkpoint id, or 'default' "
                                            "(SmolLM2-135M-Instruct, prepared on first use).")] = "default",
    policy: Annotated[PolicySource, typer.Option(
        help="Who writes the outputs: the model (sampled, with log-probs) or the oracle (scripted from the "
             "task's evidence and gold answer: no model, no log-probs; --model gives only the tokenizer and "
             "chat template).")] = PolicySource.model,
    backend: Annotated[BackendKind, typer.Option(help="Generation backend (openai: a client of an `agentmem serve` "
                                                      "server at --base-url serving --model).")] = BackendKind.transformers,
    base_url: Annotated[str | None, typer.Option(help="With --backend openai: the server's URL, e.g. "
                                                      "http://127.0.0.1:8000/v1.", show_default=False)] = None,
    dtype: GenDTypeOption = GenDType("float32"),
    episodes: Annotated[int, typer.Option(help="Number of tasks.")] = 8,
    group_size: Annotated[int, typer.Option(help="Episodes sampled per task (for group-normalised RL).")] = 1,
    seed: Annotated[int, typer.Option(help="Seed for task order and sampling.")] = 0,
    temperature: Annotated[float, typer.Option(help="Sampling temperature; 0 = greedy.")] = 1.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling threshold.")] = 1.0,
    chunk_tokens: Annotated[int, typer.Option(help="Tokens per chunk the agent reads per call.")] = 512,
    memory_tokens: Annotated[int, typer.Option(help="Memory budget in tokens (max new tokens of an update).")]
    = 128,
    answer_tokens: Annotated[int, typer.Option(help="Max new tokens of the answer call.")] = 32,
    max_chunks: Annotated[int | None, typer.Option(help="Read at most this many chunks (episode truncated).")]
    = None,
    memory_policy: Annotated[str, typer.Option(
        "--memory", "--memory-policy",
        help="Memory policy (registered name): overwrite (MemAgent), log (PRO-LONG), events (MemPrism), "
             "routed (Router-Mem), teacher (AMD/DuoMem memories); see docs/memory.md.")] = "overwrite",
    memory_option: Annotated[list[str], typer.Option(
        help="Memory policy option KEY=VALUE (repeatable), e.g. condition=windowed-log, threshold=0.5; each "
             "policy's options are in docs/memory.md.")] = [],  # noqa: B006
    prompt_layout: Annotated[PromptLayout, typer.Option(
        help="Update prompt order: chunk-first (question, chunk, memory: a task's samples share the prefix) "
             "or memory-first (MemAgent's order).")] = PromptLayout.chunk_first,
    batch: Annotated[int, typer.Option(help="Calls per backend batch (across episodes).")] = 8,
    device: DeviceOption = Device.auto,
    threads: ThreadsOption = None,
    context: Annotated[SamplingContext, typer.Option(
        help="Prompt the model samples from: aligned (the task prompt) or privileged (the episode's gold "
             "answer and evidence as a system message before every prompt, stored apart: PSD's off-policy "
             "samples, `distill --psd off_policy`).")] = SamplingContext.aligned,
    replay_from: Annotated[str | None, typer.Option(
        help="ReOPD: branch from stored run RUN_ID instead of reading an environment: per episode one step t "
             "drawn with P(t) ∝ kappa^t, sampled --group-size times by --model from the stored prompt; "
             "stored as a replay run (no reward). Environment and memory flags do not apply.",
        show_default=False)] = None,
    kappa: Annotated[float, typer.Option(help="ReOPD: decay of the branch-step distribution P(t) ∝ kappa^t "
                                              "(with --replay-from).")] = 0.6,
    resume: Annotated[str | None, typer.Option(help="Finish run RUN_ID (its stored config is used).")] = None,
    workers: Annotated[int, typer.Option(
        help="Local worker processes: 1 does the calls in this process; N > 1 writes the run and its episodes, "
             "then starts N `agentmem worker --run RUN_ID` processes that share them (each loads the model). "
             "More workers on other machines may join with `agentmem worker`.", min=1)] = 1,
    db: DbOption = None,
) -> None:
    """Run the memory agent over an environment and stream every call to the store.

    With no flags: 8 synthetic tasks with the default model on sqlite:///agentmem.db (measured on a 2-core
    CPU: about 10 minutes of CPU time, 29 minutes of wall time while other jobs shared the cores). Kill it at
    any time (Ctrl-C prints the command that resumes); `--resume RUN_ID` finishes the run without duplicating
    rows.
    `--replay-from RUN_ID` samples ReOPD's single calls branched from a stored teacher run instead.
    """
    from agentmem.config import AgentConfig, RolloutConfig
    from agentmem.jobs.rollout import run_rollout
    from agentmem.records import RunKind
    from cli.agent_progress import episode_progress
    from cli.common import env_knobs, parse_knobs, preflight, runtime, setup_logging, weights_dtype
    from cli.job_session import job_session
    from store.engine import open_store

    auto = str(dtype) == "auto" and not resume  # measured once the flags are validated
    dtype = DType.float32 if str(dtype) == "auto" else DType(str(dtype))
    if replay_from is not None or kappa != 0.6 or (resume and _is_replay(resume, db)):
        dtype = weights_dtype("auto", model, db, threads) if auto else dtype
        _replay(replay_from, resume, kappa=kappa, model=model, backend=backend, dtype=dtype, group_size=group_size,
                seed=seed, temperature=temperature, top_p=top_p, batch=batch, device=device, threads=threads, db=db,
                rest={"--env": env.value != "synthetic", "--data": data is not None, "--knob": bool(knob),
                      "--level": level is not None, "--policy": policy is not PolicySource.model,
                      "--episodes": episodes != 8, "--chunk-tokens": chunk_tokens != 512,
                      "--memory-tokens": memory_tokens != 128, "--answer-tokens": answer_tokens != 32,
                      "--max-chunks": max_chunks is not None, "--memory": memory_policy != "overwrite",
                      "--memory-option": bool(memory_option),
                      "--prompt-layout": prompt_layout is not PromptLayout.chunk_first,
                      "--context": context is not SamplingContext.aligned})
        return
    config = None
    if not resume:
        config = RolloutConfig(
            env=env.value, data=data, env_knobs=env_knobs(env.value, knob, level), model=model, policy=policy, backend=backend,
            base_url=base_url, dtype=dtype,
            episodes=episodes, group_size=group_size, seed=seed, chunk_tokens=chunk_tokens,
            agent=AgentConfig(memory_tokens=memory_tokens, answer_max_new_tokens=answer_tokens,
                              max_chunks=max_chunks, temperature=temperature, top_p=top_p, max_batch=batch,
                              seed=seed, memory_policy=memory_policy, prompt_layout=prompt_layout,
                              memory_options=parse_knobs(memory_option)),
            context=context,
        )
    preflight(db, resume=resume, kind=RunKind.rollout, models=(config.model,) if config else (),
              data=config.data if config else None, create=True)
    if config is not None and auto:
        config = config.model_copy(update={"dtype": weights_dtype("auto", model, db, threads)})
    if workers > 1:
        _with_workers(workers, config, resume, db=db, device=device, threads=threads)
        return
    rt = runtime(device, threads)
    setup_logging()
    store = open_store(db, create=True)
    with job_session(db), episode_progress("rollout") as bar:
        result = run_rollout(store, config, rt, resume=resume, on_start=bar.on_start, on_round=bar.on_round)
    _summary(result)
    if config is not None and config.model == "default" and config.policy is PolicySource.model:
        typer.echo(UNTRAINED_NOTE)


# The quick start's last line: an untrained 135M model scoring 0 is the expected first result, not a failure.
UNTRAINED_NOTE = ("note: the untrained SmolLM2-135M scores near 0 here; that is expected. To see learning: "
                  "agentmem rollout --policy oracle, then agentmem sft --run ORACLE_RUN, then agentmem eval --model "
                  "CHECKPOINT (docs/learning.md)")


def summary_query(run_id: str) -> str:
    """The narrow query a rollout suggests: what was asked, the gold and predicted answers, F1, calls."""
    return ("select question, gold, prediction, f1, n_calls, status from episode_summary "
            f"where run_id = '{run_id}'")


def _summary(result) -> None:
    from rich.table import Table

    from cli.console import console

    eps = result.episodes
    done = [e for e in eps if e.f1 is not None]

    def mean(xs):
        return sum(xs) / len(xs) if xs else float("nan")

    table = Table(title=f"run {result.run_id}")
    for col in ("episodes", "answered", "truncated", "failed", "F1", "EM", "substring EM"):
        table.add_column(col, justify="right")
    by = {s: sum(1 for e in eps if e.status.value == s) for s in ("answered", "truncated", "failed")}
    table.add_row(str(len(eps)), str(by["answered"]), str(by["truncated"]), str(by["failed"]),
                  f"{mean([e.f1 for e in done]):.3f}", f"{mean([e.em for e in done]):.3f}",
                  f"{mean([e.sub_em for e in done]):.3f}")
    console().print(table)
    typer.echo(f"inspect: agentmem sql \"{summary_query(result.run_id)}\"")


def _with_workers(n: int, config, resume: str | None, *, db: str | None, device: Device, threads: int | None) -> None:
    """``rollout --workers N``: the run and its episodes are written here, the calls by N local workers."""
    from agentmem.errors import RunError
    from agentmem.jobs.rollout import LeaseTerms, RolloutResult, create_rollout
    from cli.common import runtime, setup_logging
    from cli.worker import start_workers
    from store import repository as repo
    from store.engine import open_store

    runtime(device, threads)  # a bad --device or --threads fails here, before any worker starts
    setup_logging()
    store = open_store(db, create=True)
    run_id = create_rollout(store, config, resume=resume)
    typer.echo(f"run_id={run_id}")
    terms = LeaseTerms()
    codes = start_workers(n, run_id, db=db, device=device.value, threads=threads, lease_seconds=terms.seconds,
                          max_attempts=terms.max_attempts)
    with store.session() as s:
        episodes = repo.list_episodes(s, run_id)
    left = sum(1 for e in episodes if e.status.value == "running")
    if left or any(codes):
        failed = sum(1 for c in codes if c)
        raise RunError(f"run {run_id}: {failed} of {n} workers failed and {left} episodes are still running: "
                       f"finish it with `agentmem worker --run {run_id}`")
    _summary(RolloutResult(run_id=run_id, episodes=episodes, resumed_episodes=0, policy=None))


def _replay(replay_from: str | None, resume: str | None, *, kappa: float, model: str, backend: BackendKind,
            dtype: DType, group_size: int, seed: int, temperature: float, top_p: float, batch: int, device: Device,
            threads: int | None, db: str | None, rest: dict[str, bool]) -> None:
    """``rollout --replay-from``: ReOPD's replay run (``agentmem.jobs.replay``)."""
    from agentmem.config import ReplayConfig
    from agentmem.errors import ConfigError
    from agentmem.jobs.replay import run_replay
    from agentmem.records import RunKind
    from cli.common import preflight, runtime, setup_logging
    from cli.job_session import job_session
    from store.engine import open_store

    config = None
    if resume is None:
        if replay_from is None:
            raise ConfigError("--kappa weights the branch steps of a replay: give --replay-from RUN_ID")
        given = [flag for flag, on in rest.items() if on]
        if given:
            raise ConfigError(f"--replay-from takes the tasks, prompts and token limits from the teacher run: "
                              f"{', '.join(given)} do(es) not apply")
        config = ReplayConfig(teacher_run=replay_from, model=model, backend=backend, dtype=dtype,
                              group_size=group_size, kappa=kappa, seed=seed, temperature=temperature, top_p=top_p,
                              max_batch=batch)
    preflight(db, resume=resume or replay_from, kind=RunKind.replay if resume else RunKind.rollout,
              models=(model,) if config else ())
    rt = runtime(device, threads)
    setup_logging()
    store = open_store(db, create=True)
    with job_session(db):
        result = run_replay(store, config, rt, resume=resume)
    failed = sum(1 for e in result.episodes if e.status.value == "failed")
    typer.echo(f"replay_run_id={result.run_id} episodes={len(result.episodes)} calls={result.calls}"
               + (f" failed={failed}" if failed else "")
               + f"  (train: agentmem distill --run {result.run_id} --rl none)")


def _is_replay(run_id: str, db: str | None) -> bool:
    from agentmem.records import RunKind
    from store import repository as repo
    from store.engine import open_store

    with open_store(db).session() as s:
        return repo.get_run(s, run_id).kind is RunKind.replay


def replay_audit(
    student_run: Annotated[str, typer.Option(help="A normal rollout of the student (its on-policy states).")],
    teacher_run: Annotated[str, typer.Option(help="The teacher (or oracle) rollout ReOPD branches from.")],
    db: DbOption = None,
) -> None:
    """ReOPD's state-coverage audit: the share of the student's calls whose state (task, step, call kind,
    memory read) the teacher run visited, in all and per step."""
    from agentmem.jobs.replay import audit_coverage
    from store.engine import open_store

    cov = audit_coverage(open_store(db), student_run, teacher_run)
    later = cov.share_after_first
    typer.echo(f"coverage={cov.share:.4f} matched={cov.matched} student_calls={cov.total} "
               f"teacher_states={cov.teacher_states}"
               + (f" coverage_after_step0={later:.4f}" if later is not None else ""))
    for step, (matched, total) in cov.by_step.items():
        typer.echo(f"step={step} matched={matched} of={total} share={matched / total:.4f}")


def register(app: typer.Typer) -> None:
    app.command()(rollout)
    app.command("replay-audit")(replay_audit)

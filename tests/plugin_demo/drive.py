"""Drives agentmem's jobs with the demo package's policy, environment or loss term (``python drive.py SEAM
FOLDER``) and prints what the store holds as one JSON line. ``tests/plugin_demo/test_plugins.py`` runs it in a fresh
process whose ``PYTHONPATH`` holds the demo package, installed as a ``.dist-info`` with entry points."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from agentmem.config import AgentConfig, DistillConfig, PolicySource, RolloutConfig, ScoreConfig, SftConfig
from agentmem.errors import AgentmemError
from agentmem.jobs.distill import run_distill
from agentmem.jobs.rollout import run_rollout
from agentmem.jobs.score import run_score
from agentmem.jobs.sft import run_sft
from agentmem.testing.tiny_models import save_tiny
from agentmem.view.training import training_context
from cli.training_progress import LineProgress
from store import repository as repo
from store.engine import make_engine, open_store
from store.migrations import upgrade

SYNTH = {"context_tokens": 100, "distractors": 1, "hops": 1}


def calls(store, run_id):
    with store.session() as s:
        episodes = repo.list_episodes(s, run_id)
        invocations = list(repo.stream_invocations(s, run_ids=[run_id]))
    return episodes, invocations


def error(fn) -> str:
    try:
        fn()
    except AgentmemError as exc:
        return str(exc)
    return ""


def steps(store, run_id):
    with store.session() as s:
        return [t.metrics | {"loss": t.loss} for t in repo.list_train_steps(s, run_id)]


def policy_seam(store, model, out):
    agent = AgentConfig(memory_policy="jotter", memory_options={"lines": 1}, memory_tokens=6, answer_max_new_tokens=3)
    sampled = run_rollout(store, RolloutConfig(model=model, episodes=2, group_size=2, chunk_tokens=48,
                                               env_knobs=SYNTH, agent=agent)).run_id
    oracle = run_rollout(store, RolloutConfig(model=model, policy=PolicySource.oracle, episodes=2, chunk_tokens=48,
                                              env_knobs=SYNTH, agent=agent.model_copy(update={
                                                  "memory_tokens": 32, "answer_max_new_tokens": 32}))).run_id
    scored = run_score(store, ScoreConfig(run_ids=[sampled], teacher=model, kinds="jot"))
    distilled = run_distill(store, DistillConfig(run_ids=[sampled], student=model, kinds="jot", out=str(out / "d"), teacher=dict(model=model), optim=dict(steps=1), batch=dict(invocations_per_step=4)))
    tuned = run_sft(store, SftConfig(run_ids=[oracle], student=model, kinds="jot", out=str(out / "s"), optim=dict(steps=1), batch=dict(invocations_per_step=4)))
    with store.session() as s:
        n_scores = s.execute(sa.text("select count(*) from teacher_scores")).scalar()
    eps, invs = calls(store, sampled)
    oeps, oinvs = calls(store, oracle)
    return {
        "kinds": sorted({(i.kind, i.memory_policy) for i in invs}),
        "oracle_kinds": sorted({(i.kind, i.role) for i in oinvs}),
        "oracle_f1": sorted(e.f1 for e in oeps),
        "oracle_jots": sorted({i.output_text for i in oinvs if i.kind == "jot"}),
        "gold_facts": sorted({e.evidence[0] for e in oeps if e.evidence} | {"nothing"}),
        "jot_calls": sum(i.kind == "jot" for i in invs), "scored": scored.scored, "score_rows": n_scores,
        "distill_steps": len(steps(store, distilled.run_id)), "sft_steps": len(steps(store, tuned.run_id)),
        "status": sorted({e.status.value for e in eps}),
        "bad_kind": error(lambda: run_score(store, ScoreConfig(run_ids=[sampled], teacher=model, kinds="jotting"))),
        "bad_option": error(lambda: run_rollout(store, RolloutConfig(
            model=model, policy=PolicySource.oracle, episodes=1, env_knobs=SYNTH,
            agent=agent.model_copy(update={"memory_options": {"line": 1}})))),
    }


def env_seam(store, model, out):
    from envs import env_names, knobs_of

    agent = AgentConfig(memory_tokens=24, answer_max_new_tokens=4)
    run = run_rollout(store, RolloutConfig(env="riddles", env_knobs={"n_riddles": 2}, model=model,
                                           policy=PolicySource.oracle, episodes=5, chunk_tokens=48, agent=agent))
    eps, invs = calls(store, run.run_id)
    # the command line takes both at parse time: --env riddles (a choice) and --memory jotter
    cli = subprocess.run([sys.executable, "-m", "cli.app", "rollout", "--env", "riddles", "--knob", "n_riddles=1",
                          "--memory", "jotter", "--policy", "oracle", "--model", model, "--episodes", "1",
                          "--db", store.url], capture_output=True, text=True, timeout=300)
    cli_run = cli.stdout.split("run_id=")[1].split()[0] if "run_id=" in cli.stdout else None
    cli_eps, cli_invs = calls(store, cli_run) if cli_run else ([], [])
    return {"names": list(env_names()[-1:]), "knobs": knobs_of("riddles"),
            "cli": [cli.returncode, sorted((e.task_id, e.prediction) for e in cli_eps),
                    sorted({(i.kind, i.memory_policy) for i in cli_invs})],
            "episodes": sorted((e.task_id, e.gold_answers[0], e.prediction, e.f1) for e in eps),
            "updates": sorted({i.output_text for i in invs if i.kind == "memory_update"}),
            "bad_knob": error(lambda: run_rollout(store, RolloutConfig(env="riddles", env_knobs={"riddles": 2},
                                                                       model=model, policy=PolicySource.oracle)))}


def loss_seam(store, model, out):
    oracle = run_rollout(store, RolloutConfig(model=model, policy=PolicySource.oracle, episodes=2, chunk_tokens=48,
                                              env_knobs=SYNTH, agent=AgentConfig(memory_tokens=8))).run_id
    config = DistillConfig(run_ids=[oracle], student=model, out=str(out / "d"), teacher=dict(model=None), loss=dict(kd_weight=0, terms={"entropy_bonus": 1.0}), rl=dict(kind="none"), optim=dict(steps=2, lr=1e-3), batch=dict(invocations_per_step=4))
    progress = LineProgress("distill", stream=io.StringIO())  # the progress line, as on a pipe
    result = run_distill(store, config, on_start=progress.on_start, on_step=progress.on_step)
    with store.session() as s:
        page = training_context(s, result.run_id)  # the viewer's training page
    bad = config.model_copy(update={"loss": config.loss.model_copy(update={"terms": {"entropy_bonsu": 1.0}})})
    return {"steps": steps(store, result.run_id), "progress": progress.stream.getvalue().splitlines(),
            "viewer_terms": page["terms"], "viewer_charts": "".join(page["charts"]),
            "bad_term": error(lambda: run_distill(store, bad))}


if __name__ == "__main__":
    seam, folder = sys.argv[1], Path(sys.argv[2])
    url = f"sqlite:///{folder / 'agentmem.db'}"
    upgrade(make_engine(url))
    store = open_store(url)
    model = save_tiny(folder / "tiny")
    result = {"policy": policy_seam, "env": env_seam, "loss": loss_seam}[seam](store, model, folder)
    print(json.dumps(result))

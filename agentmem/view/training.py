"""The training page (``/runs/{id}/training``) and the eval plots page (``/evals``).

Training: the loss and each loss term (``term_series``: every term a step reports in its metrics, built-in or a
plugin's), KL, clip fraction and tokens/s against the step, from ``train_steps`` (a panel or a line of
a term that is off, such as an sft run's KL and clip fraction, is left out); eval F1 (with
its 95% interval) against the step, from the ``eval_results`` of the run's checkpoints (an eval run: its
own results). A train run shows its rounds' distill runs one after another (steps numbered on).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from agentmem.plots import series as eval_series
from agentmem.records import EvalResult, Run, RunKind, TrainStep
from agentmem.view import svg
from agentmem.view.render import Links, render
from store import repository as repo

router = APIRouter()


def round_runs(train: Run, distills: list[Run]) -> list[Run]:
    """The distill runs of a train run's rounds (their ``out`` is ``<distill.out>/<train id>/round-N``), in
    round order."""
    base = Path(str((train.config.get("distill") or {}).get("out", "checkpoints"))) / train.id
    rounds = [d for d in distills if d.config.get("out") and Path(d.config["out"]).parent == base]
    return sorted(rounds, key=lambda d: (Path(d.config["out"]).name, d.created_at))


def numbered_steps(per_run: list[list[TrainStep]]) -> list[tuple[int, TrainStep]]:
    """(step, record) over runs trained one after another: each run's steps continue from the last."""
    out, offset = [], 0
    for steps in per_run:
        out += [(offset + s.step, s) for s in steps]
        offset += max((s.step for s in steps), default=0)
    return out


def term_series(steps: list[tuple[int, TrainStep]]) -> dict[str, list[tuple[int, float]]]:
    """Each loss term's (step, value) points, by term name (built-in and plugin alike, from each step's
    ``term_losses``), names sorted; a term that is off in a step has no point there."""
    names = sorted({name for _, s in steps for name in s.term_losses})
    return {name: [(x, s.term_losses[name]) for x, s in steps if name in s.term_losses] for name in names}


def step_charts(steps: list[tuple[int, TrainStep]]) -> list[str]:
    def line(label: str, value) -> svg.Series:
        return svg.Series(label, [(float(x), float(v)) for x, s in steps if (v := value(s)) is not None])

    def applies(series: svg.Series) -> bool:  # a panel's line with no non-zero point is left out
        return any(y != 0 for _, y in series.points)

    losses = [line("loss", lambda s: s.loss)]
    losses += [svg.Series(f"{name}_loss", [(float(x), float(v)) for x, v in points])
               for name, points in term_series(steps).items()]
    kl = [line("divergence (kd term)", lambda s: s.term_losses.get("kd")),
          line("approx KL (policy vs sampler)", lambda s: s.metrics.get("approx_kl"))]
    kinds = sorted({k.split("/", 1)[1] for _, s in steps for k in s.metrics if k.startswith("out_len/")})
    eos = [line(f"first-token EOS {k}", lambda s, k=k: s.metrics.get(f"eos_first/{k}")) for k in kinds]
    eos += [line(f"EOS-only share {k}", lambda s, k=k: s.metrics.get(f"empty/{k}")) for k in kinds]
    lengths = [line(f"mean length {k}", lambda s, k=k: s.metrics.get(f"out_len/{k}")) for k in kinds]
    kl += [line("KL to teacher", lambda s: s.metrics.get("kl_teacher")),
           line("KL to start", lambda s: s.metrics.get("kl_start"))]
    dynamics = [
        svg.line_chart([line("groups with non-zero advantage", lambda s: s.metrics.get("rl_live_fraction"))],
                       title="RL signal (share of live groups)", x_label="step", y_label="fraction",
                       integer_x=True),
        svg.line_chart([x for x in eos if x.points], title="stopping: first-token EOS mass and EOS-only outputs",
                       x_label="step", y_label="probability / share", integer_x=True),
        svg.line_chart([x for x in lengths if x.points], title="mean output length per call kind",
                       x_label="step", y_label="tokens", integer_x=True),
    ]
    dynamics = [c for c, has in zip(dynamics, (any(s.metrics.get("rl_groups") for _, s in steps), bool(kinds),
                                                bool(kinds)), strict=True) if has]
    kl = [x for x in kl if applies(x)]
    # the clip applies to the RL term's ratio: a run without that term (sft, distill --rl none) has no clip panel
    rl = any("rl" in s.term_losses or s.metrics.get("rl_groups") or s.metrics.get("clip_fraction") for _, s in steps)
    return [
        *dynamics,
        svg.line_chart(losses, title="loss parts", x_label="step", y_label="loss", integer_x=True),
        *([svg.line_chart(kl, title="KL", x_label="step", y_label="nats", integer_x=True)] if kl else []),
        *([svg.line_chart([line("clip fraction", lambda s: s.metrics.get("clip_fraction"))], title="clip fraction",
                          x_label="step", y_label="fraction", integer_x=True)] if rl else []),
        svg.line_chart([line("tokens/s", lambda s: s.tokens / s.seconds if s.seconds > 0 else None)],
                       title="throughput", x_label="step", y_label="tokens/s", integer_x=True),
    ]


def eval_chart(results: list[EvalResult], title: str = "eval F1 (95% interval)") -> str:
    lines = [svg.Series(label, [(x, r.f1) for x, r in points], [r.f1_ci for _, r in points])
             for label, points in eval_series(results, "step").items()]
    return svg.line_chart(lines, title=title, x_label="step", y_label="F1", y_range=(0.0, 1.0),
                          integer_x=True)


def training_context(session: Session, run_id: str) -> dict:
    run = repo.get_run(session, run_id)
    runs = round_runs(run, repo.list_runs_of_kind(session, RunKind.distill)) if run.kind is RunKind.train else [run]
    steps = numbered_steps([repo.list_train_steps(session, r.id) for r in runs])
    ckpts = [c.id for r in runs for c in repo.list_checkpoints(session, r.id)]
    evals = repo.list_eval_results(session, checkpoint_ids=ckpts) if ckpts else []
    if run.kind is RunKind.eval:
        evals += repo.list_eval_results(session, run_ids=[run.id])
    return {"run": run, "runs": runs, "steps": steps, "terms": term_series(steps),
            "charts": step_charts(steps) if steps else [],
            "evals": evals, "eval_chart": eval_chart(evals) if evals else None}


def evals_context(session: Session) -> dict:
    results = repo.list_eval_results(session)
    envs = sorted({r.env for r in results})
    return {"results": results,
            "charts": [eval_chart([r for r in results if r.env == env], f"F1 on {env} (95% interval)") for env in envs]}


@router.get("/runs/{run_id}/training", response_class=HTMLResponse)
def training_page(request: Request, run_id: str) -> str:
    with request.app.state.store.session() as s:
        page = training_context(s, run_id)
    return render("training.html", links=Links(), title=f"training {page['run'].id[:10]}", **page)


@router.get("/evals", response_class=HTMLResponse)
def evals_page(request: Request) -> str:
    with request.app.state.store.session() as s:
        page = evals_context(s)
    return render("evals.html", links=Links(), title="evals", **page)

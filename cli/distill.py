"""``agentmem distill``: train a student from stored invocations."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.options import DbOption


def distill(
    run: Annotated[list[str], typer.Option("--run", help="Rollout run id(s) to train on (repeatable).")] = [],  # noqa: B006
    student: Annotated[str, typer.Option(help="Student: model folder, checkpoint id, hub name or 'default'.")]
    = "default",
    teacher: Annotated[str, typer.Option(help="Teacher (same tokenizer as the student); 'none' for RL only.")]
    = "default",
    context: Annotated[str, typer.Option(help="Teacher context: aligned | persistent | privileged.")] = "aligned",
    loss: Annotated[str, typer.Option(help="Divergence at action positions: reverse_kl | forward_kl | jsd.")]
    = "reverse_kl",
    teacher_shards: Annotated[bool, typer.Option(help="Read the teacher's top-K log-probs from `agentmem score "
                                                      "--topk` shards instead of loading the teacher.")] = False,
    beta: Annotated[float, typer.Option(help="Generalised JSD interpolation (TRL semantics).")] = 0.5,
    rl: Annotated[str, typer.Option(help="RL term on the final reward: grpo | none.")] = "grpo",
    kd_weight: Annotated[float, typer.Option(help="Weight of the distillation term.")] = 1.0,
    rl_weight: Annotated[float, typer.Option(help="Weight of the policy-gradient term.")] = 1.0,
    normalize_std: Annotated[bool, typer.Option(help="Divide advantages by the group's std.")] = False,
    weighting: Annotated[str, typer.Option(help="Token averaging: token | call | episode.")] = "token",
    steps: Annotated[int | None, typer.Option(help="Optimizer steps in all (default 10; on --resume, the "
                                                   "stored value unless given).")] = None,
    invocations_per_step: Annotated[int, typer.Option(help="Stored calls per optimizer step.")] = 8,
    row_tokens: Annotated[int, typer.Option(help="Tokens per packed row.")] = 4096,
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = 1e-5,
    seed: Annotated[int, typer.Option(help="Seed of the data order.")] = 0,
    out: Annotated[str, typer.Option(help="Folder for checkpoints.")] = "checkpoints",
    save_every: Annotated[int | None, typer.Option(help="Save a checkpoint every N steps (and at the end).")]
    = None,
    resume: Annotated[str | None, typer.Option(help="Continue distill run RUN_ID from its last checkpoint.")]
    = None,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads.")] = None,
    db: DbOption = None,
) -> None:
    """On-policy distillation from the store: the teacher scores each sampled token under the state the
    student saw (or another context), plus a clipped group-relative policy gradient on the final F1."""
    from agentmem.training.distill import DistillConfig, load_distill_run, load_models, run_distill
    from cli.common import set_threads, setup_logging
    from cli.training_progress import train_progress
    from store.engine import open_store

    setup_logging()
    set_threads(threads)
    store = open_store(db)
    resume_from = None
    if resume:
        resume, config, resume_from = load_distill_run(store, resume)
        if steps is not None:
            config = config.model_copy(update={"steps": steps})
    else:
        if not run:
            raise ValueError("give at least one --run RUN_ID to train on (see `agentmem runs`)")
        config = DistillConfig(
            run_ids=run, student=student, teacher=None if teacher == "none" else teacher, context=context,
            teacher_source="shards" if teacher_shards else "model",
            loss=loss, beta=beta, rl=rl, kd_weight=kd_weight, rl_weight=rl_weight, normalize_std=normalize_std,
            weighting=weighting, steps=steps or 10, invocations_per_step=invocations_per_step,
            row_tokens=row_tokens, lr=lr, seed=seed, out=out, save_every=save_every,
        )
    models = load_models(store, config, resume_from)
    done = resume_from.step if resume_from else 0
    with train_progress(config.steps, done) as on_step:
        result = run_distill(store, config, models, run_id=resume, resume_from=resume_from, on_step=on_step)
    ckpt = result.last_checkpoint
    typer.echo(f"distill_run_id={result.run_id} steps={result.steps_done}"
               + (f" checkpoint={ckpt.id} path={ckpt.path}" if ckpt else ""))


def register(app: typer.Typer) -> None:
    app.command()(distill)

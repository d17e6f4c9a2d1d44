"""``agentmem train``: the on-policy loop (rollout -> distill -> new checkpoint, repeated)."""

from __future__ import annotations

from typing import Annotated

import typer

from agentmem.config import (
    Device,
    DistillTarget,
    Divergence,
    LrSchedule,
    Packing,
    PromptLayout,
    RewardKind,
    RLKind,
)
from agentmem.records import TeacherContext
from cli.method_options import (
    AlphaEmaOption,
    AlphaMaxOption,
    AlphaMinOption,
    AlphaTauOption,
    AlphaTopkOption,
    AnchorWeightOption,
    JsdClipOption,
    ProbFloorOption,
    TargetOption,
)
from cli.options import DbOption, DeviceOption, EnvName, LevelOption, ReportToOption, ThreadsOption


def train(
    student: Annotated[str, typer.Option("--student", "--init", help="Starting student: folder, checkpoint id or "
                                         "'default' (--init CHECKPOINT: start from a trained checkpoint).")]
    = "default",
    warm_start_sft: Annotated[str | None, typer.Option(
        help="Warm start: SFT the student on this run's calls (an oracle rollout: `rollout --policy oracle`) "
             "before round 1; its last checkpoint starts the loop.")] = None,
    warm_start_steps: Annotated[int, typer.Option(help="SFT steps of the warm start.")] = 16,
    warm_start_lr: Annotated[float, typer.Option(help="Peak learning rate of the warm start (cosine, 1 warmup step).")]
    = 5e-5,
    teacher: Annotated[str, typer.Option(help="Teacher model (same tokenizer).")] = "default",
    context: Annotated[TeacherContext, typer.Option(help="Teacher context (default privileged: the same base "
                                                         "model sees gold answer and evidence).")]
    = TeacherContext.privileged,
    loss: Annotated[Divergence, typer.Option(help="Divergence at action positions.")] = Divergence.reverse_kl,
    rl: Annotated[RLKind, typer.Option(help="RL term on the final reward.")] = RLKind.grpo,
    kd_weight: Annotated[float, typer.Option(help="Weight of the distillation term.")] = 1.0,
    rl_weight: Annotated[float, typer.Option(help="Weight of the policy-gradient term.")] = 1.0,
    anchor_weight: AnchorWeightOption = 0.0,
    target: TargetOption = DistillTarget.teacher,
    alpha_tau: AlphaTauOption = 0.1,
    alpha_topk: AlphaTopkOption = 20,
    alpha_min: AlphaMinOption = 0.0,
    alpha_max: AlphaMaxOption = 1.0,
    alpha_ema: AlphaEmaOption = 0.0,
    prob_floor: ProbFloorOption = 0.0,
    jsd_clip: JsdClipOption = None,
    rounds: Annotated[int, typer.Option(help="Rollout + distill rounds.")] = 2,
    steps_per_round: Annotated[int, typer.Option(help="Distill steps per round: fresh rollouts every this many "
                                                      "optimizer steps.")] = 2,
    invocations_per_step: Annotated[int, typer.Option(help="Stored calls per optimizer step.")] = 8,
    row_tokens: Annotated[int, typer.Option(help="Tokens per packed row; a longer call is left out and "
                                                 "counted, never cut.")] = 4096,
    packing: Annotated[Packing, typer.Option(
        help="Row layout: segments (each call whole) or shared_prefix (a (run, task, step) group's common "
             "prompt prefix placed and computed once; exact).")] = Packing.shared_prefix,
    episodes: Annotated[int, typer.Option(help="Tasks per rollout.")] = 4,
    group_size: Annotated[int, typer.Option(help="Samples per task (GRPO groups).")] = 4,
    reward: Annotated[RewardKind, typer.Option(help="Episode reward of the RL term: f1, sub_em (a gold answer "
                                                    "inside the prediction) or their maximum.")]
    = RewardKind.max_f1_sub_em,
    env: Annotated[EnvName, typer.Option(help="Environment.")] = EnvName("synthetic"),
    data: Annotated[str | None, typer.Option(help="Data file for file-backed environments.")] = None,
    knob: Annotated[list[str], typer.Option(help="Environment knob KEY=VALUE (repeatable).")] = [],  # noqa: B006
    level: LevelOption = None,
    chunk_tokens: Annotated[int, typer.Option(help="Tokens per chunk.")] = 192,
    memory_tokens: Annotated[int, typer.Option(help="Memory budget in tokens.")] = 48,
    answer_tokens: Annotated[int, typer.Option(help="Answer length cap in tokens.")] = 16,
    prompt_layout: Annotated[PromptLayout, typer.Option(help="Update prompt order (see `rollout --help`).")]
    = PromptLayout.chunk_first,
    lr: Annotated[float, typer.Option(help="Peak AdamW learning rate.")] = 1e-5,
    warmup_steps: Annotated[int, typer.Option(help="Linear warmup steps of the schedule (over all rounds).")] = 1,
    schedule: Annotated[LrSchedule, typer.Option(help="Learning rate after warmup: cosine decay to 0.1 x lr at "
                                                      "the last step of the last round, or constant.")]
    = LrSchedule.cosine,
    carry_optimizer: Annotated[bool, typer.Option(help="Carry AdamW's state from round to round (else a fresh "
                                                       "optimizer each round).")] = True,
    teacher_check_episodes: Annotated[int, typer.Option(
        help="Validate the teacher first on this many held-out greedy episodes; refuse it when a call kind's "
             "end-of-sequence-only share is over --max-teacher-empty (0: no check).")] = 8,
    max_teacher_empty: Annotated[float, typer.Option(help="Largest end-of-sequence-only share the teacher may "
                                                          "have on any call kind.")] = 0.1,
    out: Annotated[str, typer.Option(help="Folder for checkpoints (round N of train run T: "
                                          "OUT/T/round-N/<distill run>/step-K).")] = "checkpoints",
    seed: Annotated[int, typer.Option(help="Seed (rollout tasks, sampling, data order).")] = 0,
    resume: Annotated[str | None, typer.Option(
        help="Continue train run RUN_ID at its first unfinished round, from the last finished round's "
             "checkpoint, with its stored config (the other flags are ignored).")] = None,
    report_to: ReportToOption = [],  # noqa: B006
    device: DeviceOption = Device.auto,
    threads: ThreadsOption = None,
    db: DbOption = None,
) -> None:
    """Run the whole on-policy loop on the embedded default: a few minutes per round on a laptop CPU.
    A killed loop continues with --resume RUN_ID."""
    from agentmem.config import (
        AgentConfig,
        DistillConfig,
        Oversize,
        RolloutConfig,
        SftConfig,
        TeacherTruncation,
        TrainConfig,
    )
    from agentmem.jobs.train import load_train_state, run_train
    from agentmem.records import RunKind
    from agentmem.tracking import check_installed, parse_report_to
    from cli.common import env_knobs, preflight, runtime, setup_logging
    from cli.console import console
    from cli.job_session import job_session
    from cli.training_progress import train_progress
    from store.engine import open_store

    trackers = parse_report_to(report_to)
    check_installed(trackers)
    config = None
    if not resume:
        knobs = env_knobs(env.value, knob, level) or (
            {"context_tokens": 384, "distractors": 2, "hops": 1} if env == "synthetic" else {})
        warm = (SftConfig(run_ids=[warm_start_sft], steps=warm_start_steps, lr=warm_start_lr, warmup_steps=1,
                          schedule=LrSchedule.cosine, invocations_per_step=invocations_per_step, seed=seed,
                          out=out) if warm_start_sft else None)
        config = TrainConfig(
            rounds=rounds, seed=seed, warm_start=warm, teacher_check_episodes=teacher_check_episodes,
            max_teacher_empty=max_teacher_empty,
            rollout=RolloutConfig(env=env.value, data=data, env_knobs=knobs, episodes=episodes,
                                  group_size=group_size, chunk_tokens=chunk_tokens,
                                  agent=AgentConfig(memory_tokens=memory_tokens, answer_max_new_tokens=answer_tokens,
                                                    prompt_layout=prompt_layout)),
            distill=DistillConfig(student=student, teacher=teacher, context=context, loss=loss, rl=rl,
                                  kd_weight=kd_weight, rl_weight=rl_weight, steps=steps_per_round,
                                  invocations_per_step=invocations_per_step, row_tokens=row_tokens, lr=lr,
                                  warmup_steps=warmup_steps, schedule=schedule, carry_optimizer=carry_optimizer,
                                  reward=reward, monitor_start_kl=True, out=out, packing=packing, oversize=Oversize.skip,
                                  teacher_truncation=TeacherTruncation.left, anchor_weight=anchor_weight,
                                  target=target, alpha_tau=alpha_tau, alpha_topk=alpha_topk, alpha_min=alpha_min,
                                  alpha_max=alpha_max, alpha_ema=alpha_ema, prob_floor=prob_floor,
                                  jsd_clip=jsd_clip),
        )
    preflight(db, resume=resume, kind=RunKind.train, data=data if not resume else None)
    rt = runtime(device, threads)
    setup_logging()
    store = open_store(db, create=not resume)
    err = console(stderr=True)
    start = 0
    warm = config.warm_start.steps if config and config.warm_start else 0
    if resume:
        state = load_train_state(store, resume)
        rounds, steps_per_round = state.config.rounds, state.config.distill.steps
        warm = state.config.warm_start.steps if state.config.warm_start else 0
        start = len(state.finished) * steps_per_round + (warm if state.finished else 0)
    total = warm + rounds * steps_per_round
    with job_session(db), train_progress(total, done=start, label="train") as bar:
        done = {"n": start}

        def step(record) -> None:
            done["n"] += 1
            bar.on_step(record.model_copy(update={"step": done["n"]}))

        def rollout_round(stats) -> None:
            err.log(f"  rollout: {stats.calls} calls, {stats.output_tokens} tokens generated in {stats.seconds:.1f}s, "
                    f"{stats.finished} episodes finished")

        run_id, results = run_train(store, config, rt, resume=resume, on_phase=lambda msg: err.log(msg),
                                    on_step=step, on_round=rollout_round, report_to=trackers)
    from rich.table import Table

    table = Table("round", "policy", "rollout run", "rollout F1", "RL live groups", "distill run", "new checkpoint",
                  title=f"train {run_id}")
    for r in results:
        live = "off" if r.rl_live_fraction is None else f"{r.rl_live_fraction:.2f}"
        table.add_row(str(r.round + 1), r.policy.id[:12], r.rollout_run_id[:12], f"{r.mean_f1:.3f}", live,
                      r.distill_run_id[:12], r.checkpoint.id)
    console().print(table)
    for r in results:
        for w in r.warnings:
            err.print(f"warning: round {r.round + 1}: {w}")
    typer.echo(f"train_run_id={run_id} final_checkpoint={results[-1].checkpoint.id} path={results[-1].checkpoint.path}")


def register(app: typer.Typer) -> None:
    app.command()(train)

"""PSD, pseudo self-distillation (docs/methods.md): the teacher is the model under the privileged prompt.

Off-policy samples come from a privileged rollout, which stores the privileged ids apart from the
student-visible prompt: the student rebuilds the prompt without them, the teacher with exactly the ids the
sampler read, both with the same action tokens; the RL term refuses those calls. Mixed PSD weights the
on- and off-policy losses exactly; `distill --psd` checks the runs before any model loads."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import Called, register_policy
from job_fixtures import episodes_and_calls, rollout_config
from model_helpers import RecordingBackend
from typer.testing import CliRunner

from agentmem.agent.overwrite import OverwritePolicy
from agentmem.agent.prompts import update_prompt
from agentmem.backends.transformers_backend import TransformersBackend
from agentmem.config import AgentConfig, DistillConfig, PsdMode, RolloutConfig
from agentmem.errors import AgentError, ConfigError, TrainingError
from agentmem.jobs import distill as distill_job
from agentmem.jobs.rollout import StoreSink, run_rollout
from agentmem.records import Episode, Invocation, SamplingContext, TeacherContext
from agentmem.replay import pack, rebuild_aligned
from agentmem.replay.privileged import privileged_ids
from agentmem.testing.configs import merged
from agentmem.testing.tiny_models import tiny_llama, tiny_tokenizer
from agentmem.training.forward import PackedModel
from agentmem.training.objective import Mix, StepInputs, accumulate_step
from agentmem.training.selection import Selection, select, student_sequences, teacher_sequences
from agentmem.training.teachers import OnlineTeacher
from agentmem.training.terms import objective_from_config
from agentmem.training.trainer import Models, Trainer, advantages, psd_mix
from cli.app import app, error_message
from store import repository as repo


class KeepingSink(StoreSink):
    """Stores as the rollout does, and keeps the calls as the loop made them."""

    def __init__(self, store):
        super().__init__(store)
        self.kept: list[Invocation] = []

    def invocations(self, invocations):
        self.kept.extend(invocations)
        super().invocations(invocations)


def rollout(store, policy, **kw) -> str:
    backend = TransformersBackend.from_model(tiny_llama(seed=3), tiny_tokenizer())
    return run_rollout(store, rollout_config(**kw), backend=backend, policy=policy).run_id


@pytest.fixture
def runs(store):
    """A normal rollout and a privileged rollout of the same tasks by the same tiny model (SQLite, Postgres)."""
    policy = register_policy(store, "/models/tiny", "tiny")
    return store, rollout(store, policy), rollout(store, policy, context="privileged"), policy


def models(policy) -> Models:
    tok = tiny_tokenizer()
    return Models(tiny_llama(seed=0).train(), tok, policy, tiny_llama(seed=1).requires_grad_(False), tok)


def psd_config(run_ids, tmp_path, **kw) -> DistillConfig:
    base = dict(run_ids=run_ids, out=str(tmp_path), rl=dict(kind="none"), teacher=dict(context=TeacherContext.privileged),
                optim=dict(steps=2, lr=1e-3), batch=dict(invocations_per_step=4))
    return DistillConfig(**merged(base, kw))


# --- off-policy: the stored calls and their rebuilds ----------------------------------------------------


def test_off_policy_rebuilds_split_the_privileged_ids():
    """Student: the stored prompt without the privileged ids (sampler log-probs NaN: not the student's).
    Teacher: exactly the stored privileged ids, then the prompt. Same action tokens on both sides; a call
    the student sampled gets the privileged message rendered from its episode."""
    tok = tiny_tokenizer()
    episode = Episode(id="e1", run_id="r", env="synthetic", task_id="t", question="Where?", gold_answers=["Oslo"])
    off = Invocation(id="off", episode_id="e1", step=0, kind="memory_update", prompt_ids=[11, 12, 13],
                     output_ids=[21, 22], output_logprobs=[-0.5, -0.25], sampled_context="privileged",
                     privileged_ids=[5, 6, 7, 8])
    on = Invocation(id="on", episode_id="e1", step=1, kind="answer", prompt_ids=[14, 15], output_ids=[23],
                    output_logprobs=[-1.0])
    student = rebuild_aligned(off)
    assert student.input_ids.tolist() == [11, 12, 13, 21, 22]
    assert student.action_mask.tolist() == [False, False, True, True, False]
    assert np.isnan(student.sampler_logprobs).all()
    selection = Selection([off, on], {"e1": episode})
    teacher_off, teacher_on = teacher_sequences(selection, TeacherContext.privileged, tok)
    assert teacher_off.input_ids.tolist() == [5, 6, 7, 8, 11, 12, 13, 21, 22]
    assert teacher_off.action_mask.tolist() == [False] * 6 + [True, True, False]
    assert teacher_off.action_ids.tolist() == student.action_ids.tolist() == [21, 22]
    assert teacher_off.sampler_logprobs.tolist() == [-0.5, -0.25]  # the privileged sampler read this input
    assert teacher_on.input_ids.tolist() == privileged_ids(tok, episode) + [14, 15, 23]
    assert rebuild_aligned(on).sampler_logprobs.tolist() == [-1.0]
    assert off.sampled_prompt_ids.tolist() == [5, 6, 7, 8, 11, 12, 13]
    with pytest.raises(ValueError, match="privileged_ids are stored exactly when"):
        Invocation(episode_id="e", step=0, kind="answer", prompt_ids=[1], output_ids=[2], output_logprobs=None,
                   privileged_ids=[3])


def test_privileged_rollout_stores_exactly_the_ids_the_backend_saw(store):
    """A privileged rollout with a tiny model (SQLite and Postgres): the backend consumed exactly
    `privileged_ids + prompt_ids` of each stored call, `privileged_ids` is the episode's privileged message
    and `prompt_ids` the student-visible prompt; the memory carried on is the privileged sampler's output,
    and the stored log-probs are the model's under the privileged prompt, not under the student's."""
    tok = tiny_tokenizer()
    model = tiny_llama(seed=3)
    backend = RecordingBackend.from_model(model, tok)
    policy = register_policy(store, "/models/tiny", "tiny")
    config = rollout_config(context="privileged")
    sink = KeepingSink(store)
    run_id = run_rollout(store, config, backend=backend, policy=policy, sink=sink).run_id
    episodes, invocations = episodes_and_calls(store, run_id)
    with store.session() as s:
        assert repo.get_run(s, run_id).config["context"] == "privileged"
    kept = {i.id: i for i in sink.kept}  # as the loop made them (the store swaps NUL in text for U+FFFD)
    for inv in invocations:
        assert (inv.prompt_ids.tolist(), inv.privileged_ids.tolist(), inv.output_ids.tolist()) == (
            kept[inv.id].prompt_ids.tolist(), kept[inv.id].privileged_ids.tolist(), kept[inv.id].output_ids.tolist())
    assert sorted(map(tuple, backend.seen)) == sorted(tuple(i.sampled_prompt_ids.tolist()) for i in invocations)
    updater = OverwritePolicy(tok, config.agent)
    by_episode: dict[str, list[Invocation]] = {}
    for inv in invocations:
        by_episode.setdefault(inv.episode_id, []).append(inv)
        episode = episodes[inv.episode_id]
        assert inv.sampled_context is SamplingContext.privileged
        assert inv.privileged_ids.tolist() == privileged_ids(tok, episode)
        assert "Gold answer" not in inv.prompt_text and "Gold answer" in tok.decode(inv.privileged_ids.tolist())
        if inv.kind == "memory_update":
            made = kept[inv.id]
            assert made.prompt_ids.tolist() == update_prompt(tok, episode.question, made.memory_before,
                                                             made.chunk_text, "chunk-first").ids
            assert made.memory_after == updater.update(made.memory_before, made.output_ids.tolist())
    for calls in by_episode.values():
        assert [c.memory_before for c in calls[1:]] == [c.memory_after for c in calls[:-1]]
    inv = invocations[0]
    with torch.no_grad():
        def logprobs(prompt):
            ids = torch.tensor([prompt + inv.output_ids.tolist()])
            logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1].float(), -1)
            return logp.gather(-1, torch.tensor(inv.output_ids.tolist())[:, None].long())[:, 0].numpy()

        np.testing.assert_allclose(logprobs(inv.sampled_prompt_ids.tolist()), inv.output_logprobs, atol=1e-4)
        assert np.abs(logprobs(inv.prompt_ids.tolist()) - inv.output_logprobs).max() > 1e-3


def test_the_oracle_cannot_sample_under_a_privileged_prompt():
    with pytest.raises(ValueError, match="the oracle reads no prompt"):
        RolloutConfig(policy="oracle", context="privileged")
    with pytest.raises(ValueError, match="context\n  Input should be 'aligned', 'privileged' or 'hint'"):
        RolloutConfig(context="persistent")  # a SamplingContext: a teacher context is no sampling context
    from agentmem.agent.loop import AgentLoop
    from agentmem.agent.oracle import OracleWriter
    with pytest.raises(AgentError, match="the oracle reads no prompt"):
        AgentLoop(None, AgentConfig(), lambda p, t: None, oracle=OracleWriter(tiny_tokenizer()),
                  privileged=lambda e: [1])


# --- distill: the runs each mode takes, RL refused --------------------------------------------------------


def no_load(*args, **kw):
    raise AssertionError("a model was loaded")


def test_runs_must_match_the_psd_mode_and_rl_is_refused_before_models_load(runs, tmp_path, monkeypatch):
    store, normal, privileged, _ = runs
    monkeypatch.setattr(distill_job, "load_models", no_load)
    monkeypatch.setattr(distill_job, "resolve_models", no_load)
    cases = [
        (dict(run_ids=[privileged], rl=dict(kind="grpo")), f"run {privileged} was sampled under the privileged prompt.*--rl none"),
        (dict(run_ids=[normal, privileged], teacher=dict(psd="mixed"), rl=dict(kind="grpo")), "sampled under the privileged prompt"),
        (dict(run_ids=[privileged], teacher=dict(psd="on_policy")), f"psd=on_policy .* run {privileged} was sampled under"),
        (dict(run_ids=[normal], teacher=dict(psd="off_policy")), f"psd=off_policy .* run {normal} is not a privileged rollout"),
        (dict(run_ids=[privileged], teacher=dict(psd="mixed")), "psd=mixed trains on a normal rollout and a privileged rollout"),
    ]
    for kw, message in cases:
        with pytest.raises(ConfigError, match=message):
            distill_job.run_distill(store, psd_config(**(dict(tmp_path=tmp_path) | kw)))
    with store.session() as s:
        assert {r.run.kind.value for r in repo.list_runs(s)} == {"rollout"}  # no distill run was opened


def test_psd_config_is_checked():
    with pytest.raises(ValueError, match="psd=off_policy distils from the privileged teacher: set teacher.context=privileged"):
        DistillConfig(run_ids=["r"], teacher=dict(psd="off_policy"))
    with pytest.raises(ValueError, match=r"psd=mixed needs a teacher and loss\.kd_weight > 0"):
        DistillConfig(run_ids=["r"], teacher=dict(psd="mixed", context="privileged"), loss=dict(kd_weight=0, ce_weight=1))
    with pytest.raises(ValueError, match="invocations_per_step must be >= 2"):
        DistillConfig(run_ids=["r"], teacher=dict(psd="mixed", context="privileged"), batch=dict(invocations_per_step=1))
    with pytest.raises(ValueError, match="psd_mix weights the off-policy loss of psd=mixed"):
        DistillConfig(run_ids=["r"], teacher=dict(psd="off_policy", context="privileged", psd_mix=0.3))
    stored = DistillConfig(run_ids=["r"]).model_dump(mode="json")
    del stored["teacher"]["psd"], stored["teacher"]["psd_mix"]
    assert DistillConfig.model_validate(stored).teacher.psd is PsdMode.none  # runs stored before PSD load


def test_off_policy_distill_runs_two_steps(runs, tmp_path):
    store, _, privileged, policy = runs
    m = models(policy)
    before = {n: p.detach().clone() for n, p in m.student.named_parameters()}
    result = distill_job.run_distill(store, psd_config([privileged], tmp_path, teacher=dict(psd="off_policy")), models=m)
    assert [s.step for s in result.history] == [1, 2]
    assert all(np.isfinite(s.loss) and s.kd_loss > 0 for s in result.history)
    assert [n for n, p in m.student.named_parameters() if torch.equal(p, before[n])] == []


# --- mixed: the weighted sum ----------------------------------------------------------------------------


@pytest.mark.parametrize("weighting", ["token", "call", "episode"])
def test_mixed_loss_is_the_weighted_sum_of_the_per_run_losses(runs, weighting):
    """With known per-run losses L_on and L_off (each part alone, weighted within itself), one mixed step
    on both gives exactly (1 - m) L_on + m L_off, and the same mixture of gradients."""
    store, normal, privileged, policy = runs
    m = models(policy)
    selection = select(store, [normal, privileged])
    mix = psd_mix(selection, 0.3)
    assert mix.shares == (pytest.approx(0.7), 0.3)
    seqs = student_sequences(selection)
    on = [s for s in seqs if mix.part_of[selection.episodes[_episode(selection, s)].id] == 0][:4]
    off = [s for s in seqs if mix.part_of[selection.episodes[_episode(selection, s)].id] == 1][:3]
    teacher = OnlineTeacher.for_selection(m.teacher, m.tokenizer, "t", selection, TeacherContext.privileged,
                                          row_tokens=4096)
    targets = teacher.targets([s.invocation_id for s in on + off])
    config = DistillConfig(run_ids=[normal], teacher=dict(context=TeacherContext.privileged), loss=dict(ce_weight=0.5, weighting=weighting), rl=dict(kind="none"))
    objective = objective_from_config(config)
    student = PackedModel.create(m.student, m.tokenizer)

    def step(part, mixed):
        inputs = StepInputs({i.id: i.episode_id for i in selection.invocations}, advantages(selection, False),
                            {i.id: 1.0 for i in selection.invocations}, targets, mix if mixed else None)
        m.student.zero_grad()
        result = accumulate_step(student, pack(part, 4096)[0], inputs, objective)
        return result, {n: p.grad.clone() for n, p in m.student.named_parameters()}

    (on_result, on_grad), (off_result, off_grad) = step(on, False), step(off, False)
    mixed, mixed_grad = step(on + off, True)
    assert mixed.loss == pytest.approx(0.7 * on_result.loss + 0.3 * off_result.loss, abs=1e-6)
    assert mixed.metrics["kd_loss"] == pytest.approx(0.7 * on_result.metrics["kd_loss"]
                                                 + 0.3 * off_result.metrics["kd_loss"], abs=1e-6)
    for n in mixed_grad:
        torch.testing.assert_close(mixed_grad[n], 0.7 * on_grad[n] + 0.3 * off_grad[n], atol=1e-6, rtol=1e-4)


def _episode(selection: Selection, seq) -> str:
    return next(i.episode_id for i in selection.invocations if i.id == seq.invocation_id)


def test_mix_weights_are_exact_per_part():
    """Token weights of a two-part step: 1/N_p within each part, times the part's share."""
    from agentmem.training.objective import step_totals, step_weights

    class Batch:  # the two fields the weights read
        def __init__(self, ids, counts):
            self.invocation_ids, self.action_counts = ids, counts
            self.action_ids = torch.zeros(sum(counts))

    batches = [Batch(("a", "b"), (2, 3)), Batch(("c",), (5,))]
    episode_of = {"a": "e0", "b": "e1", "c": "e2"}
    mix = Mix({"e0": 0, "e1": 1, "e2": 1}, (0.25, 0.75))
    totals = step_totals(batches, episode_of, mix=mix)
    assert (totals.part_actions, totals.part_calls, totals.part_episodes()) == ((2, 8), (1, 2), [1, 2])
    token = step_weights(batches, episode_of, "token", totals, mix=mix)
    assert torch.cat(token).tolist() == pytest.approx([0.125] * 2 + [0.75 / 8] * 8)
    call = step_weights(batches, episode_of, "call", totals, mix=mix)
    assert torch.cat(call).tolist() == pytest.approx([0.125] * 2 + [0.75 / 6] * 3 + [0.75 / 10] * 5)
    assert float(sum(w.sum() for w in call)) == pytest.approx(1.0)


def test_mixed_steps_draw_from_both_parts(runs, tmp_path):
    """Every mixed step draws half its calls from each part, each in its own seeded order; two steps run."""
    store, normal, privileged, policy = runs
    m = models(policy)
    config = psd_config([normal, privileged], tmp_path, teacher=dict(psd="mixed", psd_mix=0.25), batch=dict(invocations_per_step=5))
    trainer = Trainer(store, config, m, "run")
    for step in range(4):
        parts = [trainer.mix.part_of[trainer.episode_of[trainer.student_seqs[u].invocation_id]]
                 for u in trainer._draw(step)]
        assert parts == [0, 0, 0, 1, 1]
    result = distill_job.run_distill(store, config, models=models(policy))
    assert len(result.history) == 2 and all(np.isfinite(s.loss) for s in result.history)
    with pytest.raises(TrainingError, match="psd=mixed needs calls sampled by the student and calls sampled"):
        Trainer(store, config.model_copy(update={"run_ids": [normal]}), m, "run")


# --- the CLI --------------------------------------------------------------------------------------------


def test_cli_flags_reach_the_configs(captured):
    runner = CliRunner()
    result = runner.invoke(app, ["distill", "--run", "a", "--run", "b", "--teacher-context", "privileged", "--psd", "mixed",
                                 "--psd-mix", "0.25", "--rl", "none", "--device", "cpu"])
    assert isinstance(result.exception, Called), result.output
    assert (captured["distill"].teacher.psd, captured["distill"].teacher.psd_mix) == (PsdMode.mixed, 0.25)
    result = runner.invoke(app, ["rollout", "--context", "privileged", "--device", "cpu"])
    assert isinstance(result.exception, Called), result.output
    assert captured["rollout"].context is SamplingContext.privileged
    bad = runner.invoke(app, ["distill", "--run", "a", "--psd", "off_policy", "--device", "cpu"])
    assert error_message(bad.exception).startswith("--psd off_policy distils")

"""Supervised fine-tuning on stored calls: the loss is exactly the mean -log p of the stored outputs given
their prompts (the prompt carries no loss), it goes down, --min-f1 keeps exactly the calls of good episodes,
LoRA trains only the adapters and saves a plain merged model folder, resume is exact, and bad input fails
before any model loads."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import agentmem
from job_fixtures import sft_config
from transformers import AutoModelForCausalLM

from agentmem.config import SftConfig
from agentmem.errors import TrainingError
from agentmem.jobs.sft import load_student, run_sft
from agentmem.jobs.training_shell import with_steps
from agentmem.model_refs import resolve
from agentmem.records import InvocationKind, Run, RunKind
from agentmem.runtime import CPU
from agentmem.testing.tiny_models import save_tiny, tiny_tokenizer
from agentmem.training import lora
from agentmem.training.selection import select
from agentmem.training.trainer import Trainer
from store import repository as repo


def mean_nll(model, invocations) -> float:
    """Mean -log p(output token | prompt, earlier outputs) over every output token, one plain forward
    pass per call (no packing)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for inv in invocations:
            ids = torch.tensor(np.concatenate([inv.prompt_ids, inv.output_ids]), dtype=torch.long)[None]
            logp = torch.log_softmax(model(ids).logits[0].double(), -1)
            p, o = inv.prompt_tokens, inv.output_tokens
            total -= float(logp[p - 1 : p + o - 1].gather(1, ids[0, p:, None]).sum())
            count += o
    return total / count


def test_loss_is_the_nll_of_the_outputs_given_the_prompt_and_goes_down(stored, tmp_path):
    store, run_id, folder = stored
    invocations = select(store, [run_id]).invocations
    start = AutoModelForCausalLM.from_pretrained(folder)
    before = mean_nll(start, invocations)
    result = run_sft(store, sft_config(run_id, folder, tmp_path, optim=dict(steps=3)))
    first = result.history[0]
    # every call drawn at step 1, token weighting: the loss is the mean NLL of the output tokens only
    assert first.metrics["actions"] == sum(i.output_tokens for i in invocations)
    assert first.loss == pytest.approx(before, abs=1e-5)
    assert first.kd_loss == 0 and first.rl_loss == 0
    after = mean_nll(AutoModelForCausalLM.from_pretrained(result.last_checkpoint.path), invocations)
    assert np.isfinite(after) and after < before
    assert [h.loss for h in result.history] == sorted(h.loss for h in result.history)[::-1]
    with store.session() as s:
        run = repo.get_run(s, result.run_id)
        assert run.kind is RunKind.sft and run.status == "finished"
        assert [t.step for t in repo.list_train_steps(s, result.run_id)] == [1, 2, 3]
        assert repo.list_checkpoints(s, result.run_id) == [result.last_checkpoint]


def test_min_f1_and_kinds_select_exactly_those_calls(stored, tmp_path):
    store, run_id, folder = stored
    all_calls = select(store, [run_id])
    good = {e.id for e in all_calls.episodes.values() if e.f1 == 0.8}
    assert len(good) == 2
    picked = select(store, [run_id], min_f1=0.5)
    assert picked.ids == [i.id for i in all_calls.invocations if i.episode_id in good]
    answers = select(store, [run_id], min_f1=0.5, kinds=[InvocationKind.answer])
    assert answers.ids == [i.id for i in picked.invocations if i.kind == "answer"] and len(answers.ids) == 2
    result = run_sft(store, sft_config(run_id, folder, tmp_path, min_f1=0.5, kinds="answer", optim=dict(steps=1)))
    assert result.history[0].metrics["actions"] == sum(i.output_tokens for i in answers.invocations)
    assert SftConfig(run_ids=["r"], kinds="update, answer").kinds == [InvocationKind.memory_update,
                                                                      InvocationKind.answer]
    with pytest.raises(TrainingError, match=rf"run\(s\) {run_id} .*f1 >= 0.9 \(--min-f1\)"):
        run_sft(store, sft_config(run_id, folder, tmp_path, min_f1=0.9, kinds="update"))
    with store.session() as s:
        assert [r.run.kind for r in repo.list_runs(s)].count(RunKind.sft) == 1  # the empty one left no run


def test_lora_trains_only_adapters_and_saves_a_plain_merged_model(stored, tmp_path):
    store, run_id, folder = stored
    config = sft_config(run_id, folder, tmp_path, lora_rank=4, optim=dict(lr=1e-2))
    models = load_student(store, config, CPU, resolve(store, folder))
    before = {n: p.detach().clone() for n, p in models.student.named_parameters()}
    run = Run(kind=RunKind.sft, config=config.model_dump(mode="json"))
    with store.session() as s:
        repo.start_run(s, run)
        s.commit()
    trainer = Trainer(store, config.distill_config(), models, run.id, selection=select(store, [run_id]))
    for step in range(2):
        assert np.isfinite(trainer.step(step).loss)
    changed = {n for n, p in models.student.named_parameters() if not torch.equal(p, before[n])}
    adapters = {n for n in before if "lora_" in n}
    assert adapters and changed == adapters
    assert {n for n, p in models.student.named_parameters() if p.requires_grad} == adapters
    ckpt = trainer.save(2, models.student_checkpoint)
    assert not (Path(ckpt.path) / "adapter_config.json").exists()
    loaded = AutoModelForCausalLM.from_pretrained(ckpt.path)
    assert not lora.is_lora(loaded) and not any("lora_" in n for n, _ in loaded.named_parameters())
    ids = torch.tensor(np.concatenate([i.prompt_ids for i in select(store, [run_id]).invocations[:2]]))[None]
    models.student.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, models.student(ids).logits, atol=1e-5, rtol=0)


def test_a_lora_checkpoint_keeps_its_adapter_in_peft_format_and_the_folder_loads_as_a_model(stored, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.setenv("AGENTMEM_CACHE", str(tmp_path / "cache"))
    store, run_id, folder = stored
    result = run_sft(store, sft_config(run_id, folder, tmp_path, lora_rank=4, optim=dict(lr=1e-2)))
    adapter = Path(result.last_checkpoint.path) / lora.ADAPTER_DIR
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter.iterdir()}
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["base_model_name_or_path"]) == (4, str(Path(folder).resolve()))
    shared = tmp_path / "shared-adapter"  # the two files alone, as a teacher is committed
    shared.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (shared / name).write_bytes((adapter / name).read_bytes())
    ref = resolve(store, str(shared))
    assert Path(ref.path).parent == tmp_path / "cache" / "models" / "adapters"
    assert resolve(store, str(shared)).path == ref.path  # merged once, then reused
    ids = torch.tensor(select(store, [run_id]).invocations[0].prompt_ids)[None]
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(ref.path)(ids).logits
        trained = AutoModelForCausalLM.from_pretrained(result.last_checkpoint.path)(ids).logits
    torch.testing.assert_close(merged, trained, atol=1e-5, rtol=0)
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(folder)(ids).logits
    assert (merged - base).abs().max() > 1e-3  # the adapter changed the model


def test_an_adapter_names_the_base_reference_it_was_given(tmp_path):
    """The default model's adapters name it by its name, not by the cache folder it was prepared in on this
    machine (peft would write the folder)."""
    model = AutoModelForCausalLM.from_pretrained(save_tiny(tmp_path / "tiny"))
    wrapped = lora.wrap(model, 2, 4.0, 0.0, ["q_proj"], seed=0, base_ref="SmolLM2-135M-Instruct")
    lora.save_adapter(wrapped, tmp_path / "a")
    assert json.loads((tmp_path / "a" / "adapter_config.json").read_text())["base_model_name_or_path"] == \
        "SmolLM2-135M-Instruct"


def test_an_adapter_that_names_no_base_is_refused_naming_its_config(tmp_path):
    from agentmem.backends.model_files import resolve_model
    from agentmem.errors import ModelError

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "adapter_config.json").write_text('{"r": 4}')
    with pytest.raises(ModelError, match="adapter_config.json: base_model_name_or_path is missing"):
        resolve_model(str(tmp_path / "a"), tmp_path / "cache")


@pytest.mark.parametrize("lora_rank", [None, 4])
def test_resume_two_plus_two_equals_four(stored, tmp_path, lora_rank):
    store, run_id, folder = stored
    config = sft_config(run_id, folder, tmp_path, lora_rank=lora_rank, optim=dict(steps=4), batch=dict(invocations_per_step=3))
    straight = run_sft(store, config)
    first = run_sft(store, with_steps(config, 2))
    assert first.last_checkpoint.step == 2
    resumed = run_sft(store, None, resume=first.run_id[:8], steps=4)
    assert resumed.run_id == first.run_id and [h.step for h in resumed.history] == [3, 4]
    for a, b in zip(straight.history[2:], resumed.history, strict=True):
        assert a.loss == pytest.approx(b.loss, abs=1e-6)
    assert resumed.last_checkpoint.parent_id == first.last_checkpoint.id
    p = AutoModelForCausalLM.from_pretrained(straight.last_checkpoint.path).state_dict()
    q = AutoModelForCausalLM.from_pretrained(resumed.last_checkpoint.path).state_dict()
    assert p.keys() == q.keys()
    for name in p:
        torch.testing.assert_close(p[name], q[name], atol=1e-6, rtol=0, msg=name)
    with store.session() as s:
        assert repo.get_run(s, first.run_id).status == "finished"
        assert [t.step for t in repo.list_train_steps(s, first.run_id)] == [1, 2, 3, 4]


def test_carried_optimizer_makes_one_plus_one_equal_two(stored, tmp_path):
    """Every step takes every stored call (so the data order plays no part) at a constant rate: one step, then
    one more from its checkpoint with ``carry_optimizer``, equals two steps in one run; without it the second
    step is a fresh AdamW's and lands elsewhere."""
    store, run_id, folder = stored
    straight = run_sft(store, sft_config(run_id, folder, tmp_path, optim=dict(steps=2)))
    first = run_sft(store, sft_config(run_id, folder, tmp_path, optim=dict(steps=1)))
    start = first.last_checkpoint.id
    carried = run_sft(store, sft_config(run_id, start, tmp_path, optim=dict(steps=1, carry_optimizer=True)))
    fresh = run_sft(store, sft_config(run_id, start, tmp_path, optim=dict(steps=1)))
    assert carried.history[0].loss == pytest.approx(straight.history[1].loss, abs=1e-6)
    p = AutoModelForCausalLM.from_pretrained(straight.last_checkpoint.path).state_dict()
    q = AutoModelForCausalLM.from_pretrained(carried.last_checkpoint.path).state_dict()
    r = AutoModelForCausalLM.from_pretrained(fresh.last_checkpoint.path).state_dict()
    for name in p:
        torch.testing.assert_close(p[name], q[name], atol=1e-6, rtol=0, msg=name)
    assert sum(not torch.allclose(p[n], r[n], atol=1e-6, rtol=0) for n in p) > len(p) // 2
    # the carried second moment without the first: the carried scale, no push along step 1's direction, so it
    # lands neither where the fully carried step does nor where a fresh AdamW's does
    scaled = run_sft(store, sft_config(run_id, start, tmp_path, optim=dict(steps=1, carry_optimizer=True, carry_first_moment=False)))
    u = AutoModelForCausalLM.from_pretrained(scaled.last_checkpoint.path).state_dict()
    assert scaled.history[0].loss == pytest.approx(carried.history[0].loss, abs=1e-6)  # the same start and calls
    assert sum(not torch.allclose(q[n], u[n], atol=1e-6, rtol=0) for n in p) > len(p) // 2
    assert sum(not torch.allclose(r[n], u[n], atol=1e-6, rtol=0) for n in p) > len(p) // 2
    with pytest.raises(ValueError, match="cannot start LoRA adapters"):
        sft_config(run_id, start, tmp_path, lora_rank=4, optim=dict(carry_optimizer=True))


def test_bad_run_ids_fail_before_any_model_loads(stored, tmp_path, monkeypatch):
    store, run_id, folder = stored

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("agentmem.model_refs.load", no_load)
    with pytest.raises(Exception, match="no run with id 'nopenope'"):
        run_sft(store, sft_config("nopenope", folder, tmp_path))
    with pytest.raises(Exception, match="is a rollout run, not a sft run"):
        run_sft(store, None, resume=run_id)
    with pytest.raises(Exception, match="nowhere"):
        run_sft(store, sft_config(run_id, str(tmp_path / "nowhere"), tmp_path))
    with store.session() as s:
        assert [r.run.kind for r in repo.list_runs(s)] == [RunKind.rollout]


def test_cli_help_and_a_bad_kinds_value(tmp_path):
    help_text = agentmem("sft", "--help")
    assert help_text.returncode == 0
    assert all(f in help_text.stdout for f in ("--min-f1", "--kinds", "--lora-rank", "--resume", "--train-dtype"))
    db = tmp_path / "x.db"
    bad = agentmem("sft", "--run", "r", "--kinds", "updates", "--db", str(db))
    assert bad.returncode == 1
    (line,) = bad.stderr.strip().splitlines()
    assert line.startswith("error: unknown call kind(s) ['updates']: give comma-separated memory_update, answer, ")
    assert not db.exists()


@pytest.mark.parametrize("lora_rank", [None, 4])
def test_anchor_is_zero_at_the_start_and_grows_after_a_step(stored, tmp_path, lora_rank):
    """`sft --anchor-weight`: KL to a frozen copy of the starting weights is 0 at the first step and
    positive once the student (or its LoRA adapters) moved; the loss adds it to the cross-entropy."""
    store, run_id, folder = stored
    result = run_sft(store, sft_config(run_id, folder, tmp_path, anchor_weight=0.5, lora_rank=lora_rank, optim=dict(lr=1e-2)))
    first, second = result.history
    assert first.metrics["anchor_loss"] == pytest.approx(0.0, abs=1e-7)
    assert second.metrics["anchor_loss"] > 1e-6
    assert second.loss == pytest.approx(second.metrics["ce_loss"] + 0.5 * second.metrics["anchor_loss"], rel=1e-5)


def test_privileged_context_trains_under_the_privileged_splice(stored, tmp_path):
    """``--context privileged`` (a privileged teacher's SFT): the first step's loss is the mean NLL of the
    stored outputs given the episode's privileged message followed by the stored prompt, which differs from
    the loss given the prompt alone; a warm start (the student's SFT) refuses it."""
    from agentmem.config import WarmStartConfig
    from agentmem.records import SamplingContext
    from agentmem.replay.privileged import privileged_ids

    store, run_id, folder = stored
    selection = select(store, [run_id])
    tok = tiny_tokenizer()
    start = AutoModelForCausalLM.from_pretrained(folder)
    spliced = []
    for inv in selection.invocations:
        prompt = np.concatenate([privileged_ids(tok, selection.episodes[inv.episode_id]), inv.prompt_ids])
        spliced.append(SimpleNamespace(prompt_ids=prompt, output_ids=inv.output_ids, prompt_tokens=len(prompt),
                                       output_tokens=inv.output_tokens))
    assert all(len(s.prompt_ids) > len(i.prompt_ids) for s, i in zip(spliced, selection.invocations, strict=True))
    expected, plain = mean_nll(start, spliced), mean_nll(start, selection.invocations)
    assert abs(expected - plain) > 1e-3  # the splice changes what the model predicts from
    result = run_sft(store, sft_config(run_id, folder, tmp_path, context=SamplingContext.privileged, optim=dict(steps=1)))
    assert result.history[0].loss == pytest.approx(expected, abs=1e-5)
    with pytest.raises(ValueError, match="warm start trains the student"):
        WarmStartConfig(run_ids=[run_id], context=SamplingContext.privileged)


def test_defaults_are_the_warm_start_recipe():
    """`agentmem sft`'s defaults are the measured warm start (docs/learning.md): 16 steps of 8 calls at 5e-5,
    one warmup step, cosine; the finished run's last checkpoint keeps no optimizer state and no folder is
    pruned."""
    from agentmem.config import DistillConfig, LrSchedule, WarmStartConfig

    config = SftConfig(run_ids=["r"])
    optim = config.optim
    assert (optim.steps, config.batch.invocations_per_step, optim.lr, optim.warmup_steps, optim.schedule) == (
        16, 8, 5e-5, 1, LrSchedule.cosine)
    assert (config.keep_optimizer, config.keep_last) == (False, None)
    warm = WarmStartConfig(run_ids=["r"])
    assert (warm.optim, warm.batch, warm.keep_optimizer) == (config.optim, config.batch, True)
    # the sections are distill's: only the four optimizer defaults differ
    distill = DistillConfig(run_ids=["r"])
    assert config.batch == distill.batch
    assert {k for k, v in optim.model_dump().items() if distill.optim.model_dump()[k] != v} == {
        "steps", "lr", "warmup_steps", "schedule"}


def test_only_the_last_checkpoint_of_a_running_job_keeps_the_optimizer(stored, tmp_path):
    """Saving every step: each earlier checkpoint loses its optimizer state once the next is saved, and the
    finished run's last one too unless keep_optimizer; the model folders stay. Resuming past such a run is
    refused before any model loads, naming what to do."""
    from agentmem.errors import ConfigError
    from agentmem.training.checkpoints import TRAINER_STATE, has_optimizer_state, load_objective_state

    store, run_id, folder = stored
    dropped = run_sft(store, sft_config(run_id, folder, tmp_path, save_every=1, keep_optimizer=False, optim=dict(steps=3)))
    kept = run_sft(store, sft_config(run_id, folder, tmp_path, save_every=1, optim=dict(steps=3)))
    with store.session() as s:
        paths = {r.run_id: [Path(c.path) for c in repo.list_checkpoints(s, r.run_id)] for r in (dropped, kept)}
    assert [has_optimizer_state(p) for p in paths[dropped.run_id]] == [False, False, False]
    assert [has_optimizer_state(p) for p in paths[kept.run_id]] == [False, False, True]
    for p in paths[dropped.run_id] + paths[kept.run_id]:
        assert (p / "config.json").is_file() and (p / TRAINER_STATE).is_file()
        assert load_objective_state(p) == load_objective_state(paths[kept.run_id][-1])
    small = (paths[dropped.run_id][-1] / TRAINER_STATE).stat().st_size
    assert small * 10 < (paths[kept.run_id][-1] / TRAINER_STATE).stat().st_size
    with pytest.raises(ConfigError, match=r"kept no optimizer state \(--keep-optimizer keeps it\).*--student "):
        run_sft(store, None, resume=dropped.run_id, steps=5)
    assert run_sft(store, None, resume=kept.run_id, steps=4).history[-1].step == 4


def test_keep_last_deletes_all_but_the_last_folders(stored, tmp_path):
    """--keep-last 2 with a save every step: after four steps only steps 3 and 4 are on disk; every
    checkpoint row stays (the lineage), and the last folder loads."""
    store, run_id, folder = stored
    result = run_sft(store, sft_config(run_id, folder, tmp_path, save_every=1, keep_last=2, optim=dict(steps=4)))
    with store.session() as s:
        ckpts = repo.list_checkpoints(s, result.run_id)
    assert [(c.step, Path(c.path).is_dir()) for c in ckpts] == [(1, False), (2, False), (3, True), (4, True)]
    AutoModelForCausalLM.from_pretrained(result.last_checkpoint.path)


def test_a_pruned_checkpoint_is_refused_in_one_line_naming_its_run(stored, tmp_path, capsys, monkeypatch):
    """A checkpoint whose folder --keep-last deleted keeps its row (the lineage), and naming it as a model
    fails before anything loads: `eval --model` exits 1 with one line naming the flag, the gone folder and
    the run's last checkpoint; the kept ones still resolve."""
    import shutil

    from agentmem.errors import ModelError
    from cli.app import main

    store, run_id, folder = stored
    result = run_sft(store, sft_config(run_id, folder, tmp_path, save_every=1, keep_last=1, optim=dict(steps=3)))
    with store.session() as s:
        first, _, last = repo.list_checkpoints(s, result.run_id)
    want = (f"checkpoint {first.id} was pruned by --keep-last 1 of run {result.run_id}; its folder {first.path} "
            f"is gone (the run's last checkpoint is {last.id})")
    with pytest.raises(ModelError) as info:
        resolve(store, first.id)
    assert str(info.value) == want
    assert resolve(store, last.id).path == last.path
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["agentmem", "eval", "--model", first.id, "--db", str(store.engine.url)])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 1
    assert capsys.readouterr().err == f"error: {want}\n"
    shutil.rmtree(last.path)  # removed by hand: the last checkpoint was not pruned, so the line says only that
    with pytest.raises(ModelError, match=rf"^checkpoint {last.id} of run {result.run_id}: its folder .* is gone$"):
        resolve(store, last.id)


def test_coasting_moves_the_weights_by_the_carried_adamw_state_alone(stored, tmp_path):
    """``optim.coast``: a distill step with zero gradients from an SFT checkpoint's AdamW state lands exactly
    where AdamW stepped on that state with zero gradients lands (the learning plan's null method)."""
    from agentmem.config import LossSection, OptimSection, RLKind, RLSection, TeacherSection
    from agentmem.config.distill_config import DistillConfig
    from agentmem.jobs.distill import run_distill
    from agentmem.training.checkpoints import carry_trainer_state

    store, run_id, folder = stored
    start = run_sft(store, sft_config(run_id, folder, tmp_path, optim=dict(steps=1))).last_checkpoint
    config = DistillConfig(run_ids=[run_id], student=start.id, out=str(tmp_path / "coast"),
                           teacher=TeacherSection(model=None), rl=RLSection(kind=RLKind.none),
                           loss=LossSection(kd_weight=0.0, rl_weight=0.0),
                           optim=OptimSection(steps=1, lr=1e-3, warmup_steps=0, schedule="constant",
                                              carry_optimizer=True, coast=True))
    coasted = run_distill(store, config)
    assert coasted.history[0].loss == 0.0 and coasted.history[0].tokens == 0
    model = AutoModelForCausalLM.from_pretrained(start.path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    assert carry_trainer_state(Path(start.path), optimizer, model)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    moved = AutoModelForCausalLM.from_pretrained(coasted.last_checkpoint.path).state_dict()
    before = AutoModelForCausalLM.from_pretrained(start.path).state_dict()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(moved[name], value, atol=1e-7, rtol=0, msg=name)
    assert sum(not torch.equal(moved[n], before[n]) for n in before) > len(before) // 2  # momentum moved them
    with pytest.raises(ValueError, match="optim.coast takes every step with zero gradients"):
        DistillConfig.model_validate({**config.model_dump(), "loss": {"kd_weight": 0.0, "ce_weight": 1.0}})
    with pytest.raises(ValueError, match="needs optim.carry_optimizer"):
        DistillConfig.model_validate({**config.model_dump(), "optim": {**config.optim.model_dump(),
                                                                       "carry_optimizer": False}})


def test_resume_names_a_gone_checkpoint_and_a_config_of_another_version(stored, tmp_path):
    """Resuming a run whose last checkpoint folder was deleted said it "kept no optimizer state"; one whose stored
    config another version wrote died on a pydantic error naming a flag. Each is one line naming the run now,
    before any model loads."""
    import shutil

    import sqlalchemy as sa

    from agentmem.errors import RunError
    from store.orm import RunRow

    store, run_id, folder = stored
    done = run_sft(store, sft_config(run_id, folder, tmp_path, save_every=1, keep_optimizer=True, optim=dict(steps=2)))
    shutil.rmtree(done.last_checkpoint.path)
    with pytest.raises(RunError, match=rf"^run {done.run_id}: its last checkpoint {done.last_checkpoint.id} is gone "
                                       r"\(no folder .*step-000002\), so the run cannot go on: start a new run$"):
        run_sft(store, None, resume=done.run_id, steps=3)
    with store.session() as s:
        config = s.get(RunRow, done.run_id).config
        s.execute(sa.update(RunRow).where(RunRow.id == done.run_id).values(config={**config, "old_field": 1}))
        s.commit()
    with pytest.raises(RunError, match=rf"^run {done.run_id}: its stored config does not read in this version "
                                       r"\(old_field: Extra inputs are not permitted\): start a new sft run$"):
        run_sft(store, None, resume=done.run_id, steps=3)
    with store.session() as s:
        assert [r.run.kind.value for r in repo.list_runs(s)].count("sft") == 1

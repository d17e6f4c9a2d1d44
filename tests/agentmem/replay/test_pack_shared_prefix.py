"""Shared-prefix packing: the G calls of a (run, task, step) group compute their common prompt prefix once,
and every call still gets exactly the logits and gradients it gets alone (both attention paths); a
suffix never sees a sibling; the prefix is found on token ids only; scores and distillation steps do not
depend on the packing mode."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers import SYNTH, register_policy
from model_helpers import group_sequences, seq

from agentmem.backends.transformers_backend import TransformersBackend
from agentmem.config import AgentConfig, DistillConfig, Packing, RolloutConfig, ScoreConfig
from agentmem.jobs.distill import run_distill
from agentmem.jobs.rollout import run_rollout
from agentmem.jobs.score import run_score
from agentmem.records import TeacherContext
from agentmem.replay import Sequence, pack, shareable_prefix
from agentmem.testing.tiny_models import tiny_llama, tiny_qwen2, tiny_tokenizer
from agentmem.training.collate import collate_rows
from agentmem.training.forward import PackedModel
from agentmem.training.objective import StepInputs, accumulate_step
from agentmem.training.packed_attention import action_logits, packed_logits
from agentmem.training.selection import select, student_sequences
from agentmem.training.teachers import OnlineTeacher
from agentmem.training.terms import objective_from_config
from agentmem.training.trainer import Models, advantages
from store import repository as repo

torch.set_num_threads(1)
MODELS = {"llama": tiny_llama, "qwen2": tiny_qwen2}
PATHS = ["fast", "reference"]


def alone(model, s: Sequence) -> torch.Tensor:
    return model(input_ids=torch.from_numpy(s.input_ids.astype(np.int64))[None], use_cache=False).logits[0]


@pytest.fixture(scope="module")
def shared():
    seqs = group_sequences()
    rows, stats = pack(seqs, row_tokens=90, shared_prefix=True)
    assert len(rows) >= 2 and any(r.prefix_block is not None for r in rows) and stats.shared_tokens > 0
    return {s.invocation_id: s for s in seqs}, collate_rows(rows, pad_id=0)


def test_prefix_is_the_common_ids_cut_before_the_first_action():
    a = seq("a", [5, 6, 7, 8, 9, 10], 4)  # first action predicted at position 3
    b = seq("b", [5, 6, 7, 8, 1, 2, 3], 5)
    assert shareable_prefix([a, b]) == 3  # ids agree on 4 tokens, but position 3 predicts a's first action
    assert shareable_prefix([seq("c", [5, 6, 1, 1], 3), b]) == 2
    assert shareable_prefix([seq("d", [9, 6, 7, 8, 1], 4), b]) == 0
    assert shareable_prefix([a, a]) == 3  # identical calls still keep one prompt token each
    # token ids only: different ids at one offset end the prefix whatever they would decode to
    other = dataclasses.replace(a, input_ids=a.input_ids + np.array([0, 0, 1, 0, 0, 0], np.int32))
    assert shareable_prefix([a, other]) == 2


def test_row_layout_exact_arrays():
    head = [50, 51, 52, 53]
    a = seq("a", head + [60, 61, 62], 5, group=1)
    b = seq("b", head + [70, 71, 72, 73], 6, group=1)
    c = seq("c", [80, 81, 82], 2)
    rows, stats = pack([a, b, c], row_tokens=14, shared_prefix=True)  # as segments: 7 + 8 + 3 = 18 tokens
    assert len(rows) == 1 and stats.tokens == 14 and stats.shared_tokens == 4 and stats.fill == 1.0
    r = rows[0]
    assert r.input_ids.tolist() == [50, 51, 52, 53, 60, 61, 62, 70, 71, 72, 73, 80, 81, 82]
    assert r.position_ids.tolist() == [0, 1, 2, 3, 4, 5, 6, 4, 5, 6, 7, 0, 1, 2]  # suffixes continue from 4
    assert r.cu_seqlens.tolist() == [0, 4, 7, 11, 14] and r.prefix_block.tolist() == [-1, 0, 0, -1]
    assert r.invocation_ids == ("a", "b", "c") and r.invocation_blocks.tolist() == [1, 2, 3]
    assert r.action_mask.tolist() == ([False] * 4 + [True, True, False] + [False, True, True, False]
                                      + [False, True, False])
    assert r.action_ids.tolist() == [61, 62, 72, 73, 82]
    assert r.sampler_logprobs.tolist() == [-1.0, -2.0, -1.0, -2.0, -1.0]
    b_ = collate_rows(rows, pad_id=0)
    assert b_.prefix_blocks.tolist() == [-1, 0, 0, -1] and b_.action_counts == (2, 2, 1)
    assert b_.input_ids[:, 1:][b_.action_mask[:, :-1]].tolist() == b_.action_ids.tolist()


def test_calls_sharing_nothing_fall_back_to_segments():
    seqs = [dataclasses.replace(s, group=None) for s in group_sequences()]
    plain, _ = pack(seqs, row_tokens=90)
    for grouped_seqs in ([s for s in group_sequences() if s.group in (None, "x")], seqs):
        got, stats = pack(grouped_seqs, row_tokens=90, shared_prefix=True)
        want, _ = pack(grouped_seqs, row_tokens=90)
        assert stats.shared_tokens == 0 and all(r.prefix_block is None for r in got)
        for g, w in zip(got, want, strict=True):
            assert g.invocation_ids == w.invocation_ids and np.array_equal(g.input_ids, w.input_ids)
    # the segments mode ignores groups entirely
    grouped, _ = pack(group_sequences(), row_tokens=90)
    assert [r.invocation_ids for r in grouped] == [r.invocation_ids for r in plain]
    assert all(r.prefix_block is None for r in grouped)


def test_group_over_the_budget_is_split_into_subgroups_that_fit():
    head = list(range(10, 20))
    seqs = [seq(f"s{i}", head + [30 + i, 40 + i, 50 + i], 11, group="g") for i in range(5)]
    rows, stats = pack(seqs, row_tokens=19, shared_prefix=True)  # prefix 10 + 3 suffixes of 3 = 19
    assert [r.invocation_ids for r in rows] == [("s0", "s1", "s2"), ("s3", "s4")]
    assert [r.prefix_block.tolist() for r in rows] == [[-1, 0, 0, 0], [-1, 0, 0]]
    assert stats.tokens == 19 + 16 and stats.shared_tokens == 20 + 10


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", MODELS)
def test_logits_equal_per_call(shared, name, attn):
    by_id, batch = shared
    model = MODELS[name](attn=attn)
    with torch.no_grad():
        expected = torch.cat([alone(model, by_id[i])[torch.from_numpy(by_id[i].action_mask)]
                              for i in batch.invocation_ids])
        for path in PATHS:
            got = action_logits(model, batch, path)
            assert got.shape == expected.shape
            assert (got - expected).abs().max().item() <= 1e-4, path
        # every token of a suffix (not only actions) has its call's logits at its original position
        full = packed_logits(model, batch, "fast")
        first = batch.invocation_ids[0]
        s = by_id[first]
        n = int(batch.seq_lens[1])  # block 1: the first suffix of the first group
        prefix = int(batch.seq_lens[0])
        assert (full[prefix : prefix + n] - alone(model, s)[prefix:]).abs().max().item() <= 1e-4
        assert (full[:prefix] - alone(model, s)[:prefix]).abs().max().item() <= 1e-4
    assert model.config._attn_implementation == attn


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("path", PATHS)
def test_gradients_equal_per_call(shared, name, path):
    by_id, batch = shared
    model = MODELS[name](attn="sdpa")
    params = dict(model.named_parameters())

    def logprob_sum(logits, ids):
        return logits.log_softmax(-1).gather(-1, ids[:, None]).sum()

    model.zero_grad()
    loss = logprob_sum(action_logits(model, batch, path), batch.action_ids)
    loss.backward()
    got = {k: p.grad.clone() for k, p in params.items()}
    model.zero_grad()
    ref = sum(logprob_sum(alone(model, by_id[i])[torch.from_numpy(by_id[i].action_mask)],
                          torch.from_numpy(by_id[i].action_ids.astype(np.int64))) for i in batch.invocation_ids)
    ref.backward()
    assert torch.isfinite(loss) and abs(loss.item() - ref.item()) <= 1e-3
    for k, p in params.items():
        torch.testing.assert_close(got[k], p.grad, atol=1e-4, rtol=1e-4, msg=k)


@pytest.mark.parametrize("name", MODELS)
def test_changing_one_suffix_never_changes_a_sibling(shared, name):
    _, batch = shared
    model = MODELS[name](attn="sdpa")
    assert batch.prefix_blocks[1] == 0 and batch.prefix_blocks[2] == 0  # blocks 1, 2: siblings of prefix 0
    cu = batch.cu_seqlens.tolist()
    row0 = int(batch.token_mask[0].sum())
    ids = batch.input_ids.clone()
    ids[0, cu[1] : cu[2]] = (ids[0, cu[1] : cu[2]] + 7) % 250 + 3
    other = dataclasses.replace(batch, input_ids=ids)
    prefix_changed = batch.input_ids.clone()
    prefix_changed[0, 0] = (prefix_changed[0, 0] + 7) % 250 + 3
    with torch.no_grad():
        for path in PATHS:
            a, b = packed_logits(model, batch, path), packed_logits(model, other, path)
            assert (a[cu[1] : cu[2]] - b[cu[1] : cu[2]]).abs().max() > 1e-3  # visible in its own suffix
            assert (a[: cu[1]] - b[: cu[1]]).abs().max().item() <= 1e-6, path  # the prefix
            assert (a[cu[2] :] - b[cu[2] :]).abs().max().item() <= 1e-6, path  # siblings and the rest
            c = packed_logits(model, dataclasses.replace(batch, input_ids=prefix_changed), path)
            for k in range(1, 5):  # a prefix change reaches every suffix of the group
                assert (a[cu[k] : cu[k + 1]] - c[cu[k] : cu[k + 1]]).abs().max() > 1e-3
            assert (a[row0:] - c[row0:]).abs().max().item() <= 1e-6  # and nothing in another row


def test_fast_path_keeps_a_prefix_with_its_suffixes_when_rows_are_long(monkeypatch):
    """On CPU the fast path runs a row as forward passes of about CPU_GROUP_TOKENS: a group stays whole."""
    import agentmem.training.packed_attention as pa

    monkeypatch.setattr(pa, "CPU_GROUP_TOKENS", 20)
    seqs = group_sequences()
    rows, _ = pack(seqs, row_tokens=400, shared_prefix=True)
    batch = collate_rows(rows, pad_id=0)
    ranges = pa.segment_groups(batch.cu_seqlens, 20, [c < 0 for c in batch.prefix_blocks.tolist()])
    assert len(ranges) > 2 and all(batch.prefix_blocks[lo] < 0 for lo, _ in ranges)
    by_id = {s.invocation_id: s for s in seqs}
    model = tiny_llama(attn="sdpa")
    with torch.no_grad():
        expected = torch.cat([alone(model, by_id[i])[torch.from_numpy(by_id[i].action_mask)]
                              for i in batch.invocation_ids])
        assert (action_logits(model, batch, "fast") - expected).abs().max().item() <= 1e-4


# ---- jobs: a stored rollout with G = 4 samples per task ----


@pytest.fixture
def rolled(sqlite_store):
    tok = tiny_tokenizer()
    config = RolloutConfig(model="tiny", episodes=2, group_size=4, chunk_tokens=48, env_knobs=SYNTH,
                           agent=AgentConfig(memory_tokens=8, answer_max_new_tokens=4, temperature=1.0, seed=7))
    policy = register_policy(sqlite_store, "/models/tiny", "tiny")
    result = run_rollout(sqlite_store, config, backend=TransformersBackend.from_model(tiny_llama(seed=3), tok),
                         policy=policy)
    with sqlite_store.session() as s:
        for i, ep in enumerate(repo.list_episodes(s, result.run_id)):
            repo.update_episode(s, ep.model_copy(update={"reward": float(i % 2), "f1": float(i % 2)}))
        s.commit()
    return sqlite_store, result.run_id, policy


def test_stored_siblings_share_a_prefix(rolled):
    store, run_id, _ = rolled
    seqs = student_sequences(select(store, [run_id]))
    assert {s.group for s in seqs} and all(len(s.group) == 3 for s in seqs)
    _, stats = pack(seqs, 4096, shared_prefix=True)
    assert stats.shared_tokens > 0.3 * sum(len(s) for s in seqs)


@pytest.mark.parametrize("context", [TeacherContext.aligned, TeacherContext.privileged])
def test_scores_equal_between_packing_modes(rolled, context):
    from agentmem.training.scoring import LoadedModel

    store, run_id, _ = rolled
    tok = tiny_tokenizer()
    teacher, student = LoadedModel(tiny_llama(seed=1), tok, "t"), LoadedModel(tiny_llama(seed=2), tok, "s")
    got = {}
    for packing in Packing:
        name = f"t-{packing.value}"
        cfg = ScoreConfig(run_ids=[run_id], context=context, row_tokens=1024, packing=packing)
        run_score(store, cfg, teacher=dataclasses.replace(teacher, name=name), student=student)
        with store.session() as s:
            ids = [i.id for i in repo.stream_invocations(s, run_ids=[run_id])]
            got[packing] = repo.get_teacher_scores(s, ids, name, context)
    seg, sh = got[Packing.segments], got[Packing.shared_prefix]
    assert seg.keys() == sh.keys() and len(seg) > 0
    for inv_id, score in seg.items():
        np.testing.assert_allclose(sh[inv_id].token_logprobs, score.token_logprobs, atol=1e-4)
        np.testing.assert_allclose(sh[inv_id].entropy, score.entropy, atol=1e-4)
        np.testing.assert_allclose(sh[inv_id].reverse_kl, score.reverse_kl, atol=1e-4)


def test_distill_step_equal_between_packing_modes(rolled):
    store, run_id, policy = rolled
    tok = tiny_tokenizer()
    student_model, teacher_model, reference = tiny_llama(seed=0).train(), tiny_llama(seed=1), tiny_llama(seed=2)
    selection = select(store, [run_id])
    seqs = student_sequences(selection)
    cfg = DistillConfig(run_ids=[run_id], loss=dict(kd_weight=1.0, rl_weight=0.5, anchor_weight=0.1, weighting="call"))
    objective = objective_from_config(cfg)
    student, ref = PackedModel.create(student_model, tok), PackedModel.create(reference, tok)
    results, grads = {}, {}
    for packing in Packing:
        teacher = OnlineTeacher.for_selection(teacher_model, tok, "t", selection, TeacherContext.privileged,
                                              row_tokens=1024, packing=packing)
        inputs = StepInputs({i.id: i.episode_id for i in selection.invocations}, advantages(selection, False),
                            {i.id: 1.0 for i in selection.invocations},
                            teacher.targets([s.invocation_id for s in seqs]))
        rows, stats = pack(seqs, 1024, shared_prefix=packing is Packing.shared_prefix)
        assert (stats.shared_tokens > 0) == (packing is Packing.shared_prefix)
        student_model.zero_grad()
        results[packing] = accumulate_step(student, rows, inputs, objective, reference=ref)
        grads[packing] = {n: p.grad.clone() for n, p in student_model.named_parameters()}
    a, b = results[Packing.segments], results[Packing.shared_prefix]
    assert a.loss == pytest.approx(b.loss, abs=1e-5) and a.actions == b.actions
    for term in ("kd_loss", "rl_loss"):
        assert a.metrics.get(term, 0.0) == pytest.approx(b.metrics.get(term, 0.0), abs=1e-5)
    for n in grads[Packing.segments]:
        torch.testing.assert_close(grads[Packing.shared_prefix][n], grads[Packing.segments][n], atol=1e-5,
                                   rtol=1e-4, msg=n)


def test_distill_job_runs_with_shared_prefix(rolled, tmp_path):
    store, run_id, policy = rolled
    tok = tiny_tokenizer()
    history = {}
    for packing in Packing:
        models = Models(tiny_llama(seed=0).train(), tok, policy, tiny_llama(seed=1).requires_grad_(False), tok)
        cfg = DistillConfig(run_ids=[run_id], out=str(tmp_path / packing.value), teacher=dict(context=TeacherContext.aligned), optim=dict(steps=2, lr=1e-3), batch=dict(invocations_per_step=64, row_tokens=2048, packing=packing))
        history[packing] = run_distill(store, cfg, models=models).history
    for a, b in zip(history[Packing.segments], history[Packing.shared_prefix], strict=True):
        assert a.loss == pytest.approx(b.loss, abs=1e-4) and a.metrics["actions"] == b.metrics["actions"]
        assert b.tokens < a.tokens  # the shared prefixes were computed once

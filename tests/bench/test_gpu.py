"""bench/gpu.py's pieces that decide its figures: the padded baseline's micro-batches, the FLOP count behind
MFU, and the last line's ratios (its whole dry run is the ``gpu`` case of tests/bench_smoke/test_bench_smoke.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.common.gpu_speed import flops, padded_batches
from bench.common.shapes import SHAPES, build, matmul_params, memagent_calls
from bench.gpu import Check, summary


def test_padded_batches_fit_the_row_budget_in_arrival_order():
    seqs = memagent_calls(7, 10, 40, 300, seed=0)
    lengths = [len(s) for s in seqs]
    batches = padded_batches(seqs, 80)
    assert [s.invocation_id for b in batches for s in b] == [s.invocation_id for s in seqs]
    for b in batches:
        assert len(b) == 1 or len(b) * max(len(s) for s in b) <= 80
    # greedy: the next call would have broken the budget
    i = 0
    for b in batches[:-1]:
        i += len(b)
        assert (len(b) + 1) * max(lengths[i - len(b) : i + 1]) > 80


def test_memagent_calls_share_their_group_head():
    seqs = memagent_calls(6, 30, 60, 300, seed=2, groups=2, head=12)
    assert [s.group for s in seqs] == ["g0", "g1"] * 3
    assert all(np.array_equal(seqs[0].input_ids[:12], s.input_ids[:12]) for s in seqs[::2])
    assert not np.array_equal(seqs[0].input_ids[:12], seqs[1].input_ids[:12])
    for s in seqs:
        assert s.num_actions == int(s.action_mask.sum()) >= 8 and 30 <= len(s) <= 60
        assert np.array_equal(s.input_ids[1:][s.action_mask[:-1]], s.action_ids)  # actions are the next tokens


def test_flops_count_exact():
    model = build("tiny", "cpu", torch.float32)
    seqs = memagent_calls(3, 20, 30, 320, seed=1)
    layer = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128  # q, o; k, v (2 kv heads of 16); gate, up, down
    assert matmul_params(model) == 2 * layer
    lengths = np.array([len(s) for s in seqs])
    actions = sum(s.num_actions for s in seqs)
    forward = 2 * 2 * layer * lengths.sum() + 2 * 2 * 64 * (lengths ** 2).sum() + 2 * 64 * 320 * actions
    assert flops(model, seqs, train=False) == pytest.approx(forward)
    assert flops(model, seqs, train=True) == pytest.approx(3 * forward)


def test_real_shapes_have_their_published_sizes():
    sizes = {"smollm2-135m": 134_515_008, "qwen2.5-0.5b": 494_032_768}  # the models' own parameter counts
    for shape, n in sizes.items():
        assert shape in SHAPES
        model = build(shape, "meta", torch.bfloat16)
        assert sum(p.numel() for p in model.parameters()) == n, shape


def test_summary_line(tmp_path):
    check = Check(tmp_path, True, "cpu")

    def rows(rates: dict, mfu: float | None = None) -> list[dict]:
        return [{"method": m, "tokens_per_s": r, "mfu": mfu} for m, r in rates.items()]

    check.results = {
        "env": {"name": "NVIDIA H100 80GB HBM3", "default_kernel": "flex"},
        "exact": {"packed_vs_unpacked": 0.03, "flex_shared_vs_reference": 0.0625, "logit_scale": 9.0},
        "speed": {"runs": [
            {"calls": 8, "mode": "train", "rows": rows({"padded": 100.0, "packed-sdpa": 150.0, "packed-flex": 200.0})},
            {"calls": 32, "mode": "train", "rows": rows({"padded": 100.0, "packed-sdpa": 120.0, "packed-flex": 300.0},
                                                         0.41)},
            {"calls": 32, "mode": "score", "rows": rows({"padded": 50.0, "packed-sdpa": 80.0, "packed-flex": 90.0})},
        ]},
    }
    assert summary(check) == ("packed_vs_padded_train=3.000 packed_vs_padded_score=1.800 flex_vs_sdpa_segments=2.500 "
                              "mfu=0.410 exact_max_abs=0.0625 device=NVIDIA_H100_80GB_HBM3")
    check.results = {"env": {"name": "cpu", "default_kernel": "sdpa"}}
    assert summary(check) == ("packed_vs_padded_train= packed_vs_padded_score= flex_vs_sdpa_segments= mfu= "
                              "exact_max_abs= device=cpu")

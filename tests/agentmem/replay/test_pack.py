"""Packing: exact rows, boundaries, order, fill and truncation on hand-made sequences."""

from __future__ import annotations

import numpy as np
import pytest

from agentmem.replay import ReplayError, Sequence, pack


def seq(id_: str, prompt: int, output: int, base: int = 0) -> Sequence:
    """A sequence of ``prompt + output`` tokens with ids ``base, base+1, ...``."""
    n = prompt + output
    mask = np.zeros(n, bool)
    mask[prompt - 1 : n - 1] = True
    ids = np.arange(base, base + n, dtype=np.int32)
    return Sequence(
        invocation_id=id_,
        input_ids=ids,
        position_ids=np.arange(n, dtype=np.int32),
        action_mask=mask,
        action_ids=ids[prompt:].copy(),
        sampler_logprobs=-np.arange(1, output + 1, dtype=np.float32),
    )


def test_single_row_exact_arrays():
    rows, stats = pack([seq("a", 2, 1, 100), seq("b", 3, 2, 200)], row_tokens=10)
    assert len(rows) == 1
    r = rows[0]
    assert r.invocation_ids == ("a", "b")  # arrival order inside the row
    assert r.input_ids.tolist() == [100, 101, 102, 200, 201, 202, 203, 204]
    assert r.position_ids.tolist() == [0, 1, 2, 0, 1, 2, 3, 4]
    assert r.cu_seqlens.tolist() == [0, 3, 8] and r.cu_seqlens.dtype == np.int32
    assert r.seq_lens.tolist() == [3, 5]
    assert r.action_mask.tolist() == [False, True, False, False, False, True, True, False]
    assert r.action_ids.tolist() == [102, 203, 204]
    assert r.sampler_logprobs.tolist() == [-1.0, -1.0, -2.0]
    assert stats.rows == 1 and stats.tokens == 8 and stats.sequences == 2
    assert stats.fill == pytest.approx(0.8)


def test_best_fit_decreasing_assignment():
    # lengths 6, 5, 4, 3, 2 into rows of 8: 6 -> row0 (2 left), 5 -> row1 (3 left), 4 -> row2 (4 left),
    # 3 -> best fit is row1 (3 left, exact), 2 -> row0 (2 left, exact)
    lens = {"a": 4, "b": 6, "c": 2, "d": 5, "e": 3}
    rows, stats = pack([seq(k, n - 1, 1) for k, n in lens.items()], row_tokens=8)
    assert [r.invocation_ids for r in rows] == [("b", "c"), ("d", "e"), ("a",)]
    assert [r.cu_seqlens.tolist() for r in rows] == [[0, 6, 8], [0, 5, 8], [0, 4]]
    assert stats.rows == 3 and stats.tokens == 20
    assert stats.fill == pytest.approx(20 / 24)


def test_ties_break_by_arrival_order_and_result_is_deterministic():
    seqs = [seq(f"s{i}", 2, 1) for i in range(5)]  # all length 3, rows of 6
    rows, _ = pack(seqs, row_tokens=6)
    assert [r.invocation_ids for r in rows] == [("s0", "s1"), ("s2", "s3"), ("s4",)]
    again, _ = pack(seqs, row_tokens=6)
    assert [r.invocation_ids for r in again] == [r.invocation_ids for r in rows]


def test_over_budget_is_an_error_naming_the_invocation():
    with pytest.raises(ReplayError, match=r"invocation long: 7 tokens \(5 context \+ 2 actions\) exceed the row budget of 6"):
        pack([seq("long", 5, 2)], row_tokens=6)


def test_truncate_left_cuts_prompt_only():
    rows, stats = pack([seq("long", 5, 2, 10), seq("ok", 2, 1, 50)], row_tokens=6, over_budget="left")
    assert stats.truncated_sequences == 1 and stats.truncated_tokens == 1
    long_row = rows[0]
    assert long_row.invocation_ids == ("long",)
    assert long_row.input_ids.tolist() == [11, 12, 13, 14, 15, 16]
    assert long_row.position_ids.tolist() == [0, 1, 2, 3, 4, 5]
    assert long_row.action_mask.tolist() == [False, False, False, True, True, False]
    assert long_row.action_ids.tolist() == [15, 16]
    assert rows[1].invocation_ids == ("ok",)


def test_truncate_left_may_cut_down_to_the_token_before_the_actions():
    rows, stats = pack([seq("x", 4, 2, 0)], row_tokens=3, over_budget="left")
    assert rows[0].input_ids.tolist() == [3, 4, 5]
    assert rows[0].action_mask.tolist() == [True, True, False]
    assert stats.truncated_tokens == 3


def test_truncate_left_never_cuts_actions():
    with pytest.raises(ReplayError, match="2 action tokens plus the prompt token before them"):
        pack([seq("x", 4, 2)], row_tokens=2, over_budget="left")


def test_empty_input():
    rows, stats = pack([], row_tokens=8)
    assert rows == [] and stats.rows == 0 and stats.fill == 0.0


def test_skip_leaves_over_budget_sequences_out_and_counts_them():
    rows, stats = pack([seq("long", 5, 2, 10), seq("ok", 2, 1, 50), seq("big", 8, 1)], row_tokens=6,
                       over_budget="skip")
    assert [r.invocation_ids for r in rows] == [("ok",)]
    assert rows[0].input_ids.tolist() == [50, 51, 52]  # the kept sequence is whole
    assert stats.skipped_ids == ("long", "big") and stats.skipped_sequences == 2
    assert stats.skipped_tokens == 7 + 9 and stats.truncated_sequences == 0
    assert stats.sequences == 1 and stats.tokens == 3


def test_unknown_over_budget_mode_is_an_error():
    with pytest.raises(ReplayError, match="over_budget"):
        pack([seq("a", 2, 1)], row_tokens=6, over_budget="cut")  # type: ignore[arg-type]

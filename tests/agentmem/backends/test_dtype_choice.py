"""``--dtype auto``: bf16 is measured only where the CPU has native bf16, the faster dtype wins (fp32 on a
tie), the CLI stores the concrete choice; intra-op threads follow the process's CPU affinity."""

from __future__ import annotations

import os

import pytest
import torch

from agentmem.backends import dtype_choice
from agentmem.backends.dtype_choice import DTypeChoice, choose_dtype, cpu_flags, native_bf16
from agentmem.config import DType
from agentmem.runtime import Runtime, default_threads
from agentmem.testing.tiny_models import tiny_llama

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni
processor\t: 1
flags\t\t: fpu sse2 avx2
"""


def test_cpu_flags_come_from_the_first_cpu():
    assert cpu_flags(CPUINFO) == {"fpu", "sse2", "avx2", "avx512f", "avx512_bf16", "avx512_vnni"}
    assert cpu_flags("processor: 0\n") == set()
    assert native_bf16({"avx512_bf16"}) and native_bf16({"amx_bf16", "avx2"}) and not native_bf16({"avx2"})


def test_without_native_bf16_fp32_is_chosen_without_measuring(monkeypatch):
    def boom(*a):
        raise AssertionError("measured")

    monkeypatch.setattr(dtype_choice, "_generation_seconds", boom)
    choice = choose_dtype(tiny_llama(), flags={"avx2", "fma"})
    assert choice == DTypeChoice("float32", "no native bf16 (avx512_bf16/amx_bf16) on this CPU")


def test_auto_loads_no_model_where_there_is_nothing_to_measure(monkeypatch, tmp_path):
    from agentmem import model_refs
    from agentmem.testing.tiny_models import save_tiny

    folder = save_tiny(tmp_path / "tiny")

    def no_load(*a, **k):
        raise AssertionError("loaded")

    monkeypatch.setattr(model_refs, "load_model", no_load)
    monkeypatch.setattr(dtype_choice, "cpu_flags", lambda: {"avx2"})
    assert model_refs.auto_dtype(None, folder) == DTypeChoice("float32", "no native bf16 (avx512_bf16/amx_bf16) on this CPU")
    monkeypatch.setattr(dtype_choice, "cpu_flags", lambda: {"amx_bf16"})
    with pytest.raises(AssertionError, match="loaded"):
        model_refs.auto_dtype(None, folder)


@pytest.mark.parametrize("fp32,bf16,want", [(1.0, 0.5, "bfloat16"), (1.0, 0.96, "float32"), (0.5, 1.0, "float32")])
def test_the_faster_dtype_wins_and_fp32_keeps_a_tie(monkeypatch, fp32, bf16, want):
    monkeypatch.setattr(dtype_choice, "_generation_seconds",
                        lambda model, dtype, repeats: {"float32": fp32, "bfloat16": bf16}[dtype])
    choice = choose_dtype(tiny_llama(), flags={"avx512_bf16"})
    assert choice.dtype == want
    assert f"float32 {fp32 * 1000:.0f} ms" in choice.reason and f"bfloat16 {bf16 * 1000:.0f} ms" in choice.reason


def test_the_measurement_runs_both_dtypes_on_a_copy():
    model = tiny_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    choice = choose_dtype(model, flags={"amx_bf16"}, repeats=1)
    assert choice.dtype in ("float32", "bfloat16") and choice.reason.startswith("native bf16")
    assert model.dtype == torch.float32
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_cli_auto_stores_the_measured_choice(monkeypatch, tmp_path, capsys):
    from agentmem import model_refs
    from cli.common import weights_dtype
    from cli.job_session import print_run_id

    asked = []
    monkeypatch.setattr(model_refs, "auto_dtype",
                        lambda store, ref: asked.append(ref) or DTypeChoice("bfloat16", "measured"))
    db = f"sqlite:///{tmp_path / 'x.db'}"
    assert weights_dtype("float32", "default", db, None) is DType.float32 and asked == []
    assert weights_dtype("auto", "default", db, 1) is DType.bfloat16 and asked == ["default"]
    assert capsys.readouterr().out == ""  # the choice waits for the run id
    print_run_id("r1")
    print_run_id("r2")
    assert capsys.readouterr().out == "run_id=r1\n--dtype auto: bfloat16 (measured)\nrun_id=r2\n"


def test_threads_follow_the_cpu_affinity(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 5})
    assert default_threads() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert default_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert default_threads() is None
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    try:
        assert Runtime.create("cpu").threads == 4 and torch.get_num_threads() == 4
        assert Runtime.create("cpu", threads=1).threads == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(1)

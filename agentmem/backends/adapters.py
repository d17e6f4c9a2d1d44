"""LoRA adapter folders as models: a folder in peft's format (``adapter_config.json`` and
``adapter_model.safetensors``) is accepted wherever a model is.

The adapter names the model it applies to (``base_model_name_or_path``: ``SmolLM2-135M-Instruct`` for the
default model, wherever it was prepared, or a folder or hub name). ``merged_folder`` folds the adapter into
its base once and keeps the result as a plain model folder in the model cache, named by the adapter's
content hash: every backend (transformers, vLLM, a teacher, ``serve``) then loads an ordinary folder, and a
second use costs nothing. The merged folder is complete or absent (written beside, then renamed), and
concurrent merges of one adapter take turns on a lock file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock

from agentmem.errors import ModelError

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"


def is_adapter_folder(path: Path) -> bool:
    """A folder with peft's adapter config and no model config of its own."""
    return (path / CONFIG).is_file() and not (path / "config.json").is_file()


def adapter_base(path: Path) -> str:
    """The model reference the adapter in ``path`` applies to; ``ModelError`` naming the file when it names none."""
    try:
        config = json.loads((path / CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelError(f"{path / CONFIG}: not a readable adapter config ({e})") from e
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not base:
        raise ModelError(f"{path / CONFIG}: base_model_name_or_path is missing: the adapter names no model to apply to")
    return str(base)


def adapter_hash(path: Path) -> str:
    """The first 16 hex digits of the SHA-256 of the adapter's config and weights."""
    if not (path / WEIGHTS).is_file():
        raise ModelError(f"adapter folder {path} has no {WEIGHTS}")
    digest = hashlib.sha256()
    for name in (CONFIG, WEIGHTS):
        digest.update((path / name).read_bytes())
    return digest.hexdigest()[:16]


def merged_folder(path: Path, cache_dir: Path) -> Path:
    """The plain model folder of the adapter in ``path`` merged into its base (made on first use under
    ``cache_dir/adapters``)."""
    from agentmem.backends.model_files import is_model_folder, resolve_model

    base_ref = adapter_base(path)
    target = cache_dir / "adapters" / f"{path.resolve().name}-{adapter_hash(path)}"
    if is_model_folder(target):
        return target
    base = resolve_model(base_ref, cache_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.parent / f".{target.name}.lock"):
        if not is_model_folder(target):
            _merge(path, str(base), target)
    return target


def _merge(adapter: Path, base: str, target: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentmem.backends.model_files import quiet_transformers

    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        with quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
            try:
                model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
            except (ValueError, RuntimeError, KeyError) as e:
                raise ModelError(f"adapter {adapter} does not fit its base model {base}: {e}") from e
            model.save_pretrained(tmp, safe_serialization=True)
        tokenizer_source = adapter if (adapter / "tokenizer_config.json").is_file() else base
        AutoTokenizer.from_pretrained(str(tokenizer_source)).save_pretrained(tmp)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

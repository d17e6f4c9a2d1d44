"""Models as jobs see them: resolve a user's reference, register the version that samples, load it.

A reference is a checkpoint id from the store (abbreviations allowed), a local model folder, ``default``
(SmolLM2-135M-Instruct, prepared from its GGUF on first use) or a hub name (only where a network or the
local hub cache has it). Resolution never loads weights, so jobs resolve every reference first and fail
on a bad one before any model loads.

Checkpoints are registered by path: the model that samples a rollout is registered once (two concurrent
rollouts of one model share one row), and every trained checkpoint names its parent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agentmem.backends.model_files import DEFAULT_MODEL, load_model, resolve_model
from agentmem.backends.types import Backend
from agentmem.config import BackendKind, DType
from agentmem.records import Checkpoint
from agentmem.runtime import Runtime
from store import repository as repo
from store.engine import Store
from store.errors import NotFound

if TYPE_CHECKING:  # torch: only when --dtype auto measures
    from agentmem.backends.dtype_choice import DTypeChoice


@dataclass(frozen=True)
class ModelRef:
    """A resolved reference: the folder (or hub name) to load, the base model it descends from, and the
    checkpoint row when the reference named one."""

    ref: str
    path: str
    base_model: str
    checkpoint: Checkpoint | None = None

    @property
    def adapter_base(self) -> str:
        """How LoRA adapters trained on this model name it (``adapter_config.json``): the default model by its
        name, wherever it was prepared, so the adapters load on another machine; any other model by its
        absolute folder (or hub name)."""
        if self.ref in ("default", DEFAULT_MODEL) and self.checkpoint is None:
            return DEFAULT_MODEL
        local = Path(self.path).expanduser()
        return str(local.resolve()) if local.is_dir() else self.path


def resolve(store: Store | None, ref: str | None) -> ModelRef:
    """Resolve ``ref`` without loading weights. A registered checkpoint id wins over a same-named hub
    model; a missing folder or an unknown name raises ``ModelError`` naming it, and so does a trained checkpoint
    whose folder is gone (``sft --keep-last`` deletes the folders of a run's earlier checkpoints, not their rows)."""
    if ref and store is not None and "/" not in ref and not Path(ref).exists():
        with store.session() as s:
            try:
                ckpt = repo.get_checkpoint(s, ref)
            except NotFound:
                pass
            else:
                if ckpt.run_id is not None and not Path(ckpt.path).is_dir():
                    raise _folder_gone(s, ckpt)
                return ModelRef(ref, ckpt.path, ckpt.base_model, ckpt)
    path = resolve_model(ref)
    base = DEFAULT_MODEL if ref in (None, "default", DEFAULT_MODEL) else str(ref)
    return ModelRef(ref or "default", str(path), base)


def _folder_gone(session, ckpt: Checkpoint):
    """The ``ModelError`` for a trained checkpoint whose folder is missing: pruned by its run's ``--keep-last``
    (naming the run's last checkpoint, which is kept), or removed by hand."""
    from agentmem.errors import ModelError

    run = repo.get_run(session, ckpt.run_id)
    keep = run.config.get("keep_last")
    last = repo.list_checkpoints(session, run.id)[-1]
    if keep is not None and last.id != ckpt.id:
        return ModelError(f"checkpoint {ckpt.id} was pruned by --keep-last {keep} of run {run.id}; its folder "
                          f"{ckpt.path} is gone (the run's last checkpoint is {last.id})")
    return ModelError(f"checkpoint {ckpt.id} of run {run.id}: its folder {ckpt.path} is gone")


def register(store: Store, model: ModelRef) -> Checkpoint:
    """The checkpoint row of the model that samples: the named checkpoint itself, or the row registered
    for its path (created once, race-free across processes)."""
    if model.checkpoint is not None:
        return model.checkpoint
    with store.session() as s:
        ckpt = repo.register_checkpoint(s, model.path, model.base_model)
        s.commit()
    return ckpt


def auto_dtype(store: Store | None, ref: str | None) -> DTypeChoice:
    """``--dtype auto``: the faster generating dtype for the model ``ref`` on this CPU (loaded in fp32 to measure,
    only where the CPU has native bf16)."""
    from agentmem.backends.dtype_choice import choose_dtype, unmeasured_choice

    path = resolve(store, ref).path
    if (choice := unmeasured_choice()) is not None:
        return choice
    model, _ = load_model(path, dtype="float32")
    return choose_dtype(model)


def load_tokenizer(path: str):
    """The tokenizer alone (cheap: jobs build environments from it before any weights load)."""
    from transformers import AutoTokenizer

    from agentmem.errors import ModelError

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"cannot load the tokenizer of model {path!r}: {first}") from e


def load(path: str | Path, dtype: DType | str, runtime: Runtime, *, trainable: bool = False):
    """(model, tokenizer) on the runtime's device, in eval mode; frozen unless ``trainable``."""
    model, tokenizer = load_model(path, dtype=str(runtime.dtype_for(dtype)), device=runtime.device)
    model.requires_grad_(trainable)
    return model, tokenizer


def backend(kind: BackendKind | str, path: str, dtype: DType | str, runtime: Runtime, *,
            base_url: str | Sequence[str] | None = None, served_name: str | None = None,
            static_decode: bool = True) -> Backend:
    """A generation backend for ``path`` on the runtime's device (vLLM is imported only when asked for);
    ``openai``: a client of the server at ``base_url`` serving the model under ``served_name``, with the
    tokenizer of ``path`` (no weights load); several URLs: a ``ServerPool`` of them (``backends.server_pool``); ``static_decode=False``: the transformers backend's generic
    decode step (for comparisons)."""
    from agentmem.backends.registry import make_backend

    if str(kind) == BackendKind.openai.value:
        from agentmem.backends.openai_backend import OpenAIBackend
        from agentmem.errors import BackendError

        urls = [base_url] if isinstance(base_url, str) else list(base_url or ())
        if not urls:
            raise BackendError("backend openai needs a base URL (--base-url)")
        tokenizer = load_tokenizer(path)
        clients = [OpenAIBackend(url, served_name or path, tokenizer) for url in urls]
        if len(clients) == 1:
            return clients[0]
        from agentmem.backends.server_pool import ServerPool

        return ServerPool(clients)

    return make_backend(str(kind), path, str(runtime.dtype_for(dtype)), device=runtime.device,
                        static_decode=static_decode)


def sampler(store: Store, model: ModelRef, kind: BackendKind | str, dtype: DType | str,
            runtime: Runtime, *, base_url: str | Sequence[str] | None = None) -> tuple[Checkpoint, Backend]:
    """(checkpoint row, generation backend) of the model that samples a run's calls; ``base_url``: the
    server of backend ``openai`` (which serves the model under the reference's name)."""
    return register(store, model), backend(kind, model.path, dtype, runtime, base_url=base_url, served_name=model.ref)

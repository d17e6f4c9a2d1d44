"""LoRA adapters for ``agentmem sft --lora-rank`` (through ``peft``).

``wrap`` injects adapters into a transformers model in place and returns peft's wrapper, whose only
trainable parameters are the adapters. The packed forward runs the wrapped model's own transformers model
(``base_model``): the LoRA layers sit inside it, so they apply on every path.

Checkpoints stay plain model folders: ``merged`` folds the adapters into a copy of the weights (the model
being trained is untouched). ``save_adapter`` also writes the adapters in peft's own format into the
checkpoint's ``adapter/`` folder (``adapter_model.safetensors`` and ``adapter_config.json``, naming the model they
apply to): a few MB that can be shared and loaded as a model (``backends.adapters``). The adapters themselves
(``adapter_state``) go into the trainer state too, so
a resume re-wraps the *starting* weights and loads them back (``load_adapter_state``): exactly the model
that was being trained, not the merged one (merging rounds the sum ``W + B A`` once, which a resumed run
would then train on). Adapter initialisation is seeded, so a fresh run is reproducible too.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel

from agentmem.errors import TrainingError

ADAPTER_DIR = "adapter"  # a LoRA checkpoint's adapters in peft's format, inside the checkpoint folder


def is_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` is peft's wrapper (a transformers model is not)."""
    return not isinstance(model, PreTrainedModel)


def base_model(model: torch.nn.Module) -> PreTrainedModel:
    """The transformers model to run: the model itself, or the one under peft's wrapper (with the LoRA
    layers injected into it)."""
    return model if isinstance(model, PreTrainedModel) else model.get_base_model()


def wrap(model: PreTrainedModel, rank: int, alpha: float, dropout: float, targets: Sequence[str],
         seed: int, base_ref: str | None = None) -> torch.nn.Module:
    """Adapters of rank ``rank`` on the modules named ``targets``; every other weight is frozen. ``base_ref``:
    the model reference the saved adapters name as theirs (``adapter_config.json``'s
    ``base_model_name_or_path``; default: the folder the weights were loaded from)."""
    from peft import LoraConfig, get_peft_model

    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = sorted(set(targets) - names)
    if missing:
        raise TrainingError(f"LoRA targets {missing} are not modules of {type(model).__name__} "
                            "(--lora-targets; llama-style names: q_proj, k_proj, v_proj, o_proj, gate_proj, ...)")
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets),
                        task_type="CAUSAL_LM", base_model_name_or_path=base_ref)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        wrapped = get_peft_model(model, config)
    if base_ref is not None:  # peft replaces it with the folder the weights came from
        wrapped.peft_config["default"].base_model_name_or_path = base_ref
    return wrapped


def merged(model: torch.nn.Module) -> PreTrainedModel:
    """A plain transformers model with the adapters folded into its weights (a copy; ``model`` keeps
    training)."""
    return copy.deepcopy(model).merge_and_unload()


def save_adapter(model: torch.nn.Module, folder: Path) -> Path:
    """Write the adapters in peft's format (``adapter_model.safetensors``, ``adapter_config.json``) into
    ``folder``; returns it."""
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(model).items()}


def load_adapter_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, state)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        raise TrainingError(f"the stored LoRA adapters do not fit the model (missing {missing[:3]}, "
                            f"unexpected {list(result.unexpected_keys)[:3]}): same --lora-rank and targets?")

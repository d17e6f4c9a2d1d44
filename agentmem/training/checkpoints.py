"""Checkpoint folders: a loadable model folder (safetensors + config + tokenizer, in the dtype it was trained in)
plus the trainer state (optimizer, step, the objective's state across steps) that ``--resume`` needs to give the same
next step as an uninterrupted run. The optimizer state (twice the model's size under AdamW) is kept only where a
later step can start from it: ``drop_optimizer_state`` removes it from a run's earlier checkpoints as new ones are
saved (``jobs.training_shell.train_steps``).

A model with LoRA adapters (``training.lora``) is saved merged, so the folder is a plain model folder any
transformers loader reads; its adapters go into the trainer state (key ``adapter``), for an exact resume, and
into ``adapter/`` in peft's format, to share on their own (``lora.save_adapter``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentmem.backends.model_files import quiet_transformers
from agentmem.errors import TrainingError
from agentmem.training import lora

TRAINER_STATE = "trainer_state.pt"


def gather_full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """The full (unsharded) model and optimizer state of an FSDP2-sharded ``model``, on the CPU: a
    collective, so every process calls it (``StateDictOptions(full_state_dict=True, cpu_offload=True)``).
    The optimizer state is keyed by parameter name (``set_optimizer_state_dict`` restores it)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)


def save_checkpoint(folder: Path, model: PreTrainedModel | torch.nn.Module, tokenizer: PreTrainedTokenizerBase,
                    optimizer: torch.optim.Optimizer, step: int, objective: Mapping[str, float] | None = None,
                    full_state: tuple[dict, dict] | None = None) -> Path:
    """Write atomically: a killed save leaves no half folder. ``objective``: the state the objective keeps
    across steps (``Objective.state_dict``: the barycenter target's alpha EMA), restored on resume.
    ``full_state``: (model, optimizer) state gathered from a sharded model (``gather_full_state``), written
    instead of the model's and optimizer's own; the optimizer state is then keyed by parameter name."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if full_state is not None:
        if lora.is_lora(model):
            raise TrainingError("LoRA under FSDP is not supported: train LoRA with DDP (no --fsdp)")
        model_state, optimizer_state = full_state
        state = {"optimizer": optimizer_state, "optimizer_format": "by_name", "step": step}
    else:
        model_state = None
        state = {"optimizer": optimizer.state_dict(), "step": step}
    if objective:
        state["objective"] = dict(objective)
    if lora.is_lora(model):
        state["adapter"] = lora.adapter_state(model)
        lora.save_adapter(model, tmp / lora.ADAPTER_DIR)
        model = lora.merged(model)
    with quiet_transformers():  # no "Writing model shards" bar between a job's own lines
        if model_state is not None:
            model.save_pretrained(tmp, safe_serialization=True, state_dict=_untied(model, model_state))
        else:
            model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save(state, tmp / TRAINER_STATE)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    return folder


def _untied(model: torch.nn.Module, state: dict) -> dict:
    """``state`` without the output embedding when the model ties it to the input one: a gathered state holds
    both as separate tensors, which ``save_pretrained`` would write twice."""
    config = getattr(model, "config", None)
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if output is None or not getattr(config, "tie_word_embeddings", False):
        return state
    names = [f"{name}.weight" for name, module in model.named_modules() if module is output]
    return {k: v for k, v in state.items() if k not in names}


def has_trainer_state(folder: Path) -> bool:
    """Whether ``folder`` is a training checkpoint (a base model folder is not); its optimizer state may have
    been dropped since (``has_optimizer_state``)."""
    return (Path(folder) / TRAINER_STATE).is_file()


def has_optimizer_state(folder: Path) -> bool:
    """Whether ``folder`` is a training checkpoint that still keeps its optimizer state."""
    return has_trainer_state(folder) and "optimizer" in _state(folder, mmap=True)


def drop_optimizer_state(folder: Path) -> int:
    """Remove the optimizer state from a checkpoint's trainer state, atomically (the step, the objective's state
    and a LoRA run's adapters stay): the bytes freed, 0 when there was none. A checkpoint that no later step
    resumes from needs none: the optimizer state is twice the model's size."""
    path = Path(folder) / TRAINER_STATE
    if not path.is_file():
        return 0
    state = _state(folder, mmap=True)
    if "optimizer" not in state:
        return 0
    before = path.stat().st_size
    kept = {k: v for k, v in state.items() if k not in ("optimizer", "optimizer_format")}
    tmp = path.with_name(path.name + ".tmp")
    torch.save(kept, tmp)
    os.replace(tmp, path)
    return before - path.stat().st_size


def _state(folder: Path, mmap: bool = False) -> dict:
    path = Path(folder) / TRAINER_STATE
    if not path.is_file():
        raise TrainingError(f"{folder} has no {TRAINER_STATE}: it is not a training checkpoint that can be resumed")
    return torch.load(path, weights_only=True, mmap=mmap)


def load_trainer_state(folder: Path, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None = None) -> int:
    """Restore the optimizer from a checkpoint folder; return the number of steps it had done. A state saved
    from a sharded (FSDP2) run is keyed by parameter name and needs ``model`` (sharded or not: every process
    calls this; ``set_optimizer_state_dict`` shards it as the model is)."""
    return _restore(_state(folder), folder, optimizer, model)


def _restore(state: dict, folder: Path, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None) -> int:
    if "optimizer" not in state:
        raise TrainingError(
            f"{folder} kept no optimizer state (only the last checkpoint of a run keeps it, and a finished run's "
            f"only with --keep-optimizer): start a new job from it instead (--student / --student with its id)")
    if state.get("optimizer_format") == "by_name":
        if model is None:
            raise TrainingError(f"{folder}: an FSDP checkpoint's optimizer state needs the model to restore it")
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, optim_state_dict=state["optimizer"],
                                 options=StateDictOptions(full_state_dict=True))
    else:
        optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def carry_trainer_state(folder: Path, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None = None,
                        first_moment: bool = True) -> bool:
    """Start ``optimizer`` from the state a checkpoint folder kept, when it kept a full-parameter one; False
    (nothing loaded) for a folder without a state (a base model) or with a LoRA run's (adapters only: it does
    not fit a full-parameter optimizer). ``first_moment=False`` zeroes AdamW's running mean of gradients
    (``exp_avg``) and keeps its second moment and step count: with zero gradients the optimizer then moves
    nothing, and each update is the new gradients' alone, scaled as the carried state scales it (the bias
    correction of the carried step count is the one a carried first moment's gradient part had)."""
    if not has_trainer_state(folder):
        return False
    state = _state(folder)
    if "adapter" in state:
        return False
    _restore(state, folder, optimizer, model)
    if not first_moment:
        for param_state in optimizer.state.values():
            if "exp_avg" not in param_state:
                raise TrainingError(f"{folder}: the carried optimizer state has no first moment (exp_avg) to zero")
            param_state["exp_avg"].zero_()
    return True


def load_objective_state(folder: Path) -> dict[str, float]:
    """The objective's state a checkpoint kept (empty when it kept none)."""
    return dict(_state(folder).get("objective", {}))


def load_adapters(folder: Path, model: torch.nn.Module) -> None:
    """Restore the LoRA adapters a checkpoint of a LoRA run stored into ``model`` (wrapped the same way)."""
    state = _state(folder)
    if "adapter" not in state:
        raise TrainingError(f"{folder} holds no LoRA adapters: it was not saved by a LoRA run")
    lora.load_adapter_state(model, state["adapter"])

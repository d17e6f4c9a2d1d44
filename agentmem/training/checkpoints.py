"""Checkpoint folders: a loadable model folder (safetensors + config + tokenizer) plus the trainer state
(optimizer, step, the objective's state across steps) that ``--resume`` needs to give the same next step as an uninterrupted run.

A model with LoRA adapters (``training.lora``) is saved merged, so the folder is a plain model folder any
transformers loader reads; its adapters go into the trainer state (key ``adapter``), for an exact resume."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentmem.errors import TrainingError
from agentmem.training import lora

TRAINER_STATE = "trainer_state.pt"


def save_checkpoint(folder: Path, model: PreTrainedModel | torch.nn.Module, tokenizer: PreTrainedTokenizerBase,
                    optimizer: torch.optim.Optimizer, step: int, objective: Mapping[str, float] | None = None) -> Path:
    """Write atomically: a killed save leaves no half folder. ``objective``: the state the objective keeps
    across steps (``Objective.state_dict``: the barycenter target's alpha EMA), restored on resume."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {"optimizer": optimizer.state_dict(), "step": step}
    if objective:
        state["objective"] = dict(objective)
    if lora.is_lora(model):
        state["adapter"] = lora.adapter_state(model)
        model = lora.merged(model)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save(state, tmp / TRAINER_STATE)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    return folder


def _state(folder: Path) -> dict:
    path = Path(folder) / TRAINER_STATE
    if not path.is_file():
        raise TrainingError(f"{folder} has no {TRAINER_STATE}: it is not a training checkpoint that can be resumed")
    return torch.load(path, weights_only=True)


def load_trainer_state(folder: Path, optimizer: torch.optim.Optimizer) -> int:
    """Restore the optimizer from a checkpoint folder; return the number of steps it had done."""
    state = _state(folder)
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def load_objective_state(folder: Path) -> dict[str, float]:
    """The objective's state a checkpoint kept (empty when it kept none)."""
    return dict(_state(folder).get("objective", {}))


def load_adapters(folder: Path, model: torch.nn.Module) -> None:
    """Restore the LoRA adapters a checkpoint of a LoRA run stored into ``model`` (wrapped the same way)."""
    state = _state(folder)
    if "adapter" not in state:
        raise TrainingError(f"{folder} holds no LoRA adapters: it was not saved by a LoRA run")
    lora.load_adapter_state(model, state["adapter"])

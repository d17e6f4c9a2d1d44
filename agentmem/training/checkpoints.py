"""Checkpoint folders: a loadable model folder (safetensors + config + tokenizer) plus the trainer state
(optimizer, step) that ``--resume`` needs to give the same next step as an uninterrupted run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentmem.errors import TrainingError

TRAINER_STATE = "trainer_state.pt"


def save_checkpoint(folder: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                    optimizer: torch.optim.Optimizer, step: int) -> Path:
    """Write atomically: a killed save leaves no half folder."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save({"optimizer": optimizer.state_dict(), "step": step}, tmp / TRAINER_STATE)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    return folder


def load_trainer_state(folder: Path, optimizer: torch.optim.Optimizer) -> int:
    """Restore the optimizer from a checkpoint folder; return the number of steps it had done."""
    path = Path(folder) / TRAINER_STATE
    if not path.is_file():
        raise TrainingError(f"{folder} has no {TRAINER_STATE}: it is not a distill checkpoint that can be resumed")
    state = torch.load(path, weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])

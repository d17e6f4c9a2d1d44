"""Teacher and student must share a vocabulary: the divergences compare distributions token by token."""

from __future__ import annotations

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentmem.errors import TrainingError


def check_same_vocab(teacher: PreTrainedTokenizerBase, student: PreTrainedTokenizerBase) -> int:
    """The shared vocabulary size; raises TrainingError naming the first difference when they differ."""
    tv, sv = teacher.get_vocab(), student.get_vocab()
    if tv != sv:
        only_t = sorted(set(tv) - set(sv))[:3]
        moved = [t for t in tv if t in sv and tv[t] != sv[t]][:3]
        detail = f"tokens only in the teacher: {only_t}" if only_t else f"tokens with other ids: {moved}"
        raise TrainingError(f"teacher and student vocabularies differ ({len(tv)} vs {len(sv)} tokens; {detail}): "
                         "distillation needs the same tokenizer")
    return len(tv)


def vocab_size(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> int:
    """The tokenizer's vocabulary size, which logits are cut to. An embedding matrix padded past it (as in
    some Qwen sizes) is fine; one smaller than the tokenizer is an error."""
    n = len(tokenizer)
    rows = model.get_output_embeddings().weight.shape[0]
    if rows < n:
        raise TrainingError(f"model output layer has {rows} rows but its tokenizer has {n} tokens")
    return n

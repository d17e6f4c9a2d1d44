"""Tiny, randomly initialised models and a small trained tokenizer, built offline inside the tests.

Nothing here touches a hub: the tokenizer is a byte-level BPE trained on a few sentences, with a
ChatML-style chat template like SmolLM2's, and the models are built from configs.
"""

from __future__ import annotations

import functools

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# A template that renders tools, assistant tool calls and tool results: the tool list goes into the first user
# message, as Llama 3.1's template puts it, and calls are Hermes ``<tool_call>`` JSON (Qwen2.5, SmolLM3).
TOOL_CHAT_TEMPLATE = (  # newlines as strings: chat templates render with trim_blocks
    "{%- set ns = namespace(tools_sent=false) %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] %}{{ '<|im_start|>assistant\\n' }}"
    "{% if message['content'] %}{{ message['content'] + '\\n' }}{% endif %}"
    "{% for call in message['tool_calls'] %}{{ '<tool_call>\\n{\"name\": \"' + call['function']['name'] + "
    "'\", \"arguments\": ' + (call['function']['arguments'] | tojson) + '}\\n</tool_call>' }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'user' and tools and not ns.tools_sent %}{% set ns.tools_sent = true %}"
    "{{ '<|im_start|>user\\n# Tools\\n<tools>' }}{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\\n</tools>\\n\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "The capital of France is Paris. Alice was born in Lyon and works in Berlin.",
    "Question: where does Bob live? Memory: Bob lives in Oslo. Answer: Oslo.",
    "Update the memory with facts from the chunk that help answer the question.",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,:;!?'\"-()",
]


@functools.lru_cache(maxsize=1)
def tiny_tokenizer(vocab_size: int = 320) -> PreTrainedTokenizerFast:
    return _trained(vocab_size, CHAT_TEMPLATE)


@functools.lru_cache(maxsize=1)
def tool_tokenizer() -> PreTrainedTokenizerFast:
    """``tiny_tokenizer`` (the same ids) with a chat template that renders tools (``TOOL_CHAT_TEMPLATE``)."""
    return _trained(320, TOOL_CHAT_TEMPLATE)


def _trained(vocab_size: int, chat_template: str) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = chat_template
    return fast


def _small(cfg_cls, vocab_size: int, **extra):
    return cfg_cls(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        **extra,
    )


def tiny_llama(vocab_size: int | None = None, seed: int = 0, attn: str = "eager") -> LlamaForCausalLM:
    vocab_size = vocab_size or len(tiny_tokenizer())
    torch.manual_seed(seed)
    cfg = _small(LlamaConfig, vocab_size, eos_token_id=tiny_tokenizer().eos_token_id,
                 pad_token_id=tiny_tokenizer().pad_token_id)
    cfg._attn_implementation = attn
    return LlamaForCausalLM(cfg).eval().to(torch.float32)


def tiny_qwen2(vocab_size: int | None = None, seed: int = 0, attn: str = "eager") -> Qwen2ForCausalLM:
    vocab_size = vocab_size or len(tiny_tokenizer())
    torch.manual_seed(seed)
    cfg = _small(Qwen2Config, vocab_size, eos_token_id=tiny_tokenizer().eos_token_id,
                 pad_token_id=tiny_tokenizer().pad_token_id)
    cfg._attn_implementation = attn
    return Qwen2ForCausalLM(cfg).eval().to(torch.float32)


def tiny_llama_vllm(seed: int = 0) -> LlamaForCausalLM:
    """A tiny Llama whose heads vLLM-CPU's attention kernels take (head_dim 64; ``tiny_llama``'s 8 they refuse)."""
    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return LlamaForCausalLM(cfg).eval().to(torch.float32)


def save_tiny(path, model=None, tokenizer=None) -> str:
    """Write a tiny model folder (weights + config + tokenizer), usable anywhere a model path is."""
    model = model or tiny_llama()
    model.save_pretrained(path)
    (tokenizer or tiny_tokenizer()).save_pretrained(path)
    return str(path)

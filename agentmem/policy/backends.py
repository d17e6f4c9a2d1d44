"""Choose a generation backend by name; vLLM is imported only when asked for."""

from __future__ import annotations

from agentmem.policy.types import Backend


def make_backend(kind: str, path: str, dtype: str = "bfloat16") -> Backend:
    if kind == "vllm":
        from agentmem.policy.vllm_backend import VLLMBackend

        return VLLMBackend(path)
    if kind != "transformers":
        raise ValueError(f"unknown backend {kind!r}: choose transformers or vllm")
    from agentmem.policy.transformers_backend import TransformersBackend

    return TransformersBackend(path, dtype=dtype)

"""Choose a generation backend by name; vLLM is imported only when asked for."""

from __future__ import annotations

from agentmem.backends.types import Backend
from agentmem.errors import BackendError

BACKENDS = ("transformers", "vllm")


def make_backend(
    kind: str, path: str, dtype: str = "bfloat16", *, device: str = "cpu", static_decode: bool = True
) -> Backend:
    """The backend ``kind`` serving the model at ``path``; BackendError for an unknown name or a missing
    engine (vllm not installed). ``device`` and ``static_decode`` (False: the generic transformers decode
    step) are for transformers (vLLM places the model itself)."""
    if kind == "vllm":
        from agentmem.backends.vllm_backend import VLLMBackend

        return VLLMBackend(path, dtype=dtype)
    if kind != "transformers":
        raise BackendError(f"unknown backend {kind!r}: choose one of {', '.join(BACKENDS)}")
    from agentmem.backends.transformers_backend import TransformersBackend

    return TransformersBackend(path, dtype=dtype, device=device, static_decode=static_decode)

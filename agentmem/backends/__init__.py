"""Generation backends behind one protocol (``Backend``), and where models come from.

``TransformersBackend`` is the default (CPU); ``VLLMBackend`` needs the optional ``vllm`` extra;
``ScriptedBackend`` is for tests. See ``types`` for the log-prob semantics every backend shares.
"""

import importlib

# Names load on first use (PEP 562), so importing ``agentmem.backends.types`` does not import torch.
_WHERE = {
    "BackendError": "agentmem.errors", "ModelError": "agentmem.errors", "PolicyError": "agentmem.errors",
    "DEFAULT_MODEL": ".model_files", "load_model": ".model_files", "prepare_default_model": ".model_files",
    "resolve_model": ".model_files", "ScriptedBackend": ".scripted", "TransformersBackend": ".transformers_backend",
    "Backend": ".types", "Generation": ".types", "SamplingParams": ".types", "VLLMBackend": ".vllm_backend",
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'agentmem.backends' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name], __name__), name)


__all__ = [
    "DEFAULT_MODEL",
    "Backend",
    "BackendError",
    "Generation",
    "ModelError",
    "PolicyError",
    "SamplingParams",
    "ScriptedBackend",
    "TransformersBackend",
    "VLLMBackend",
    "load_model",
    "prepare_default_model",
    "resolve_model",
]

"""Generation backends behind one protocol (``Backend``), and where models come from.

``TransformersBackend`` is the default (CPU); ``VLLMBackend`` needs the optional ``vllm`` extra;
``ScriptedBackend`` is for tests. See ``types`` for the log-prob semantics every backend shares.
"""

from agentmem.policy.errors import BackendError, ModelError, PolicyError
from agentmem.policy.models import DEFAULT_MODEL, load_model, prepare_default_model, resolve_model
from agentmem.policy.scripted import ScriptedBackend
from agentmem.policy.transformers_backend import TransformersBackend
from agentmem.policy.types import Backend, Generation, SamplingParams
from agentmem.policy.vllm_backend import VLLMBackend

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

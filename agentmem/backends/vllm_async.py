"""vLLM's async engine (``vllm.AsyncLLMEngine``, i.e. ``AsyncLLM``) as an ``AsyncEngine``: continuous batching.

Every request is added to the engine as it arrives (``AsyncLLM.generate``) and streams what the engine
samples, step by step (``RequestOutputKind.DELTA``: each output holds only the new ids and their log-probs);
the engine schedules all live requests together. Stored ids and log-probs are vLLM's own, with the
semantics of the offline backend (``vllm_backend``): ``logprobs_mode="processed_logprobs"`` (log-probs
after a grammar's mask and the shaping options, which go to vLLM's ``SamplingParams`` under their own names, and temperature),
``top_p == 1`` only, the sampled id's log-prob always, plus the ``top_k`` most likely
alternatives when asked (vLLM's ``logprobs=k``, the same distribution), and completion ``index`` of a
request sampled with seed ``seed + index``. Closing a stream early (the client left, a stop string
completed) closes vLLM's generator, which aborts the request in the engine.

vLLM is imported in ``AsyncVLLMEngine.__init__`` only; build the engine inside the event loop that will use it.
``progress`` (one ``RequestOutput`` to a ``Progress``) is pure and needs no vLLM.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agentmem.backends.types import Progress, SamplingParams
from agentmem.backends.vllm_backend import VLLM_MISSING, guidance_backend, structured
from agentmem.errors import BackendError
from agentmem.records import FinishReason

TOP_P_REFUSED = ("vLLM returns nucleus-renormalised log-probs for top_p < 1, not the full-vocabulary ones "
                 "training expects: use top_p = 1 (or the transformers backend)")


class AsyncVLLMEngine:
    name = "vllm"
    nucleus = False  # top_p < 1: vLLM's log-probs are renormalised over the nucleus
    shaping = True  # logit_bias, penalties, top_k and min_p go to vLLM's SamplingParams
    constrains = True  # a grammar goes to vLLM's structured outputs (llguidance)

    def __init__(self, model_path: str, *, dtype: str = "bfloat16", **engine_kwargs: Any) -> None:
        """``engine_kwargs`` go to ``vllm.AsyncEngineArgs`` as they are (``max_model_len``, ...)."""
        try:
            import vllm
            from vllm.sampling_params import RequestOutputKind
        except ImportError:
            raise BackendError(VLLM_MISSING) from None
        self._vllm, self._delta = vllm, RequestOutputKind.DELTA
        args = vllm.AsyncEngineArgs(model=str(model_path), dtype=dtype, logprobs_mode="processed_logprobs", seed=0,
                                    **{"enable_prefix_caching": True, **guidance_backend(), **engine_kwargs})
        self.llm = vllm.AsyncLLMEngine.from_engine_args(args)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))  # the model's own chat template
        self.max_model_len = int(self.llm.model_config.max_model_len)

    async def stream(self, prompt: list[int], params: SamplingParams, *, index: int, top_k: int,
                     request_id: str) -> AsyncIterator[Progress]:
        if params.top_p < 1:
            raise BackendError(TOP_P_REFUSED)
        sampling = self._vllm.SamplingParams(
            temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
            logprobs=top_k, seed=None if params.seed is None else params.seed + index, detokenize=False,
            output_kind=self._delta, **params.shaping, **structured(self._vllm, params))
        outputs = self.llm.generate(self._vllm.TokensPrompt(prompt_token_ids=list(prompt)), sampling, request_id)
        try:
            async for out in outputs:
                yield progress(out, top_k)
        finally:
            await outputs.aclose()  # before the end: vLLM aborts the request

    def shutdown(self) -> None:
        self.llm.shutdown()
        del self.llm  # its __del__ shuts down again now, not at interpreter exit (when vLLM's modules are gone)


def progress(output: Any, top_k: int) -> Progress:
    """A vLLM ``RequestOutput`` (delta kind, one completion) as a ``Progress``: the new ids, the log-prob of
    each under its position's entries, the ``top_k`` entries of rank 1..k, most likely first, and the
    finish reason once finished (``stop``: an eos id, ``length``: ``max_tokens``; else ``error``)."""
    completion = output.outputs[0]
    ids = [int(t) for t in completion.token_ids]
    steps = list(completion.logprobs or [])
    if len(steps) != len(ids):
        raise BackendError(f"vLLM returned {len(ids)} ids but {len(steps)} log-prob positions")
    logprobs = [float(step[t].logprob) for t, step in zip(ids, steps, strict=True)]
    top = None
    if top_k:
        top = [[(int(t), float(lp.logprob)) for t, lp in sorted(step.items(), key=lambda kv: kv[1].rank)
                if lp.rank is not None and lp.rank <= top_k] for step in steps]
    reason = None
    if output.finished:
        reason = {"stop": FinishReason.stop, "length": FinishReason.length}.get(completion.finish_reason,
                                                                                FinishReason.error)
    return Progress(ids, logprobs, top, reason)

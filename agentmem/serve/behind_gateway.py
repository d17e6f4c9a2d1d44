"""What an ``agentmem serve`` does for a gateway in front of it (another ``agentmem serve --upstream``).

- ``X-Agentmem-Record: no`` (``RECORD_HEADER``; behind the API key like every route): the call is generated
  and answered but not stored. A gateway sends it with every upstream call, so a call is recorded once, in the
  gateway's store (an upstream that is not agentmem, vLLM, ignores the header).
- ``prompt_logprobs: 0`` on ``/v1/completions`` (vLLM's field): each choice carries the log-prob of every
  prompt token given the ones before it, in vLLM's shape (``None`` for the first token, then ``{token id:
  {"logprob": ..}}``), from one forward pass of the served model (``log_softmax`` of its logits, T = 1).
"""

from __future__ import annotations

RECORD_HEADER = "X-Agentmem-Record"
NO = ("0", "false", "no")


def prompt_logprobs(model, prompt: list[int]) -> list[float | None]:
    """Per prompt token, its log-prob under ``model`` given the tokens before it (NaN for the first)."""
    import torch

    with torch.inference_mode():
        ids = torch.tensor([prompt], device=model.device)
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        picked = logp.gather(1, ids[0, 1:, None])[:, 0].tolist()
    return [float("nan"), *picked]


def vllm_prompt_logprobs(prompt: list[int], logprobs: list[float | None]) -> list[dict | None]:
    """``prompt_logprobs`` as vLLM answers them: None for the first token, then ``{str(id): {"logprob": ..}}``."""
    return [None] + [{str(t): {"logprob": lp, "rank": None, "decoded_token": None}}
                     for t, lp in zip(prompt[1:], logprobs[1:], strict=True)]

"""OpenAI response bodies and SSE chunks from sampled choices: pure formatting, no I/O.

A chat response carries ``message.content`` and, when asked, ``logprobs.content`` (one entry per sampled
token: its text, the stored log-prob, its UTF-8 bytes, and the ``top_logprobs`` alternatives); a completions
response carries ``text`` and the legacy ``logprobs`` object (``tokens``, ``token_logprobs``,
``top_logprobs``, ``text_offset``). ``id`` is the invocation id of the first choice. A stream sends, per
choice, the role (chat), then one chunk per sampled token whose text deltas concatenate to the choice's
text (``text_deltas``), then, once the call is stored, one chunk per choice with its finish reason.

With a ``ToolCallParser`` (a chat request with ``tools``), a reply that calls tools has ``message.tool_calls``,
``content`` only the text outside the calls (or null) and ``finish_reason: "tool_calls"``; streamed, it
sends the role, its content (if any) in one delta, then per call one ``delta.tool_calls`` chunk with the
call's ``index``, ``id``, ``type`` and name (arguments ``""``) and one with its arguments, as OpenAI streams
them; the token log-probs ride on the first chunk after the role. Streamed as sampled (``LiveText``), each
token's chunk carries its log-prob, the content before a call goes out as it is sampled, and the calls follow
once the reply is whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from agentmem.records import FinishReason
from agentmem.serve.behind_gateway import vllm_prompt_logprobs
from agentmem.serve.sampler import Choice, Tokens
from agentmem.serve.tool_calls import Reply, ToolCallParser


def text_deltas(tokenizer, c: Choice) -> list[str]:
    """One text delta per output token, whose concatenation is the choice's text: a token that decodes
    only together with later ones (part of a UTF-8 character) gives an empty delta until it completes."""
    out, sent = [], ""
    for k in range(1, len(c.output_ids) + 1):
        cur = tokenizer.decode(c.output_ids[:k], skip_special_tokens=True)[: len(c.text)]
        if c.text.startswith(cur) and len(cur) > len(sent):
            out.append(cur[len(sent):])
            sent = cur
        else:
            out.append("")
    if sent != c.text and out:
        out[-1] += c.text[len(sent):]
    return out


def usage(prompts: list[list[int]], choices: list[Choice]) -> dict[str, int]:
    prompt = sum(len(p) for p in prompts)
    completion = sum(len(c.output_ids) for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class LiveText:
    """One completion streamed as the sampler samples it: its tokens so far, and the text sent so far. Text is
    sent once it decodes to complete characters (a token ending inside a UTF-8 character is held back), and
    never past what the final reply may show: with ``stops``, the text from the first stop string on is never
    sent, and the end of the text that may begin one is held back until the next tokens say; with a tool-call
    ``opener`` (``<tool_call>``), likewise from the opener on, and trailing whitespace is held back (the reply's
    content before a call is sent without it). The text held back goes out once the choice is whole."""

    def __init__(self, tokenizer, prompt: list[int], stops: tuple[str, ...] = (), opener: str | None = None):
        self.tokenizer, self.prompt = tokenizer, prompt
        self.stops, self.opener = stops, opener
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.top: list[list[tuple[int, float]]] = []
        self.sent = ""
        self.closed = False  # a stop string or a tool call began: no more text goes out live

    def _safe(self, text: str) -> str:
        """The part of ``text`` that may be sent now."""
        marks = [*self.stops, *([self.opener] if self.opener else [])]
        found = [text.find(m) for m in marks if m in text]
        if found:
            self.closed = True
            safe = text[: min(found)]
        else:
            hold = max((k for m in marks for k in range(1, len(m)) if text.endswith(m[:k])), default=0)
            safe = text[: len(text) - hold]
        return safe.rstrip() if self.opener else safe

    def add(self, tokens: Tokens) -> tuple[Choice, int, int, str]:
        """(the completion so far, the new tokens' span, the new text) after ``tokens``."""
        start = len(self.ids)
        self.ids += tokens.ids
        self.logprobs += tokens.logprobs
        self.top += tokens.top or []
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        delta = ""
        if not self.closed and not text.endswith("\ufffd"):
            safe = self._safe(text)
            if safe.startswith(self.sent) and len(safe) > len(self.sent):
                delta, self.sent = safe[len(self.sent):], safe
        so_far = Choice(self.prompt, list(self.ids), list(self.logprobs), FinishReason.length, self.sent, 0.0,
                        list(self.top) or None)
        return so_far, start, len(self.ids), delta

    def rest(self, final_text: str) -> str:
        """What of the completion's final text is still unsent."""
        return final_text[len(self.sent):] if final_text.startswith(self.sent) else ""


@dataclass(frozen=True)
class Formatter:
    """Shapes one request's choices: ``chat`` or completions, with ``logprobs`` or not."""

    tokenizer: Any
    model_name: str
    fingerprint: str | None
    chat: bool
    logprobs: bool
    tool_calls: ToolCallParser | None = None
    token_ids: bool = False  # a stream's chunks carry their token ids (vLLM's return_token_ids)
    prompt_logprobs: bool = False  # each choice carries its prompt's log-probs (vLLM's prompt_logprobs)

    def response(self, call_id: str, created: int, prompts: list[list[int]], choices: list[Choice],
                 token_ids: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": call_id, "object": "chat.completion" if self.chat else "text_completion", "created": created,
            "model": self.model_name, "system_fingerprint": self.fingerprint,
            "choices": [self._choice(i, c, token_ids, self._reply(call_id, i, c)) for i, c in enumerate(choices)],
            "usage": usage(prompts, choices),
        }
        if token_ids:
            out["prompt_token_ids"] = prompts[0] if len(prompts) == 1 else prompts
        return out

    def token_chunks(self, call_id: str, created: int, choices: list[Choice],
                     live: dict[int, LiveText] | None = None) -> Iterator[str]:
        """The chunks of whole choices; those already streamed as they were sampled (``live``, by index)
        send only the text still held back."""
        for i, c in enumerate(choices):
            if live is not None and i in live:
                reply = self._reply(call_id, i, c)
                if reply is not None and reply.tool_calls:  # the content before the calls went out live
                    sent, content = live[i].sent, reply.content or ""
                    rest = content[len(sent):] if content.startswith(sent) else ""
                    if rest:
                        yield self.piece(call_id, created, i, c, 0, 0, rest)
                    yield from self._tool_call_chunks(call_id, created, i, c, replace(reply, content=None), False)
                    continue
                rest = live[i].rest(c.text)
                if rest:
                    yield self.piece(call_id, created, i, c, 0, 0, rest)
                continue
            yield from self.role_chunk(call_id, created, i)
            reply = self._reply(call_id, i, c)
            if reply is not None and reply.tool_calls:
                yield from self._tool_call_chunks(call_id, created, i, c, reply)
                continue
            for k, delta in enumerate(text_deltas(self.tokenizer, c)):
                yield self.piece(call_id, created, i, c, k, k + 1, delta)

    def role_chunk(self, call_id: str, created: int, i: int) -> Iterator[str]:
        if self.chat:
            yield self._chunk(call_id, created, [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                  "logprobs": None, "finish_reason": None}])

    def piece(self, call_id: str, created: int, i: int, c: Choice, start: int, stop: int, delta: str) -> str:
        """A chunk of choice ``i``: text ``delta`` and the log-probs of its tokens ``start:stop``."""
        piece: dict[str, Any] = {"index": i, "finish_reason": None, "logprobs": None}
        if self.chat:
            piece["delta"] = {"content": delta}
            if self.logprobs and stop > start:
                piece["logprobs"] = {"content": self._chat_logprobs(c, start, stop)}
        else:
            piece["text"] = delta
            if self.logprobs and stop > start:
                piece["logprobs"] = self._completion_logprobs(c, start, stop)
        if self.token_ids:
            piece["token_ids"] = c.output_ids[start:stop]
        return self._chunk(call_id, created, [piece])

    def final_chunks(self, call_id: str, created: int, choices: list[Choice],
                     usage_of: dict[str, int] | None) -> Iterator[str]:
        for i, c in enumerate(choices):
            reply = self._reply(call_id, i, c)
            reason = (reply.finish_reason if reply is not None else None) or c.finish_reason.value
            last: dict[str, Any] = {"index": i, "finish_reason": reason, "logprobs": None}
            last.update({"delta": {}} if self.chat else {"text": ""})
            if self.prompt_logprobs and c.prompt_logprobs is not None:
                last["prompt_logprobs"] = vllm_prompt_logprobs(c.prompt_ids, c.prompt_logprobs)
            yield self._chunk(call_id, created, [last])
        if usage_of is not None:
            yield self._chunk(call_id, created, [], usage=usage_of)
        yield "data: [DONE]\n\n"

    def _chunk(self, call_id: str, created: int, choices: list[dict[str, Any]], **extra: Any) -> str:
        data = {"id": call_id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": created, "model": self.model_name, "system_fingerprint": self.fingerprint,
                "choices": choices, **extra}
        return f"data: {json.dumps(data)}\n\n"

    def _reply(self, call_id: str, i: int, c: Choice) -> Reply | None:
        if self.tool_calls is None:
            return None
        return self.tool_calls.parse(c.text, f"{call_id}_{i}", c.finish_reason is FinishReason.length)

    def _tool_call_chunks(self, call_id: str, created: int, i: int, c: Choice, reply: Reply,
                          with_logprobs: bool = True) -> Iterator[str]:
        logprobs = {"content": self._chat_logprobs(c)} if self.logprobs and with_logprobs else None
        if reply.content is not None:
            yield self._chunk(call_id, created, [{"index": i, "delta": {"content": reply.content},
                                                  "logprobs": logprobs, "finish_reason": None}])
            logprobs = None
        for k, call in enumerate(reply.tool_calls):
            head = {"index": k, "id": call["id"], "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": ""}}
            yield self._chunk(call_id, created, [{"index": i, "delta": {"tool_calls": [head]},
                                                  "logprobs": logprobs, "finish_reason": None}])
            logprobs = None
            body = {"index": k, "function": {"arguments": call["function"]["arguments"]}}
            yield self._chunk(call_id, created, [{"index": i, "delta": {"tool_calls": [body]},
                                                  "logprobs": None, "finish_reason": None}])

    def _choice(self, i: int, c: Choice, token_ids: bool, reply: Reply | None) -> dict[str, Any]:
        out: dict[str, Any] = {"index": i, "finish_reason": c.finish_reason.value}
        if self.chat:
            out["message"] = {"role": "assistant", "content": c.text}
            if reply is not None and reply.tool_calls:
                out["message"] = {"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls}
                out["finish_reason"] = reply.finish_reason or c.finish_reason.value
            out["logprobs"] = {"content": self._chat_logprobs(c)} if self.logprobs else None
        else:
            out["text"] = c.text
            out["logprobs"] = self._completion_logprobs(c) if self.logprobs else None
        if token_ids:
            out["token_ids"] = c.output_ids
        if self.prompt_logprobs and c.prompt_logprobs is not None:
            out["prompt_logprobs"] = vllm_prompt_logprobs(c.prompt_ids, c.prompt_logprobs)
        return out

    def _token(self, tid: int) -> str:
        return self.tokenizer.decode([tid])

    def _entry(self, tid: int, lp: float, top: list[tuple[int, float]] | None) -> dict[str, Any]:
        text = self._token(tid)
        alternatives = [{"token": self._token(t), "logprob": v, "bytes": list(self._token(t).encode())}
                        for t, v in (top or [])]
        return {"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": alternatives}

    def _chat_logprobs(self, c: Choice, start: int = 0, stop: int | None = None) -> list[dict[str, Any]]:
        lps = c.logprobs or [0.0] * len(c.output_ids)
        stop = len(c.output_ids) if stop is None else stop
        return [self._entry(c.output_ids[k], lps[k], c.top[k] if c.top else None) for k in range(start, stop)]

    def _completion_logprobs(self, c: Choice, start: int = 0, stop: int | None = None) -> dict[str, Any]:
        lps = c.logprobs or [0.0] * len(c.output_ids)
        tokens = [self._token(t) for t in c.output_ids]
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t)
        top = [{self._token(t): v for t, v in row} for row in c.top] if c.top else None
        part = slice(start, len(tokens) if stop is None else stop)
        return {"tokens": tokens[part], "token_logprobs": lps[part], "top_logprobs": top[part] if top else None,
                "text_offset": offsets[part]}

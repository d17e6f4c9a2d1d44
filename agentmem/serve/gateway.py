"""Gateway mode (``agentmem serve --upstream URL [--upstream URL ...]``): generation by running OpenAI servers.

Token upstreams (vLLM, or another ``agentmem serve``): the gateway renders each chat with the served model's
own tokenizer and chat template (``--model`` names it; no weights load), sends the token ids to the
upstream's ``/v1/completions`` with ``"return_token_ids": true``, ``logprobs: 0`` and ``prompt_logprobs: 0``,
and records what comes back: the ids the upstream consumed (checked equal to the ids sent), the ids it
sampled and their log-probs, and the prompt tokens' log-probs (``serve_calls.prompt_logprobs``; an upstream
that refuses ``prompt_logprobs`` is asked without them from then on). The shaping options (``logit_bias``,
penalties, ``top_k``, ``min_p``) go upstream under vLLM's names. Every upstream call carries
``X-Agentmem-Record: no`` (``behind_gateway.RECORD_HEADER``): an agentmem upstream answers without storing, so a
call is recorded once, here. Start vLLM with ``--logprobs-mode processed_logprobs`` so its log-probs are the
temperature-scaled ones every agentmem backend stores (``backends.types``).

- Streams: a streaming request goes upstream with ``stream: true``, and each chunk's ``token_ids`` and
  log-probs reach the client as they arrive (``stream`` yields ``Tokens``, then the choices).
- Several upstreams: the calls of one episode go to one upstream, the one ranked first for the episode by
  rendezvous hashing (``sha256(episode, url)``) among the upstreams that are up, so an upstream going down
  moves only its own episodes; a call without an episode goes to the next one up in turn. The choices of an
  ``n > 1`` call become episodes ``E.0``, ``E.1``, ... (``recorder.Recorder.plan``), and their later calls go
  where ``E`` went (``affinity``: a name's trailing ``.digits`` are not hashed), so the upstream's prefix cache
  holds their shared history. A call whose
  upstream refuses the connection goes to the next one.
- Health: ``connect`` probes each upstream's ``/models`` and, while none answers, probes again with backoff
  (0.5 s, doubling to 8 s) up to ``wait_s``; then a thread re-probes the upstreams that are down, each with
  its own backoff, and those up every 5 s. ``health()`` reports each one (``/health``).
- Text upstreams (``text=True``: a hosted API that returns no token ids): a chat goes to the upstream's
  ``/chat/completions`` (a text prompt to ``/completions``) under the served model name, with its tools and
  ``tool_choice``; the reply's text (a reply with tool calls: its assistant turn as the served model's chat
  template writes it, ``_reply_text``, parsed back into ``tool_calls`` for the client) is tokenized with the
  local tokenizer and stored without log-probs, marked not replayable (``serve_calls.replayable``): SFT trains
  on such calls, ``distill`` refuses them.

``UpstreamSampler`` has the ``submit(job) -> Future[list[Choice]]`` and ``stream(job)`` interface of
``sampler.Sampler``.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from agentmem.backends.server_pool import rank
from agentmem.errors import ConfigError
from agentmem.records import FinishReason
from agentmem.serve.behind_gateway import RECORD_HEADER
from agentmem.serve.protocol import ApiError, ChatMessage
from agentmem.serve.sampler import Choice, Job, Tokens, cut_at_stop, whole

BACKOFF_S = (0.5, 8.0)  # first and longest wait between probes of an upstream that is down
RECHECK_S = 5.0  # between probes of an upstream that is up
TEXT_OPTIONS = ("presence_penalty", "frequency_penalty")  # the shaping options a text upstream takes as is


class _Unreachable(Exception):
    """The upstream refused the connection: nothing was generated, the call may go to another."""


class _NoPromptLogprobs(Exception):
    """The upstream refused ``prompt_logprobs``: ask it again without."""


@dataclass
class Upstream:
    url: str
    model: str | None = None
    max_len: int | None = None
    up: bool = False
    error: str | None = "not probed yet"
    prompt_logprobs: bool = True
    calls: int = 0
    wait_s: float = BACKOFF_S[0]
    next_probe: float = field(default=0.0)

    def status(self) -> dict[str, Any]:
        return {"url": self.url, "status": "up" if self.up else "down", "model": self.model, "calls": self.calls,
                "error": self.error}


def _upstream_error(url: str, status: int, text: str) -> ApiError:
    try:
        detail = json.loads(text).get("error", {}).get("message") or text
    except (json.JSONDecodeError, AttributeError):
        detail = text
    return ApiError(status if 400 <= status < 500 else 502, f"upstream {url}: HTTP {status}: {str(detail)[:500]}",
                    type="upstream_error")


def affinity(episode: str) -> str:
    """What an episode is routed by: its name less a trailing ``.digits`` (choice ``i`` of a group call ``E`` is
    episode ``E.i``, and goes where ``E`` went)."""
    return re.sub(r"\.\d+$", "", episode)


class UpstreamSampler:
    def __init__(self, urls: str | Sequence[str], tokenizer, *, api_key: str | None = None, model: str | None = None,
                 text: bool = False, workers: int = 64, timeout_s: float = 600.0):
        urls = [urls] if isinstance(urls, str) else list(urls)
        self.upstreams = [Upstream(u.rstrip("/")) for u in urls]
        self.tokenizer, self.model, self.text, self.timeout_s = tokenizer, model, text, timeout_s
        self.headers = {RECORD_HEADER: "no", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        self._client = httpx.Client(timeout=timeout_s, headers=self.headers)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agentmem-upstream")
        self._lock = threading.Lock()
        self._turn = itertools.count()
        self._closed = threading.Event()
        self._prober: threading.Thread | None = None
        self.batches = 0

    # health

    def connect(self, wait_s: float = 60.0) -> None:
        """Probe every upstream; while none is up, probe again with backoff for up to ``wait_s`` (then
        ``ConfigError`` naming each one's error). Then a thread probes each upstream again when due: one that
        is down after its backoff, one that is up every ``RECHECK_S``."""
        deadline = time.monotonic() + wait_s
        for u in self.upstreams:
            self._probe(u)
        while not any(u.up for u in self.upstreams):
            pause = max(min(u.next_probe for u in self.upstreams) - time.monotonic(), 0.0)
            if time.monotonic() + pause > deadline:
                raise ConfigError(f"no upstream answered within {wait_s:g} s: "
                                  + "; ".join(f"{u.url}: {u.error}" for u in self.upstreams))
            time.sleep(pause)
            for u in self.upstreams:
                if time.monotonic() >= u.next_probe:
                    self._probe(u)
        self._prober = threading.Thread(target=self._probe_due, name="agentmem-upstream-probe", daemon=True)
        self._prober.start()

    def health(self) -> list[dict[str, Any]]:
        with self._lock:
            return [u.status() for u in self.upstreams]

    def context_length(self) -> int | None:
        """The shortest context length the upstreams that are up report, if any does."""
        known = [u.max_len for u in self.upstreams if u.up and u.max_len]
        return min(known) if known else None

    def _probe(self, u: Upstream) -> None:
        try:
            r = self._client.get(f"{u.url}/models", timeout=10)
            if r.status_code >= 400:
                raise ValueError(f"HTTP {r.status_code}")
            data = r.json()["data"]
            if not data:
                raise ValueError("it serves no model")
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            self._down(u, f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            u.model, u.max_len = data[0]["id"], data[0].get("max_model_len")
            u.up, u.error, u.wait_s = True, None, BACKOFF_S[0]
            u.next_probe = time.monotonic() + RECHECK_S

    def _down(self, u: Upstream, error: str) -> None:
        with self._lock:
            u.up, u.error = False, error
            u.next_probe = time.monotonic() + u.wait_s
            u.wait_s = min(u.wait_s * 2, BACKOFF_S[1])

    def _probe_due(self) -> None:
        while not self._closed.wait(0.2):
            for u in self.upstreams:
                if time.monotonic() >= u.next_probe and not self._closed.is_set():
                    self._probe(u)

    def _pick(self, key: str | None, tried: set[str]) -> Upstream:
        with self._lock:
            live = [u for u in self.upstreams if u.up and u.url not in tried]
            if not live:
                raise ApiError(503, "no upstream is up: " + "; ".join(f"{u.url}: {u.error}" for u in self.upstreams),
                               type="upstream_error")
            if key is None:
                return live[next(self._turn) % len(live)]
            return live[rank(affinity(key), [u.url for u in live])[0]]

    # generation

    def submit(self, job: Job) -> Future:
        return self._pool.submit(self._generate, job)

    async def stream(self, job: Job) -> AsyncIterator[Tokens | list[Choice]]:
        if self.text:
            async for choices in whole(self.submit(job)):
                yield choices
            return
        tried: set[str] = set()
        while True:
            u = self._pick(job.route, tried)
            try:
                async for event in self._stream(u, job):
                    yield event
                return
            except _Unreachable as exc:
                tried.add(u.url)
                self._down(u, str(exc))
            except _NoPromptLogprobs:
                u.prompt_logprobs = False

    def close(self) -> None:
        self._closed.set()
        if self._prober is not None:
            self._prober.join(timeout=30)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    def _generate(self, job: Job) -> list[Choice]:
        tried: set[str] = set()
        while True:
            u = self._pick(job.route, tried)
            try:
                return self._text(u, job) if self.text else self._tokens(u, job)
            except _Unreachable as exc:
                tried.add(u.url)
                self._down(u, str(exc))
            except _NoPromptLogprobs:
                u.prompt_logprobs = False

    def _post(self, u: Upstream, path: str, body: dict) -> dict:
        try:
            r = self._client.post(f"{u.url}{path}", json=body)
        except httpx.ConnectError as exc:
            raise _Unreachable(f"cannot reach upstream {u.url}: {exc}") from None
        except httpx.HTTPError as exc:
            raise ApiError(502, f"upstream {u.url}: {type(exc).__name__}: {exc}", type="upstream_error") from None
        self._check(u, body, r.status_code, r.text)
        u.calls += 1
        return r.json()

    @staticmethod
    def _check(u: Upstream, body: dict, status: int, text: str) -> None:
        if status < 400:
            return
        if status == 400 and "prompt_logprobs" in body and "prompt_logprobs" in text:
            raise _NoPromptLogprobs
        raise _upstream_error(u.url, status, text)

    def _body(self, u: Upstream, job: Job, *, stream: bool = False) -> dict:
        p = job.params
        body: dict[str, Any] = {"model": u.model, "prompt": job.prompts, "n": job.n, "max_tokens": p.max_new_tokens,
                                "temperature": p.temperature, "top_p": p.top_p, "logprobs": 0,
                                "return_token_ids": True}
        if u.prompt_logprobs:
            body["prompt_logprobs"] = 0
        if stream:
            body["stream"] = True
        if p.seed is not None:
            body["seed"] = p.seed
        if job.stops:
            body["stop"] = list(job.stops)
        body.update({k: {str(t): b for t, b in v.items()} if k == "logit_bias" else v for k, v in p.shaping.items()})
        return body

    def _tokens(self, u: Upstream, job: Job) -> list[Choice]:
        start = time.perf_counter()
        answer = self._post(u, "/completions", self._body(u, job))
        return self._answer(answer, job, time.perf_counter() - start)

    def _answer(self, answer: dict, job: Job, latency: float) -> list[Choice]:
        self.batches += 1
        choices = sorted(answer.get("choices", []), key=lambda c: c["index"])
        rows = job.rows
        if len(choices) != len(rows):
            raise ApiError(502, f"upstream answered {len(choices)} choices for {len(rows)}", type="upstream_error")
        top = answer.get("prompt_token_ids") if len(job.prompts) == 1 else None  # agentmem's: once per response
        return [self._finish(row, c.get("token_ids"), (c.get("logprobs") or {}).get("token_logprobs"),
                             c.get("finish_reason"), c.get("prompt_token_ids", top), c.get("prompt_logprobs"), job,
                             latency) for row, c in zip(rows, choices, strict=True)]

    async def _stream(self, u: Upstream, job: Job) -> AsyncIterator[Tokens | list[Choice]]:
        rows, start = job.rows, time.perf_counter()
        ids: list[list[int]] = [[] for _ in rows]
        lps: list[list[float]] = [[] for _ in rows]
        reasons: list[str | None] = [None] * len(rows)
        consumed: list[Any] = [None] * len(rows)
        prompt_lps: list[Any] = [None] * len(rows)
        body = self._body(u, job, stream=True)
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers) as client:
            try:
                async with client.stream("POST", f"{u.url}/completions", json=body) as r:
                    if r.status_code >= 400:
                        self._check(u, body, r.status_code, (await r.aread()).decode(errors="replace"))
                    u.calls += 1
                    if not r.headers.get("content-type", "").startswith("text/event-stream"):  # answered whole
                        yield self._answer(json.loads(await r.aread()), job, time.perf_counter() - start)
                        return
                    async for line in r.aiter_lines():
                        if not line.startswith("data:") or (data := line[5:].strip()) == "[DONE]":
                            continue
                        chunk = json.loads(data)
                        if "error" in chunk:
                            raise ApiError(502, f"upstream {u.url}: {chunk['error'].get('message')}",
                                           type="upstream_error")
                        for c in chunk.get("choices") or []:
                            i = int(c["index"])
                            new = c.get("token_ids")
                            lp = (c.get("logprobs") or {}).get("token_logprobs") or []
                            if new is None and c.get("text"):
                                raise ApiError(502, _NO_IDS, type="upstream_error")
                            consumed[i] = c.get("prompt_token_ids") or consumed[i]
                            prompt_lps[i] = c.get("prompt_logprobs") or prompt_lps[i]
                            reasons[i] = c.get("finish_reason") or reasons[i]
                            if new:
                                if len(lp) != len(new):
                                    raise ApiError(502, _NO_IDS, type="upstream_error")
                                ids[i] += [int(t) for t in new]
                                lps[i] += [float(x) for x in lp]
                                yield Tokens(i, [int(t) for t in new], [float(x) for x in lp])
            except httpx.ConnectError as exc:
                raise _Unreachable(f"cannot reach upstream {u.url}: {exc}") from None
            except httpx.HTTPError as exc:
                raise ApiError(502, f"upstream {u.url}: {type(exc).__name__}: {exc}", type="upstream_error") from None
        self.batches += 1
        latency = time.perf_counter() - start
        yield [self._finish(row, ids[i], lps[i], reasons[i], consumed[i], prompt_lps[i], job, latency)
               for i, row in enumerate(rows)]

    def _finish(self, prompt: list[int], ids: list | None, lps: list | None, reason: str | None, consumed: list | None,
                prompt_lps: list | None, job: Job, latency: float) -> Choice:
        if ids is None or lps is None:
            raise ApiError(502, _NO_IDS, type="upstream_error")
        if consumed is not None and list(consumed) != list(prompt):
            raise ApiError(502, "the upstream consumed other prompt ids than were sent", type="upstream_error")
        ids, lps = [int(x) for x in ids], [float(x) for x in lps]
        finish = FinishReason.length if reason == "length" else FinishReason.stop
        cut = cut_at_stop(self.tokenizer, ids, job.stops)
        if cut is not None:
            keep, text = cut
            ids, lps, finish = ids[:keep], lps[:keep], FinishReason.stop
        else:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Choice(list(prompt), ids, lps, finish, text, latency,
                      prompt_logprobs=_prompt_logprobs(prompt, prompt_lps))

    def _text(self, u: Upstream, job: Job) -> list[Choice]:
        """A text upstream's call: the chat (or the decoded prompts) under the served name; the replies'
        text tokenized here, stored without log-probs and not replayable."""
        p = job.params
        refused = [k for k in p.shaping if k not in TEXT_OPTIONS]
        if refused:
            raise ApiError(400, f"{refused[0]} is not supported with a text upstream (--upstream-text): its "
                                "tokens are not this tokenizer's", param=refused[0], code="unsupported_parameter")
        body: dict[str, Any] = {"model": self.model or u.model, "n": job.n, "max_tokens": p.max_new_tokens,
                                "temperature": p.temperature, "top_p": p.top_p,
                                **{k: v for k, v in p.shaping.items() if k in TEXT_OPTIONS}}
        if p.seed is not None:
            body["seed"] = p.seed
        if job.stops:
            body["stop"] = list(job.stops)
        chat = job.messages is not None
        if chat:
            body["messages"] = [_as_sent(m) for m in job.messages or []]
            if job.tools:
                body["tools"] = job.tools
            if job.tool_choice is not None:
                body["tool_choice"] = job.tool_choice
        else:
            body["prompt"] = [self.tokenizer.decode(row, skip_special_tokens=True) for row in job.prompts]
        start = time.perf_counter()
        answer = self._post(u, "/chat/completions" if chat else "/completions", body)
        latency = time.perf_counter() - start
        self.batches += 1
        choices = sorted(answer.get("choices", []), key=lambda c: c["index"])
        if len(choices) != len(job.rows):
            raise ApiError(502, f"upstream answered {len(choices)} choices for {len(job.rows)}", type="upstream_error")
        out = []
        for row, c in zip(job.rows, choices, strict=True):
            message = c.get("message") or {}
            text = (message.get("content") if chat else c.get("text")) or ""
            if chat and message.get("tool_calls"):
                text = _reply_text(self.tokenizer, job, message)
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            finish = FinishReason.length if c.get("finish_reason") == "length" else FinishReason.stop
            out.append(Choice(list(row), ids, None, finish, text, latency, replayable=False))
        return out


def _reply_text(tokenizer, job: Job, message: dict) -> str:
    """A provider's reply with tool calls as the served model's chat template writes that assistant turn (what
    this model would have sampled to make those calls): the chat rendered with the reply, less the chat rendered
    for generation, up to the end-of-turn token. The reply's calls are parsed back from it for the client."""
    turn = ChatMessage(role="assistant", content=message.get("content"), tool_calls=message["tool_calls"]).as_template()
    messages = job.messages or []
    asked = tokenizer.apply_chat_template(messages, tools=job.tools, add_generation_prompt=True, tokenize=False)
    whole = tokenizer.apply_chat_template([*messages, turn], tools=job.tools, tokenize=False)
    if not whole.startswith(asked) or turn["tool_calls"][0]["function"]["name"] not in whole[len(asked):]:
        raise ApiError(502, "the upstream's tool calls cannot be written in the served model's chat template "
                            "(--chat-template FILE gives one that can)", type="upstream_error")
    reply = whole[len(asked):]
    end = tokenizer.eos_token
    return reply[: reply.index(end)] if end and end in reply else reply


def _as_sent(message: dict) -> dict:
    """A message as an OpenAI API takes it: tool-call arguments as a JSON string (the template read objects)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    return {**message, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.dumps(a)}}
                                      if not isinstance(a := c.get("function", {}).get("arguments"), str) else c
                                      for c in calls]}


_NO_IDS = ("the upstream returned no token ids or log-probs: it must be a vLLM (>= 0.10) OpenAI server or an "
           "agentmem serve, which honour return_token_ids and logprobs; for a provider that returns text only, "
           "use --upstream-text")


def _prompt_logprobs(prompt: list[int], entries: list | None) -> list[float | None] | None:
    """vLLM's ``prompt_logprobs`` (None for the first token, then ``{token id: {"logprob": ..}}`` per position,
    the prompt's own token among them) as one log-prob per prompt token, NaN where there is none."""
    if entries is None or len(entries) != len(prompt):
        return None
    out: list[float | None] = []
    for tid, entry in zip(prompt, entries, strict=True):
        found = (entry or {}).get(str(tid))
        out.append(float(found["logprob"]) if isinstance(found, dict) else float("nan"))
    return out

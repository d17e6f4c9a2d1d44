"""Property-based requests to ``agentmem serve``, built from its OpenAPI document, and the properties every answer
must have: shared by ``tests/fuzz/test_serve_fuzz.py`` (a fixed-seed, bounded run) and ``python -m bench.fuzz``.

Requests (``requests(document, model)``, a Hypothesis strategy): a route of the document (every one, the episode
prefix and unknown routes too), its path parameters, the ``X-Agentmem-*`` headers and a body drawn from the route's
request schema (``from_schema``: the JSON schema read as a strategy, with realistic values for the fields a
random value would only ever get refused on: the model, small output limits, tools and their schemas, episode
names from a small pool so rewards and traces meet stored episodes). Then, half the time, one value is replaced
by an edge (``EDGES``: non-finite numbers, 64-bit overflows, long strings, NUL, lone surrogates, wrong types,
deep nesting), and a few bodies are raw bytes (not JSON, not an object, over the size limit).

Properties (``Checker``), each request sent alone (``/health`` polled beside it):

- no answer is a 5xx, and a stream carries no server error;
- a 400 or 413 names the field (``error.param``), every 4xx has the OpenAI error body;
- an answered generation call is stored exactly once (the invocations its ``X-Agentmem-Invocation`` header names,
  and no other row), a refused one not at all;
- every stored row is complete (``half_written``): each invocation has its ``serve_calls`` row, as many
  log-probs as output ids, its token counts, an episode whose steps run 0, 1, ... without a gap; stored rewards
  finite and F1-like scores in [0, 1];
- ``/health`` answers 200 within a second while the requests are processed.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from hypothesis import strategies as st

from store.engine import Store
from store.orm import EpisodeRow, InvocationRow, ServeCallRow

EPISODES = ("e0", "e1", "e2", "g", "ep.0", "x" * 255)
WORDS = ("Oslo", "weather", "Where does Bob live?", "hi", "<tool_call>", "</tool_call>", "{}", "é", "🙂", " ",
         "a\nb", "{{ x }}")
DEEP: Any = 0
for _ in range(70):
    DEEP = [DEEP]
EDGES: tuple[Any, ...] = (
    None, True, False, 0, -1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30, 1e308, -1e308, 5e-324,
    float("nan"), float("inf"), float("-inf"), "", " ", "x" * 300, "a\x00b", "\ud800", "é" * 256, "🙂" * 70, [], {},
    [1, "a", None], {"": None}, {"type": "strng"}, "nope", DEEP, "<|im_end|>", "\n" * 8)
SCHEMAS = ({"type": "object"}, {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
           {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}},
           {"type": "object", "properties": {"city": {"enum": ["Oslo", "Lyon"]}}, "required": ["city"],
            "additionalProperties": False})
ALWAYS = {"input"}  # optional, but a request without it is refused unless it continues a stored response
COMMON = {"model", "messages", "prompt", "input", "instructions", "max_tokens", "max_completion_tokens",
          "max_output_tokens", "n", "temperature", "stop", "seed", "stream", "metadata", "tools", "tool_choice",
          "logprobs", "top_logprobs", "response_format", "previous_response_id", "return_token_ids"}


@dataclass(frozen=True)
class Pooled:
    """A value taken at send time from what the server answered before (an invocation id), so that parents and
    previous responses meet stored calls; ``k`` picks one."""

    k: int


@dataclass
class Request:
    method: str
    path: str
    route: str  # the document's path (a label)
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None  # JSON (may hold non-finite numbers and Pooled), or raw bytes
    raw: bool = False


def _text(max_size: int = 24) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(WORDS), st.text(max_size=max_size))


JSON_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(-10, 10), _text()),
                           lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                  st.dictionaries(_text(8), kids, max_size=3)), max_leaves=6)


def hints(model: str, vocab: int) -> dict[str, st.SearchStrategy[Any]]:
    """Realistic values for fields whose random values would only be refused (keyed by property name)."""
    small = st.integers(1, 6)
    return {
        "model": st.sampled_from([model] * 12 + ["other-model"]),
        "max_tokens": small, "max_completion_tokens": small, "max_output_tokens": small,
        "n": st.sampled_from([1, 1, 1, 2, 3]), "top_logprobs": st.integers(0, 3), "logprobs": st.one_of(st.booleans(), st.integers(0, 3)),
        "seed": st.one_of(st.integers(0, 99), st.sampled_from([2**63 - 1, -(2**63)])),
        "name": st.sampled_from(["weather", "clock"] * 3 + ["bad name", ""]),
        "parameters": st.sampled_from(SCHEMAS), "schema": st.sampled_from(SCHEMAS),
        "episode": st.sampled_from(EPISODES), "task": st.sampled_from(["t0", "t1", "y" * 255]),
        "kind": st.sampled_from(["chat", "answer", "memory_update", "k" * 32]),
        "previous_response_id": st.builds(Pooled, st.integers(0, 1000)),
        "call_id": st.builds(Pooled, st.integers(0, 1000)),
        "prompt": st.one_of(_text(), st.lists(st.integers(0, vocab - 1), min_size=1, max_size=8),
                            st.lists(_text(), min_size=1, max_size=2)),
        "logit_bias": st.dictionaries(st.integers(0, vocab - 1).map(str), st.floats(-100, 100), max_size=2),
        "stop": st.one_of(st.none(), _text(4), st.lists(st.text(min_size=1, max_size=3), max_size=2)),
        "reward": st.floats(-2, 2), "text": st.one_of(_text(), st.fixed_dictionaries({}, optional={
            "format": st.sampled_from([{"type": "text"}, {"type": "json_object"}])})),
    }


class Schemas:
    """JSON schemas (OpenAPI 3.1: JSON Schema 2020-12) read as Hypothesis strategies."""

    def __init__(self, components: dict[str, Any], named: dict[str, st.SearchStrategy[Any]]):
        self.components, self.named = components, named

    def strategy(self, schema: dict[str, Any], name: str | None = None, depth: int = 0) -> st.SearchStrategy[Any]:
        if name in self.named:
            return self.named[name]
        if depth > 8:
            return st.none()
        if "$ref" in schema:
            return st.deferred(lambda: self.strategy(self.components[schema["$ref"].rsplit("/", 1)[1]], name,
                                                     depth + 1))
        if "const" in schema:
            return st.just(schema["const"])
        if "enum" in schema:
            return st.sampled_from(schema["enum"])
        if "anyOf" in schema or "oneOf" in schema:
            branches = schema.get("anyOf", schema.get("oneOf"))
            values = [self.strategy(s, name, depth + 1) for s in branches if s.get("type") != "null"]
            nulls = [st.none()] if len(values) < len(branches) else []
            return st.one_of(values * 3 + nulls)  # a value more often than null
        kind = schema.get("type")
        if kind == "null":
            return st.none()
        if kind == "boolean":
            return st.booleans()
        if kind == "integer":
            low, high = schema.get("minimum", -3), schema.get("maximum")
            return st.one_of(st.integers(low, low + 8 if high is None else min(high, low + 8)),
                             st.integers(low, high))
        if kind == "number":
            return st.floats(schema.get("minimum", schema.get("exclusiveMinimum", -5)), schema.get("maximum", 5),
                             exclude_min="exclusiveMinimum" in schema, allow_nan=False)
        if kind == "string":
            if "pattern" in schema:
                return st.from_regex(schema["pattern"], fullmatch=True).filter(lambda s: len(s) <= 70)
            return _text(min(schema.get("maxLength", 24), 24))
        if kind == "array":
            return st.lists(self.strategy(schema.get("items", {}), None, depth + 1),
                            min_size=schema.get("minItems", 0), max_size=max(schema.get("minItems", 0), 3))
        if kind == "object" and "properties" in schema:
            props = schema["properties"]
            required = set(schema.get("required", ())) | (ALWAYS & set(props))
            # a request has many optional fields: the common ones each maybe, at most one of the others (each of
            # those alone is enough to meet its check; all at once would be refused by the first)
            common = {k for k in props if k not in required and (len(props) < 12 or k in COMMON)}
            rare = sorted(set(props) - required - common)
            base = st.fixed_dictionaries({k: self.strategy(props[k], k, depth + 1) for k in sorted(required)},
                                         optional={k: self.strategy(props[k], k, depth + 1) for k in sorted(common)})
            if not rare:
                return base
            one = st.one_of(st.just({}), st.just({}), st.sampled_from(rare).flatmap(
                lambda k: self.strategy(props[k], k, depth + 1).map(lambda v: {k: v})))
            return st.tuples(base, one).map(lambda pair: {**pair[0], **pair[1]})
        if kind == "object":
            return st.dictionaries(_text(8), JSON_VALUES, max_size=3)
        return JSON_VALUES


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    found = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, (*path, k))
    elif isinstance(value, list):
        for k, v in enumerate(value):
            found += _paths(v, (*path, k))
    return found


def _replaced(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replaced(value[head], rest, new)}
    out = list(value)
    out[head] = _replaced(out[head], rest, new)
    return out


@st.composite
def mutated(draw, body: st.SearchStrategy[Any]) -> Any:
    """A body, half the time with one value (or a new key) replaced by an edge value."""
    value = draw(body)
    if not isinstance(value, dict) or draw(st.integers(0, 1)) == 0:
        return value
    edge = draw(st.sampled_from(EDGES))
    if draw(st.integers(0, 5)) == 0:  # a key the server does not know
        return {**value, draw(st.sampled_from(["extra", "functions", "audio", "store"])): edge}
    path = draw(st.sampled_from(_paths(value)[1:] or [()]))
    return _replaced(value, path, edge) if path else value


RAW = (b"", b"{", b"[]", b"null", b"7", b'"x"', b'{"model": ', b"\xff\xfe", b'{"a": NaN}', b"[" * 5000 + b"]" * 5000,
       b'{"model": "m", "messages": [' + b'{"role": "user", "content": "x"},' * 40000 + b"{}]}")


WEIGHTS = {"POST /v1/chat/completions": 8, "POST /episodes/{episode}/v1/chat/completions": 6,
           "POST /v1/completions": 4, "POST /episodes/{episode}/v1/completions": 3, "POST /v1/responses": 4,
           "POST /episodes/{episode}/v1/responses": 3, "POST /agentmem/episodes/{episode}/reward": 5,
           "POST /agentmem/episodes/{episode}/privileged": 2, "POST raw": 2}
"""How often each route is drawn, against 1 for the others: the routes that generate and store most."""


def routes(document: dict[str, Any], model: str, vocab: int) -> dict[str, st.SearchStrategy[Request]]:
    """Per route of ``document`` (serve's ``/openapi.json``), as ``METHOD path``, its requests; and ``unknown``
    routes and methods, and ``raw`` bodies (bytes that are no JSON object, or over the size limit)."""
    components = document["components"]["schemas"]
    named = hints(model, vocab)
    schemas = Schemas(components, named)
    # the Responses input: text, or items that begin with a user message (a system message alone is refused)
    item = schemas.strategy({"$ref": "#/components/schemas/InputItem"})
    named["input"] = st.one_of(_text(), st.lists(item, max_size=2).map(lambda rest: [
        {"role": "user", "content": "Weather in Oslo?"}, *rest]))
    header = {"X-Agentmem-Episode": st.sampled_from(EPISODES), "X-Agentmem-Task": st.sampled_from(["t0", "t" * 256]),
              "X-Agentmem-Kind": st.sampled_from(["answer", "k" * 33]), "X-Agentmem-Parent": st.builds(Pooled,
                                                                                                   st.integers(0, 99)),
              "X-Agentmem-Reopen": st.sampled_from(["true", "no"]), "X-Agentmem-Record": st.sampled_from(["no"])}
    path_values = {"episode": st.one_of(st.sampled_from(EPISODES), st.sampled_from(["a%00b", "z" * 256, "%F0%9F"])),
                   "run": st.one_of(st.sampled_from(["0" * 6, "r" * 65, "ab"]), st.builds(Pooled, st.just(-1)))}
    found: dict[str, st.SearchStrategy[Request]] = {}
    for route, methods in document["paths"].items():
        for method, op in methods.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            names = [p["name"] for p in op.get("parameters", []) if p["in"] == "path"]
            heads = [p["name"] for p in op.get("parameters", []) if p["in"] == "header"]
            strategy = st.builds(
                Request, st.just(method.upper()), st.just(route), st.just(route),
                st.fixed_dictionaries({}, optional={h: header[h] for h in heads if h in header}) if heads
                else st.just({}),
                mutated(schemas.strategy(body)) if body is not None else st.none())
            if names:
                strategy = st.tuples(strategy, st.fixed_dictionaries({n: path_values[n] for n in names})).map(
                    lambda pair: _with_path(*pair))
            found[f"{method.upper()} {route}"] = strategy
    found["ANY unknown"] = st.builds(Request, st.sampled_from(["POST", "PUT", "GET"]),
                                     st.sampled_from(["/v1/chat/completions", "/v1/nope", "/agentmem/episodes", "/"]),
                                     st.just("unknown"), st.just({}), st.none())
    found["POST raw"] = st.builds(Request, st.just("POST"), st.sampled_from(
        ["/v1/chat/completions", "/v1/responses", "/agentmem/episodes/e0/reward"]), st.just("raw"),
        st.just({"content-type": "application/json"}), st.sampled_from(RAW), st.just(True))
    return found


def requests(document: dict[str, Any], model: str, vocab: int) -> st.SearchStrategy[Request]:
    """Requests to every route of ``document``, drawn as ``WEIGHTS`` says."""
    return st.one_of([s for label, s in routes(document, model, vocab).items() for _ in range(WEIGHTS.get(label, 1))])


def _with_path(request: Request, values: dict[str, Any]) -> Request:
    path = request.path
    for name, value in values.items():
        path = path.replace("{" + name + "}", value if isinstance(value, str) else "{pooled}")
    return Request(request.method, path, request.route, request.headers, request.body, request.raw)


def _resolve(value: Any, pool: list[str]) -> Any:
    if isinstance(value, Pooled):
        return pool[value.k % len(pool)] if pool else "f" * 32
    if isinstance(value, dict):
        return {k: _resolve(v, pool) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, pool) for v in value]
    return value


@dataclass
class Outcome:
    status: int
    violations: list[str]


class Checker:
    """Sends requests to a running server one at a time and checks each answer (see the module); ``run_id``: the
    server's run (the gateway's when ``root`` is a gateway); ``counts`` by ``METHOD route`` and status class."""

    def __init__(self, client: httpx.Client, store: Store, run_id: str):
        self.client, self.store, self.run_id = client, store, run_id
        self.answered: list[str] = []  # invocation ids stored so far: parents and previous responses
        self.counts: Counter[tuple[str, str]] = Counter()
        self.server_errors = 0
        self.refused_without_field = 0
        self.miscounted = 0  # answered calls not stored exactly once, refused calls that stored something
        self.problems: list[str] = []  # the first ones found, with their requests
        self.sent: list[tuple[float, float, Request]] = []  # (start, end, request): what was in flight when

    def _stored(self) -> int:
        with self.store.session() as s:
            return int(s.scalar(sa.select(sa.func.count()).select_from(InvocationRow)
                                .join(EpisodeRow, EpisodeRow.id == InvocationRow.episode_id)
                                .where(EpisodeRow.run_id == self.run_id)) or 0)

    def send(self, request: Request) -> Outcome:
        pool = self.answered[-50:]
        path = request.path.replace("{pooled}", self.run_id[:8])
        headers = {k: str(_resolve(v, pool)) for k, v in request.headers.items()}
        content = request.body if request.raw else (
            None if request.body is None else json.dumps(_resolve(request.body, pool)).encode())
        if content is not None and not request.raw:
            headers["content-type"] = "application/json"
        before = self._stored()
        started = time.monotonic()
        try:
            reply = self.client.request(request.method, path, content=content, headers=headers)
        except httpx.HTTPError as exc:  # the connection broke: as bad as a 500
            self.server_errors += 1
            outcome = Outcome(599, [f"{request.method} {path}: {type(exc).__name__}: {exc}"])
        else:
            outcome = self.check(request, reply, before, headers)
        self.sent.append((started, time.monotonic(), request))
        if outcome.violations and len(self.problems) < 20:
            self.problems += [*outcome.violations, f"  request: {request!r}"[:2000]]
        return outcome

    def check(self, request: Request, reply: httpx.Response, before: int, headers: dict[str, str]) -> Outcome:
        status, problems = reply.status_code, []
        self.counts[(f"{request.method} {request.route}", f"{status // 100}xx")] += 1
        where = f"{request.method} {request.path} ({status})"
        body: Any = None
        if "json" in reply.headers.get("content-type", ""):
            try:
                body = reply.json()
            except ValueError:
                problems.append(f"{where}: a JSON answer that does not parse")
        if status >= 500:
            self.server_errors += 1
            problems.append(f"{where}: server error {reply.text[:300]}")
        elif status >= 400:
            error = (body or {}).get("error") if isinstance(body, dict) else None
            if not isinstance(error, dict) or not error.get("message"):
                problems.append(f"{where}: a 4xx without the OpenAI error body: {reply.text[:200]}")
            elif status in (400, 413) and not error.get("param"):
                self.refused_without_field += 1
                problems.append(f"{where}: a {status} naming no field: {error['message']}")
        stream_error = False
        if status == 200 and "text/event-stream" in reply.headers.get("content-type", ""):
            text = reply.text
            stream_error = '"error"' in text and ("data: [DONE]" not in text and "response.completed" not in text
                                                  and "response.incomplete" not in text)
            if '"server_error"' in text:
                self.server_errors += 1
                problems.append(f"{where}: a stream ended with a server error: {text[-300:]}")
        stored = self._stored() - before
        ids = [i for i in reply.headers.get("x-agentmem-invocation", "").split(",") if i]
        recorded = headers.get("X-Agentmem-Record", "").lower() not in ("no", "false", "0")
        expected = len(ids) if status == 200 and ids and recorded and not stream_error else 0
        if stored != expected:
            self.miscounted += 1
            problems.append(f"{where}: {stored} calls stored, {expected} expected")
        if expected and stored == expected:
            self.answered += ids
        return Outcome(status, problems)


def half_written(store: Store, run_ids: list[str]) -> list[str]:
    """What is stored incompletely in ``run_ids``: invocations without their ``serve_calls`` row or with arrays
    of unequal lengths or wrong token counts, episodes whose steps have gaps, rewards not finite or F1-like scores
    outside [0, 1]."""
    from store import arrays

    problems = []
    with store.session() as s:
        rows = s.execute(sa.select(InvocationRow.id, InvocationRow.episode_id, InvocationRow.step,
                                   InvocationRow.prompt_ids, InvocationRow.output_ids, InvocationRow.output_logprobs,
                                   InvocationRow.prompt_tokens, InvocationRow.output_tokens, ServeCallRow.invocation_id)
                         .join(EpisodeRow, EpisodeRow.id == InvocationRow.episode_id)
                         .outerjoin(ServeCallRow, ServeCallRow.invocation_id == InvocationRow.id)
                         .where(EpisodeRow.run_id.in_(run_ids))).all()
        episodes = s.execute(sa.select(EpisodeRow.id, EpisodeRow.reward, EpisodeRow.f1, EpisodeRow.em,
                                       EpisodeRow.sub_em).where(EpisodeRow.run_id.in_(run_ids))).all()
    steps: dict[str, list[int]] = {}
    for inv_id, ep, step, prompt, output, logprobs, n_prompt, n_output, served in rows:
        prompt, output = arrays.decode(prompt, arrays.IDS), arrays.decode(output, arrays.IDS)
        if served is None:
            problems.append(f"invocation {inv_id}: no serve_calls row")
        if logprobs is not None and len(arrays.decode(logprobs, arrays.FLOATS)) != len(output):
            problems.append(f"invocation {inv_id}: {len(output)} output ids, another count of log-probs")
        if (n_prompt, n_output) != (len(prompt), len(output)) or len(prompt) == 0:
            problems.append(f"invocation {inv_id}: token counts {n_prompt}, {n_output} for {len(prompt)}, {len(output)}")
        steps.setdefault(ep, []).append(step)
    problems += [f"episode {ep}: steps {sorted(s)}" for ep, s in steps.items() if sorted(s) != list(range(len(s)))]
    for ep, reward, *scores in episodes:
        if reward is not None and not math.isfinite(reward):
            problems.append(f"episode {ep}: reward {reward}")
        if any(v is not None and not 0 <= v <= 1 for v in scores):
            problems.append(f"episode {ep}: scores {scores}")
    return problems


class Health:
    """Polls ``/health`` every ``interval_s`` in a thread while open: each answer's latency, and how many were not
    200 (``failures``)."""

    def __init__(self, root: str, interval_s: float = 0.1, headers: dict[str, str] | None = None):
        self.root, self.interval_s, self.headers = root, interval_s, headers or {}
        self.latencies_ms: list[float] = []
        self.starts: list[float] = []  # when each poll began (time.monotonic)
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                start = time.monotonic()
                try:
                    ok = client.get(f"{self.root}/health", headers=self.headers).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies_ms.append((time.monotonic() - start) * 1000)
                self.starts.append(start)
                self.failures += not ok
                self._stop.wait(self.interval_s)

    def __enter__(self) -> Health:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def percentile(self, q: float) -> float:
        if not self.latencies_ms:
            return 0.0
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Target:
    """A server under test: its root URL, its run, and the checker sending to it."""

    name: str
    root: str
    run_id: str
    checker: Checker


@contextlib.contextmanager
def served(store: Store, folder: Path, *, gateway: bool = True, max_body_mb: float = 1.0) -> Iterator[list[Target]]:
    """``agentmem serve`` on a tiny random model (``chatml_tools``: tools and forced calls) with small limits,
    and, with ``gateway``, a gateway (``--upstream``) in front of a second server on the same model: each on a
    free port in this process, writing ``store`` (the upstream records nothing, as a gateway's does)."""
    from agentmem.config import ServeConfig
    from agentmem.serve.server import build_server
    from agentmem.testing.serving import running
    from agentmem.testing.tiny_models import save_tiny

    model = save_tiny(folder / "tiny")
    options = dict(model=model, dtype="float32", batch_window_ms=1, max_tokens=8, max_n=4,
                   max_body_mb=max_body_mb, chat_template="chatml_tools")
    servers = [("direct", build_server(store, ServeConfig(run_name="fuzz-direct", **options)))]
    with contextlib.ExitStack() as stack:
        if gateway:
            upstream = build_server(store, ServeConfig(run_name="fuzz-upstream", **options))
            root = stack.enter_context(running(upstream.app))
            stack.callback(upstream.close, "finished")
            servers.append(("gateway", build_server(store, ServeConfig(
                run_name="fuzz-gateway", upstream=(f"{root}/v1",), upstream_wait=10, **options))))
        targets = []
        for name, server in servers:
            root = stack.enter_context(running(server.app))
            stack.callback(server.close, "finished")
            client = stack.enter_context(httpx.Client(base_url=root, timeout=120))
            targets.append(Target(name, root, server.run_id, Checker(client, store, server.run_id)))
        yield targets


def model_of(targets: list[Target]) -> str:
    return httpx.get(f"{targets[0].root}/v1/models").json()["data"][0]["id"]


def in_flight(health: Health, checkers: list[Checker]) -> tuple[float, Request | None]:
    """The slowest ``/health`` answer (ms) and the request that was being answered meanwhile, if any."""
    if not health.latencies_ms:
        return 0.0, None
    k = max(range(len(health.latencies_ms)), key=health.latencies_ms.__getitem__)
    start, end = health.starts[k], health.starts[k] + health.latencies_ms[k] / 1000
    for checker in checkers:
        for began, ended, request in checker.sent:
            if began < end and ended > start:
                return health.latencies_ms[k], request
    return health.latencies_ms[k], None

"""Several OpenAI-compatible servers (``agentmem serve``, ``vllm serve``) as one backend: each episode stays on
one server, and a call whose server dies is answered by another.

Routing: the agent loop passes each call's key, its episode id (``generate_keyed``; ``backends.types.KeyedBackend``).
The servers are ranked per key by rendezvous hashing (``sha256(key, url)``, as ``agentmem serve --upstream`` ranks
its upstreams), the same in every process: all calls of one episode go to its first server (whose prefix cache
keeps the episode's prompt head), the episodes of a round spread over the servers, and a server going down moves
only its own episodes, each to its next server. The calls of one round are one request per server, the requests
to different servers run at the same time (threads), and the answers come back in the caller's order.

Failure: when a server cannot be reached, drops the connection mid-call or answers 5xx
(``openai_backend.ServerUnavailable``), its calls of that request go to each one's next server in rank, and the
failed server is skipped for ``cooldown_s`` seconds (then its episodes return to it). Every call is answered by
exactly one server: the ids and log-probs returned are that server's, and the episode's state is untouched by the
failed attempt (the loop changes it only from an answer), so the call is stored once, from the server that
answered. When every server fails, the last error is raised (the loop ends those episodes ``failed`` with it). A
4xx is the request's own fault: it is raised at once, never retried elsewhere.

Determinism: greedy decoding gives the same ids whichever server answers (servers of the same model and dtype,
batches that do not change the logits). A seeded sampled request is split per server, and a server seeds the
``i``-th prompt of its request with ``seed + i``, so samples depend on the split (as they depend on the worker
that drew them: ``jobs.worker``).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from agentmem.backends.openai_backend import OpenAIBackend, ServerUnavailable
from agentmem.backends.types import Generation, SamplingParams
from agentmem.errors import BackendError


def rank(key: str, urls: Sequence[str]) -> list[int]:
    """The indexes of ``urls`` in the order ``key``'s calls try them (rendezvous hashing, as the serve gateway ranks its upstreams): stable across processes,
    and removing one URL leaves the others' order unchanged."""
    return sorted(range(len(urls)), key=lambda i: hashlib.sha256(f"{key}\x00{urls[i]}".encode()).digest(),
                  reverse=True)


class ServerPool:
    """``servers``: one client per server, all serving the same model with the same tokenizer. ``failovers``
    counts the requests that were sent on to another server after their server failed."""

    name = "openai"

    def __init__(self, servers: Sequence[OpenAIBackend], *, cooldown_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        if not servers:
            raise BackendError("a server pool needs at least one server (--base-url)")
        self.servers = list(servers)
        self.tokenizer = self.servers[0].tokenizer
        self.cooldown_s, self.clock = cooldown_s, clock
        self.failovers = 0
        self._down_until = [float("-inf")] * len(self.servers)
        self._lock = threading.Lock()

    @property
    def urls(self) -> list[str]:
        return [s.base_url for s in self.servers]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Every prompt to one server (the first up): a caller without keys keeps its batch whole."""
        return self.generate_keyed([""] * len(prompts), prompts, params)

    def generate_keyed(self, keys: list[str], prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One ``Generation`` per prompt, in order; prompt ``i`` goes to the first server of ``keys[i]`` that is up."""
        if len(keys) != len(prompts):
            raise BackendError(f"{len(keys)} keys for {len(prompts)} prompts")
        orders = [rank(k, self.urls) for k in keys]
        out: dict[int, Generation] = {}
        failed: set[int] = set()  # servers that failed during this call: never asked again by it
        pending, last = list(range(len(prompts))), None
        while pending:
            groups = self._place(pending, orders, failed)
            if groups is None:
                raise BackendError(f"no server answered ({len(self.servers)} tried); the last: {last}")
            answers = self._ask(groups, prompts, params)
            pending = []
            for s, idx in groups.items():
                got = answers[s]
                if isinstance(got, ServerUnavailable):
                    last = got
                    failed.add(s)
                    pending += idx
                    with self._lock:
                        self._down_until[s] = self.clock() + self.cooldown_s
                        self.failovers += 1
                else:
                    out.update(zip(idx, got, strict=True))
        return [out[i] for i in range(len(prompts))]

    def _place(self, pending: list[int], orders: list[list[int]], failed: set[int]) -> dict[int, list[int]] | None:
        """The server of each pending prompt: its first that did not fail, preferring those not cooling down."""
        now = self.clock()
        with self._lock:
            cooling = {s for s, t in enumerate(self._down_until) if t > now}
        groups: dict[int, list[int]] = {}
        for i in pending:
            left = [s for s in orders[i] if s not in failed]
            if not left:
                return None
            up = [s for s in left if s not in cooling]
            groups.setdefault((up or left)[0], []).append(i)
        return groups

    def _ask(self, groups: dict[int, list[int]], prompts: list[list[int]], params: SamplingParams
             ) -> dict[int, list[Generation] | ServerUnavailable]:
        """One request per server, at the same time; a server's ``ServerUnavailable`` is its answer, any other
        error is raised."""
        def one(s: int) -> list[Generation] | ServerUnavailable:
            try:
                return self.servers[s].generate([prompts[i] for i in groups[s]], params)
            except ServerUnavailable as err:
                return err

        if len(groups) == 1:
            (s,) = groups
            return {s: one(s)}
        with ThreadPoolExecutor(len(groups)) as pool:
            futures = {s: pool.submit(one, s) for s in groups}
            return {s: f.result() for s, f in futures.items()}

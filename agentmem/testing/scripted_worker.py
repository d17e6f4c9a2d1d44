"""One rollout worker process with the scripted backend, for the fault tests and ``bench/workers.py``.

``python -m agentmem.testing.scripted_worker DB_URL RUN_ID TAG [LEASE_S] [SLEEP_S] [BATCH]``: works the run
until it is finished, answering every call with ``respond`` (the lease tests' scripted answer: the same
outputs in every process) after ``SLEEP_S`` seconds per batch, and stores ``TAG`` (a number naming this
process) as every call's ``latency_s``, so a test can tell which process stored which call. Prints the
worker's one-line summary, and with ``AGENTMEM_INSERT_TIMES=PATH`` writes each round's store write time
(seconds, one a line) to PATH. With ``AGENTMEM_WORKER_GO=stdin`` it waits, once started up (store opened,
policy registered, ``registered`` printed), for a line on stdin before it works the run.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path

from agentmem.backends.scripted import ScriptedBackend
from agentmem.jobs import rollout, worker
from agentmem.jobs.rollout import LeaseTerms
from agentmem.model_refs import ModelRef, register
from agentmem.testing.tiny_models import tiny_tokenizer
from store.engine import open_store


def respond(tok) -> Callable[[list[int]], str]:
    """The scripted answer of the lease and worker tests: a function of the prompt's token ids alone."""

    def reply(prompt: list[int]) -> str:
        text = tok.decode(prompt)
        if "Reply with the short answer" in text:
            return f"Oslo {len(prompt) % 7}"
        return f"note {len(prompt)} {sum(prompt) % 97}"
    return reply


class TaggedBackend(ScriptedBackend):
    def __init__(self, tok, tag: float, sleep_s: float):
        super().__init__(tok, respond(tok))
        self.tag, self.sleep_s = tag, sleep_s

    def generate(self, prompts, params):
        time.sleep(self.sleep_s)
        self.seen_prompts.clear()  # a long-running worker keeps no history
        return [dataclasses.replace(g, latency_s=self.tag) for g in super().generate(prompts, params)]


class TimedSink(rollout.StoreSink):
    times: list[float] = []

    def invocations(self, invocations):
        t0 = time.perf_counter()
        try:
            return super().invocations(invocations)
        finally:
            TimedSink.times.append(time.perf_counter() - t0)


def tagged_sampler(store, sleep_s: float = 0.0):
    """(checkpoint, backend) of a Ray actor in the fault tests and ``bench/workers.py --ray``
    (``jobs.ray_rollout.SamplerFactory``): the scripted answers after ``sleep_s`` per batch, every call tagged
    with the process id (a restarted actor is a new process, so a new tag)."""
    import os

    policy = register(store, ModelRef("tiny", "/models/tiny", "tiny"))
    return policy, TaggedBackend(tiny_tokenizer(), float(os.getpid()), sleep_s)


def main() -> None:
    import os

    url, run_id, tag = sys.argv[1], sys.argv[2], float(sys.argv[3])
    lease_s = float(sys.argv[4]) if len(sys.argv) > 4 else 2.0
    sleep_s = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    batch = int(sys.argv[6]) if len(sys.argv) > 6 else None
    store = open_store(url)
    policy = register(store, ModelRef("tiny", "/models/tiny", "tiny"))
    print("registered", flush=True)  # start-up done: a test may now disturb the store
    if os.environ.get("AGENTMEM_WORKER_GO") == "stdin":
        sys.stdin.readline()  # the test says when to start working (after it has stopped the store)
    times_path = os.environ.get("AGENTMEM_INSERT_TIMES")
    if times_path:
        worker.StoreSink = TimedSink  # the sink the worker builds
    result = worker.run_worker(store, run_id, lease=LeaseTerms(seconds=lease_s, max_attempts=1000), batch=batch,
                        backend=TaggedBackend(tiny_tokenizer(), tag, sleep_s), policy=policy)
    if times_path:
        Path(times_path).write_text("".join(f"{t}\n" for t in TimedSink.times))
    st = result.stats
    print(f"worker={result.owner} claimed={st.claimed} resumed={st.resumed} calls={st.calls} lost={st.lost} "
          f"finished={','.join(result.finished_runs) or '-'}", flush=True)


if __name__ == "__main__":
    main()

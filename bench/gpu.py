"""One prepared check of every CUDA path, in one command that finishes in about 8 minutes on one H100/H200.

Parts, each under its own try/except and time budget (a failure is recorded and the next part runs); the
results go to ``OUT/gpu_check.json`` after every part, the log to stdout (``scripts/gpu_check.sh`` tees it
to ``OUT/gpu_check.log``):

  env          torch, the device, flash-attn present or not, the bf16 peak used for MFU
  exact        bf16 on CUDA (float32 in a dry run): packed vs unpacked and shared-prefix vs unshared logits,
               teacher log-probs (the packed scorer) vs a direct forward pass, and every fast-path kernel
               (per-segment SDPA, FlexAttention, flash varlen where installed) vs the reference 4-D mask path
  serve_batch  continuous batching (``backends/decode_batch.py``: rows joining a running decode batch, the
               static decode step's buffers growing, slots reused) on the device in float32: each row's sampled
               log-probs against a fresh forward pass over its prompt and output
  speed        packed vs padded teacher scoring and training steps at MemAgent-like call lengths (1-8K tokens
               per call, 8-64 calls per step) for padded, per-segment SDPA, FlexAttention (and flash-attn):
               tokens/s, peak memory, MFU (bench/common/gpu_speed.py)
  rollout      ``agentmem rollout`` and ``agentmem eval`` with the transformers backend, batch 32, tokens/s, on
               a random SmolLM2-135M-shape model folder with a small local tokenizer (no download)
  distributed  ``torchrun --nproc_per_node 1``: ``agentmem distill`` one step on the device; and one DDP and one
               FSDP2 step of the packed student (NCCL; gloo in a dry run) whose gradients must equal the
               unwrapped step's. (A one-process ``distill`` wraps nothing, and refuses ``--fsdp``: with one
               GPU the wrappers are checked on the module ``distill`` wraps, ``PackedModel.module``.)
  store        the SQLite store under OUT that rollout, eval and distill wrote: its rows and integrity

  bash scripts/gpu_check.sh           # on the GPU machine (installs .gpu_wheels/, runs this, OUT=$OUT)
  python -m bench.gpu --out DIR       # the same where agentmem's dependencies are installed
  python -m bench.gpu --dry-run       # the same code on CPU with a tiny model, under 2 minutes (--smoke too)

Exit status 1 when a part failed. The last line is ``packed_vs_padded_train=<r> packed_vs_padded_score=<r> flex_vs_sdpa_segments=<r> mfu=<f>
exact_max_abs=<d> device=<name>`` (tokens/s ratios at the largest step measured; flex_vs_sdpa on training
steps, on scoring in a dry run since FlexAttention has no CPU backward; empty where not measured).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from agentmem.replay import pack
from agentmem.testing.tiny_models import save_tiny, tiny_tokenizer
from agentmem.training.collate import collate_rows
from agentmem.training.forward import PackedModel, plan, split_actions
from agentmem.training.packed_attention import KERNELS, action_logits, attention_kernel, default_kernel
from bench.common.gpu_speed import measure
from bench.common.shapes import build, memagent_calls

REPO = Path(__file__).resolve().parents[1]
BF16_PEAK = {"H100": 989e12, "H200": 989e12}  # dense bf16 TFLOP/s of the SXM cards


class Check:
    """The results so far, written to ``OUT/gpu_check.json`` after each part."""

    def __init__(self, out: Path, dry: bool, device: str):
        self.out, self.dry, self.device, self.results = out, dry, device, {}
        self.started = time.perf_counter()

    def log(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.started:6.1f}s] {msg}", flush=True)

    def part(self, name: str, budget_s: float, fn: Callable[[Callable[[], float]], dict]) -> dict:
        self.log(f"== {name} (budget {budget_s:.0f} s)")
        start = time.perf_counter()

        def left() -> float:
            return budget_s - (time.perf_counter() - start)

        try:
            result = {"ok": True, **fn(left)}
        except Exception as err:  # every part is guarded: record it, go on with the next
            result = {"ok": False, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-3000:]}
            self.log(f"{name} FAILED: {result['error']}")
        result["seconds"] = round(time.perf_counter() - start, 1)
        self.results[name] = result
        (self.out / "gpu_check.json").write_text(json.dumps(self.results, indent=1, default=str))
        return result


def env_part(check: Check) -> Callable[[Callable[[], float]], dict]:
    def run(left):
        import importlib.util

        info = {"torch": torch.__version__, "python": platform.python_version(), "device": check.device,
                "flash_attn": importlib.util.find_spec("flash_attn") is not None}
        if check.device == "cuda":
            name = torch.cuda.get_device_name()
            info |= {"name": name, "capability": torch.cuda.get_device_capability(),
                     "memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30,
                     "bf16_peak": next((v for k, v in BF16_PEAK.items() if k in name), None)}
        else:
            info |= {"name": "cpu", "bf16_peak": None}
        info["default_kernel"] = default_kernel(torch.device(check.device), torch.bfloat16)
        check.log(json.dumps(info))
        return info
    return run


def exact_part(check: Check, shape: str, dtype: torch.dtype, lengths: tuple[int, int], head: int,
               row_tokens: int) -> Callable[[Callable[[], float]], dict]:
    def run(left):
        dev = check.device
        model = build(shape, dev, dtype)
        vocab = model.config.vocab_size
        seqs = memagent_calls(12, *lengths, vocab, seed=1, groups=3, head=head)
        by_id = {s.invocation_id: s for s in seqs}
        with torch.inference_mode():
            alone = {}
            for s in seqs:
                ids = torch.from_numpy(s.input_ids.astype(np.int64))[None].to(dev)
                hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[0]
                alone[s.invocation_id] = model.get_output_embeddings()(hidden[torch.from_numpy(s.action_mask).to(dev)])
            packed = {packing: pack(seqs, row_tokens, shared_prefix=packing == "shared") for packing in ("segments",
                                                                                                 "shared")}
            batches = {packing: collate_rows(rows, 0).to(dev) for packing, (rows, _) in packed.items()}
            out: dict = {"shape": shape, "dtype": str(dtype), "calls": len(seqs),
                         "shared_tokens": packed["shared"][1].shared_tokens,
                         "logit_scale": max(a.abs().max().item() for a in alone.values())}

            def vs_alone(batch, logits):
                return max((v - alone[k]).abs().max().item() for k, v in split_actions(batch, logits))

            default = {p: action_logits(model, b, "fast") for p, b in batches.items()}
            out["packed_vs_unpacked"] = vs_alone(batches["segments"], default["segments"])
            shared = dict(split_actions(batches["shared"], default["shared"]))
            out["shared_vs_unshared"] = max((v - shared[k]).abs().max().item()
                                            for k, v in split_actions(batches["segments"], default["segments"]))
            scorer = PackedModel(model, vocab, 0, device=dev)
            teacher = scorer.logits_by_invocation(plan(seqs, row_tokens).batches)
            out["teacher_logprob_vs_direct"] = max(
                (teacher[k].log_softmax(-1).gather(-1, _ids(by_id[k], dev)) -
                 alone[k].float().log_softmax(-1).gather(-1, _ids(by_id[k], dev))).abs().max().item() for k in by_id)
            kernels = [k for k in KERNELS if k != "flash" or _has_flash()]
            for kernel in kernels:
                for packing, batch in batches.items():
                    reference = action_logits(model, batch, "reference")
                    with attention_kernel(kernel):
                        got = action_logits(model, batch, "fast")
                    out[f"{kernel}_{packing}_vs_reference"] = (got.float() - reference.float()).abs().max().item()
        check.log(json.dumps(out))
        return out
    return run


def _ids(seq, dev: str) -> torch.Tensor:
    return torch.from_numpy(seq.action_ids.astype(np.int64))[:, None].to(dev)


def _has_flash() -> bool:
    import importlib.util

    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


def speed_part(check: Check, configs: list[tuple[str, int]], lengths: tuple[int, int], row_tokens: int,
               reps: int) -> Callable[[Callable[[], float]], dict]:
    def run(left):
        dev = check.device
        peak = check.results.get("env", {}).get("bf16_peak")
        methods = ["padded", "packed-sdpa", "packed-flex"] + (["packed-flash"] if _has_flash() else [])
        dtype = torch.bfloat16 if dev == "cuda" else torch.float32
        out: dict = {"lengths": lengths, "row_tokens": row_tokens, "methods": methods, "runs": []}
        models: dict = {}
        for shape, calls in configs:
            if left() <= 0:
                check.log(f"speed: {shape} x {calls} calls skipped (out of time)")
                continue
            if shape not in models:
                models.clear()
                torch.cuda.empty_cache() if dev == "cuda" else None
                model = build(shape, dev, dtype)
                models[shape] = (model, torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=dev == "cuda"))
            model, optimizer = models[shape]
            seqs = memagent_calls(calls, *lengths, model.config.vocab_size, seed=calls)
            for train in (False, True):
                mode = "train" if train else "score"
                # FlexAttention has no CPU backward: the dry run trains with SDPA and the padded baseline
                usable = [m for m in methods if not (train and dev == "cpu" and m == "packed-flex")]
                check.log(f"speed {shape} {calls} calls ({sum(len(s) for s in seqs)} tokens) {mode}:")
                rows = measure(model, seqs, usable, row_tokens, dev, train, reps, peak, optimizer, check.log, left)
                out["runs"].append({"shape": shape, "calls": calls, "mode": mode, "rows": rows})
        return out
    return run


def _rates(speed: dict, mode: str) -> dict[str, float]:
    """tokens/s by method at the largest step measured in ``mode`` (all methods present)."""
    runs = [r for r in speed.get("runs", []) if r["mode"] == mode]
    for run in sorted(runs, key=lambda r: -r["calls"]):
        rates = {row["method"]: row["tokens_per_s"] for row in run["rows"] if "tokens_per_s" in row}
        if "padded" in rates and len(rates) > 1:
            return rates | {"_calls": run["calls"], "_mfu": {row["method"]: row.get("mfu") for row in run["rows"]}}
    return {}


def cli(args: list[str], timeout: float, env: dict | None = None) -> tuple[str, float]:
    """Run ``python -m agentmem ARGS`` (or torchrun) in the repository; (stdout, wall seconds)."""
    start = time.perf_counter()
    proc = subprocess.run(args, cwd=REPO, env=env or _env(), capture_output=True, text=True, timeout=max(timeout, 5))
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:6])} ... exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.stdout, time.perf_counter() - start


def _env() -> dict:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env | {"AGENTMEM_DB": "", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _value(stdout: str, key: str) -> str:
    for token in stdout.split():
        if token.startswith(f"{key}="):
            return token.split("=", 1)[1]
    raise RuntimeError(f"no {key}= in the output: {stdout[-500:]}")


def rollout_part(check: Check, folder: Path, episodes: int, batch: int) -> Callable[[Callable[[], float]], dict]:
    def run(left):
        db = check.out / "gpu_check.db"
        dtype = "bfloat16" if check.device == "cuda" else "float32"
        common = ["--model", str(folder), "--device", check.device, "--dtype", dtype, "--episodes", str(episodes),
                  "--batch", str(batch), "--db", f"sqlite:///{db}"]
        out: dict = {"model": str(folder), "episodes": episodes, "batch": batch}
        for job in ("rollout", "eval"):
            stdout, wall = cli([sys.executable, "-m", "agentmem", job, *common], left())
            run_id = _value(stdout, "run_id")
            with sqlite3.connect(db) as conn:
                calls, prompt, output = conn.execute(
                    "select count(*), sum(prompt_tokens), sum(output_tokens) from invocations where episode_id in "
                    "(select id from episodes where run_id = ?)", (run_id,)).fetchone()
            out[job] = {"run_id": run_id, "calls": calls, "prompt_tokens": prompt, "output_tokens": output,
                        "wall_s": wall, "output_tokens_per_s": (output or 0) / wall}
            check.log(f"{job}: {json.dumps(out[job])}")
        return out
    return run


def serve_batch_part(check: Check, folder: Path) -> Callable[[Callable[[], float]], dict]:
    def run(left):
        from transformers import AutoModelForCausalLM

        from agentmem.backends import SamplingParams, TransformersBackend
        from agentmem.backends.decode_batch import DecodeBatch

        dev, tok = check.device, tiny_tokenizer()
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(dev).eval()
        backend = TransformersBackend.from_model(model, tok)
        texts = ["Hi", "Where does Bob live?", "Alice was born in Lyon and works in Berlin; Bob lives in Oslo. " * 4,
                 "Update the memory.", "The capital of France is Paris.", "Question: who lives in Oslo?"]
        prompts = [tok.encode(t) for t in texts]
        # start with two short rows; a long prompt joins later (the buffers grow left), a large budget (right),
        # and rows join after others left (their slots are reused)
        joins = {0: [(0, 12), (1, 40)], 2: [(2, 10)], 5: [(3, 64)], 14: [(4, 8), (5, 16)]}
        batch = DecodeBatch(backend, SamplingParams(temperature=1.0, max_new_tokens=1))
        torch.manual_seed(0)
        got, key, step = {}, {}, 0
        while step in joins or len(batch) or any(s > step for s in joins):
            if step in joins:
                rows = batch.join([prompts[i] for i, _ in joins[step]], [b for _, b in joins[step]])
                key.update(zip(rows, [i for i, _ in joins[step]], strict=True))
            got.update({key[r]: g for r, g in batch.step().items()})
            step += 1
        worst = 0.0
        with torch.inference_mode():
            for i, gen in got.items():
                ids = torch.tensor([prompts[i] + gen.output_ids], device=dev)
                logits = model(ids).logits[0, len(prompts[i]) - 1 : -1].float()
                ref = logits.log_softmax(-1).gather(-1, torch.tensor(gen.output_ids, device=dev)[:, None])[:, 0]
                worst = max(worst, (torch.tensor(gen.logprobs, device=dev) - ref).abs().max().item())
        out = {"decode_path": backend.decode_path, "rows": len(got), "joins": batch.joins, "steps": step,
               "tokens": sum(len(g.output_ids) for g in got.values()), "max_abs_logprob_vs_forward": worst}
        check.log(json.dumps(out))
        if worst > 1e-3:
            raise AssertionError(f"a joined row's log-probs are off by {worst:.3g}")
        return out
    return run


def distributed_part(check: Check, folder: Path, shape: str, layers: int) -> Callable[[Callable[[], float]], dict]:
    def run(left):
        out: dict = {}
        rollout = check.results.get("rollout", {}).get("rollout", {})
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
        if rollout.get("run_id"):
            db = check.out / "gpu_check.db"
            stdout, wall = cli([*torchrun, "-m", "agentmem", "--", "distill", "--run", rollout["run_id"], "--student",
                                str(folder), "--teacher", str(folder), "--teacher-context", "privileged", "--steps", "1",
                                "--invocations-per-step", "8", "--device", check.device, "--out",
                                str(folder.parent / "distill_ck"), "--db", f"sqlite:///{db}"], left() - 40)
            out["distill_cli"] = {"run_id": _value(stdout, "distill_run_id"), "wall_s": wall}
            check.log(f"distill under torchrun: {out['distill_cli']}")
        else:
            out["distill_cli"] = "skipped: the rollout part stored no run"
        result = check.out / "wrapped_step.json"
        cli([*torchrun, str(Path(__file__)), "--wrapped-step", str(result), "--device", check.device,
             "--shape", shape, "--layers", str(layers)], left())
        out["wrapped"] = json.loads(result.read_text())
        check.log(f"DDP / FSDP2 steps: {json.dumps(out['wrapped'])}")
        return out
    return run


def wrapped_step(path: Path, device: str, shape: str, layers: int) -> None:
    """Under torchrun: one step of the packed student plain, under DDP and under FSDP2 (the wrappers of
    ``PackedModel.for_training``); their gradients and updated weights against the plain step's."""
    import torch.distributed as dist

    from agentmem.training.forward import _ddp, _fsdp

    dev = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if device == "cuda" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=torch.device(dev))
    else:
        dist.init_process_group("gloo")
    seqs = memagent_calls(6, 16, 96, 300, seed=3)
    batch = collate_rows(pack(seqs, 256)[0], 0).to(dev)
    results: dict = {"backend": dist.get_backend(), "world_size": dist.get_world_size()}
    grads, weights = {}, {}
    for wrapper in ("plain", "ddp", "fsdp"):
        model = build(shape, dev, torch.float32, vocab=300, num_hidden_layers=layers)
        packed = PackedModel(model, 300, 0, device=dev)
        module = {"plain": packed.module, "ddp": _ddp(packed.module) if wrapper == "ddp" else None,
                  "fsdp": _fsdp(packed.module, device == "cuda") if wrapper == "fsdp" else None}[wrapper]
        optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
        with attention_kernel("sdpa"):
            logits = module(batch)
        loss = -logits.float().log_softmax(-1).gather(-1, batch.action_ids[:, None]).mean()
        loss.backward()
        grads[wrapper] = {n: _full(p.grad) for n, p in module.named_parameters()}
        optimizer.step()
        weights[wrapper] = {n: _full(p.detach()) for n, p in module.named_parameters()}
        results[f"{wrapper}_loss"] = loss.item()
    for wrapper in ("ddp", "fsdp"):
        results[f"{wrapper}_grad_max_abs_diff"] = max(
            (g - grads["plain"][_plain_name(n)]).abs().max().item() for n, g in grads[wrapper].items())
        results[f"{wrapper}_weight_max_abs_diff"] = max(
            (w - weights["plain"][_plain_name(n)]).abs().max().item() for n, w in weights[wrapper].items())
    if dist.get_rank() == 0:
        path.write_text(json.dumps(results))
    dist.destroy_process_group()


def _full(t: torch.Tensor) -> torch.Tensor:
    """A parameter or gradient as one local tensor (FSDP2 holds DTensors)."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().float().cpu()


def _plain_name(name: str) -> str:
    return name.removeprefix("module.")


def store_part(check: Check) -> Callable[[Callable[[], float]], dict]:
    def run(left):
        db = check.out / "gpu_check.db"
        if not db.exists():
            raise RuntimeError(f"no store at {db}: the rollout part wrote none")
        with sqlite3.connect(db) as conn:
            tables = [t for (t,) in conn.execute("select name from sqlite_master where type = 'table'")]
            counts = {t: conn.execute(f'select count(*) from "{t}"').fetchone()[0] for t in tables}
            integrity = conn.execute("pragma integrity_check").fetchone()[0]
        out = {"path": str(db), "integrity": integrity, "rows": {k: v for k, v in counts.items() if v}}
        check.log(json.dumps(out))
        return out
    return run


def summary(check: Check) -> str:
    speed = check.results.get("speed", {})
    train, score = _rates(speed, "train"), _rates(speed, "score")
    dev_kernel = f"packed-{check.results.get('env', {}).get('default_kernel', 'sdpa')}"

    def ratio(rates: dict, a: str, b: str) -> str:
        return f"{rates[a] / rates[b]:.3f}" if a in rates and b in rates else ""

    flex_rates = train if "packed-flex" in train else score
    mfu = train.get("_mfu", {}).get(dev_kernel) if train else None
    exact = check.results.get("exact", {})
    diffs = [v for k, v in exact.items() if k.endswith(("_vs_reference", "_vs_unpacked", "_vs_unshared"))]
    name = check.results.get("env", {}).get("name", check.device).replace(" ", "_")
    return (f"packed_vs_padded_train={ratio(train, dev_kernel, 'padded')} "
            f"packed_vs_padded_score={ratio(score, dev_kernel, 'padded')} "
            f"flex_vs_sdpa_segments={ratio(flex_rates, 'packed-flex', 'packed-sdpa')} "
            f"mfu={f'{mfu:.3f}' if mfu is not None else ''} "
            f"exact_max_abs={f'{max(diffs):.3g}' if diffs else ''} device={name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or Path(tempfile.gettempdir()) / "gpu_check_out"),
                    help="results: gpu_check.json, the SQLite store, the DDP/FSDP2 step (default: $OUT, else TMPDIR/gpu_check_out)")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "agentmem_gpu_check",
                    help="the model folder and checkpoints (kept out of --out: they are large)")
    ap.add_argument("--dry-run", action="store_true", help="the same code on CPU with a tiny model (under 2 minutes)")
    ap.add_argument("--smoke", action="store_true", help="the same as --dry-run")
    ap.add_argument("--speed-shapes", default="qwen2.5-0.5b:8,qwen2.5-0.5b:32,qwen2.5-1.5b:32,qwen2.5-0.5b:64",
                    help="SHAPE:CALLS per step, in order (each until the speed budget is spent)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--wrapped-step", type=Path, help=argparse.SUPPRESS)  # the torchrun worker of 'distributed'
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--shape", default="smollm2-135m", help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.wrapped_step:
        wrapped_step(args.wrapped_step, args.device, args.shape, args.layers)
        return
    dry = args.dry_run or args.smoke or not torch.cuda.is_available()
    if dry and not (args.dry_run or args.smoke):
        print("no CUDA device: running the dry run", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if dry else "cuda"
    check = Check(args.out, dry, device)
    folder = args.work / ("model-tiny" if dry else "model-smollm2-135m")
    if not (folder / "config.json").exists():
        model = build("tiny" if dry else "smollm2-135m", "cpu", torch.float32, vocab=len(tiny_tokenizer()),
                      eos_token_id=tiny_tokenizer().eos_token_id, pad_token_id=tiny_tokenizer().pad_token_id)
        save_tiny(folder, model)
    check.part("env", 10, env_part(check))
    if dry:
        # rows of at most 128 tokens: one FlexAttention shape bucket, compiled once
        check.part("exact", 60, exact_part(check, "tiny", torch.float32, (12, 32), 4, 128))
        check.part("serve_batch", 15, serve_batch_part(check, folder))
        check.part("speed", 60, speed_part(check, [("tiny", 6)], (16, 60), 128, 1))
        check.part("rollout", 60, rollout_part(check, folder, 2, 4))
        check.part("distributed", 90, distributed_part(check, folder, "tiny", 2))
    else:
        check.part("exact", 45, exact_part(check, "smollm2-135m", torch.bfloat16, (256, 2048), 192, 4 * 2048))
        check.part("serve_batch", 15, serve_batch_part(check, folder))
        configs = [(s, int(c)) for s, c in (x.split(":") for x in args.speed_shapes.split(","))]
        # the parts' budgets add up to the 380 s scripts/gpu_check.sh gives this command; speed adapts to its own
        check.part("speed", 115, speed_part(check, configs, (1024, 8192), 16384, args.reps))
        check.part("rollout", 75, rollout_part(check, folder, 32, 32))
        check.part("distributed", 110, distributed_part(check, folder, "smollm2-135m", 4))
    check.part("store", 5, store_part(check))
    failed = [k for k, v in check.results.items() if not v["ok"]]
    check.log(f"done in {time.perf_counter() - check.started:.0f} s; failed parts: {', '.join(failed) or 'none'}")
    print(summary(check), flush=True)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()

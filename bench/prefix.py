"""Shared-prefix computation against ordinary packing, measured in one run, on realistic call lengths.

GRPO samples G episodes of a task; at a step the G calls read the same question and chunk and differ in
their memory. With the chunk-first prompt layout everything before the memory is one shared token prefix.
This benchmark builds such groups from real text and the real tokenizer, without sampling a model:

  calls   for each task and chunk of the environment (``--env hotpotqa`` reads the shared HotpotQA file,
          ``--env synthetic`` the default generator), G update calls rendered by the overwrite policy in
          the chunk-first layout, each with its own memory (a random span of ``--memory`` tokens of the
          task's text, lengths drawn around the memory budget) and its own sampled output (``--output``
          tokens on average). ``--lengths FILE`` instead reads ``[[shared, own_prompt, output], ...]``.
  ceiling per-call tokens over unique tokens (a group's prefix once), computed from the lengths.

It then times, with the default model (SmolLM2-135M-Instruct), one torch thread:

  score    teacher scoring of the calls (no grad, logits at action positions), ``segments`` packing
           against ``shared_prefix`` packing (the prefix placed and computed once per group);
  train    a distill step's student forward + backward over the same calls, both packings;
  rollout  rollout prefill: the transformers backend generating one token for each group's G prompts,
           unshared against shared (prefix prefilled once, its KV cache expanded to the G rows).

Throughput is in call tokens (every call's full length) per second, so a ratio is a speedup of the same
work. Each figure is the best of ``--repeats`` interleaved rounds (the CPU may be shared).

  python -m bench.prefix --env hotpotqa --chunk-tokens 1024          # the HotpotQA case of docs/benchmarks.md
  python -m bench.prefix --env synthetic                              # the default synthetic calls
  python -m bench.prefix --quick                                      # 1 group per G, G = 1, 8
  python -m bench.prefix --smoke      # a tiny random model, synthetic, G = 1 and 2: every phase, seconds

The last line is ``score_shared_vs_packed=<r> train_shared_vs_packed=<r> rollout_shared_vs_unshared=<r>
ceiling=<r>`` for the largest G.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from agentmem.agent.overwrite import OverwritePolicy, OverwriteState
from agentmem.backends.model_files import load_model, prepare_default_model
from agentmem.backends.transformers_backend import TransformersBackend
from agentmem.backends.types import SamplingParams
from agentmem.config import AgentConfig, Packing
from agentmem.records import Invocation
from agentmem.replay import rebuild_aligned, shareable_prefix
from agentmem.training.forward import PackedModel, plan
from bench.common.tiny import tiny_model
from envs import load_env

HOTPOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa"


def env_groups(args, tok, g: int, n_groups: int, seed: int) -> list[list[list[int]]]:
    """``n_groups`` groups of ``g`` chunk-first update prompts (token ids) over real chunks."""
    count = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    if args.env == "hotpotqa":
        data = args.data or str(next(HOTPOT.glob("*.json")))
        env = load_env("hotpotqa", data_path=data, seed=seed, chunk_tokens=args.chunk_tokens, count_tokens=count)
    else:
        env = load_env("synthetic", seed=seed, chunk_tokens=args.chunk_tokens, count_tokens=count)
    policy = OverwritePolicy(tok, AgentConfig(memory_tokens=args.memory, prompt_layout="chunk-first"))
    rng = np.random.default_rng(seed)
    groups = []
    for task in env.tasks(n_groups * 4):
        full = [c for c in task.chunks if count(c) >= args.chunk_tokens * 0.8] or task.chunks
        chunk_i = int(rng.integers(len(full)))
        text_ids = tok(" ".join(task.chunks), add_special_tokens=False)["input_ids"]
        group = []
        for _ in range(g):
            m = int(np.clip(rng.normal(args.memory * 0.8, args.memory * 0.15), 8, args.memory))
            lo = int(rng.integers(max(1, len(text_ids) - m)))
            memory = tok.decode(text_ids[lo : lo + m]).strip()
            state = OverwriteState(memory, task.chunks.index(full[chunk_i]))
            group.append(policy.next_call(state, task).prompt.ids)
        groups.append(group)
        if len(groups) == n_groups:
            break
    return groups


def file_groups(path: Path, g: int, n_groups: int, vocab: int, seed: int) -> list[list[list[int]]]:
    rng = np.random.default_rng(seed)
    triples = json.loads(path.read_text())
    groups = []
    for k in range(n_groups):
        shared, own, _out = triples[k % len(triples)]
        prefix = rng.integers(0, vocab, shared).tolist()
        groups.append([prefix + rng.integers(0, vocab, own).tolist() for _ in range(g)])
    return groups


def invocations(groups, out_mean: int, vocab: int, seed: int) -> list[Invocation]:
    rng = np.random.default_rng(seed)
    invs = []
    for gi, group in enumerate(groups):
        for si, prompt in enumerate(group):
            o = int(np.clip(rng.lognormal(np.log(out_mean), 0.3), 8, 2 * out_mean))
            invs.append(Invocation(id=f"g{gi}s{si}", episode_id=f"e{gi}-{si}", step=0, kind="memory_update",
                                   prompt_ids=prompt, output_ids=rng.integers(0, vocab, o),
                                   output_logprobs=np.zeros(o)))
    return invs


def sequences(invs: list[Invocation]):
    seqs = []
    for inv in invs:
        seqs.append(replace(rebuild_aligned(inv), group=inv.id.split("s")[0]))
    return seqs


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(args, model, tok, g: int) -> dict:
    vocab = model.config.vocab_size
    groups = (file_groups(Path(args.lengths), g, args.groups, vocab, args.seed) if args.lengths
              else env_groups(args, tok, g, args.groups, args.seed))
    invs = invocations(groups, args.output, vocab, args.seed)
    seqs = sequences(invs)
    call_tokens = sum(len(s) for s in seqs)
    prompt_tokens = sum(len(p) for grp in groups for p in grp)
    by_group: dict[str, list] = {}
    for seq in seqs:
        by_group.setdefault(seq.group, []).append(seq)
    shared = sum(shareable_prefix(grp) * (len(grp) - 1) for grp in by_group.values() if len(grp) > 1)
    ceiling = call_tokens / (call_tokens - shared)
    packed = PackedModel.create(model, tok)
    plans = {mode: plan(seqs, args.row_tokens, packing=mode) for mode in (Packing.segments, Packing.shared_prefix)}

    def score(mode):
        return lambda: packed.logits_by_invocation(plans[mode].batches)

    def train(mode):
        def run():
            model.requires_grad_(True)
            for rows in plans[mode].batches:
                logits = packed.action_logits(packed.collate(rows))
                logits.logsumexp(-1).sum().backward()
            model.zero_grad(set_to_none=True)
            model.requires_grad_(False)
        return run

    backends = {flag: TransformersBackend.from_model(model, tok, share_prefix=flag) for flag in (False, True)}
    params = SamplingParams(temperature=0.0, max_new_tokens=1)

    def rollout(flag):
        return lambda: [backends[flag].generate(grp, params) for grp in groups]

    work = {"score": score, "train": train}
    out: dict = {"G": g, "calls": len(seqs), "call_tokens": call_tokens, "ceiling": ceiling}
    times: dict = {}
    for _ in range(args.repeats):  # interleaved rounds
        for name, make in work.items():
            for mode in (Packing.segments, Packing.shared_prefix):
                times.setdefault((name, mode), []).append(best(make(mode), 1))
        for flag in (False, True):
            times.setdefault(("rollout", flag), []).append(best(rollout(flag), 1))
    for name in ("score", "train"):
        seg, sh = min(times[(name, Packing.segments)]), min(times[(name, Packing.shared_prefix)])
        out[f"{name}_packed_tps"], out[f"{name}_shared_tps"] = call_tokens / seg, call_tokens / sh
        out[f"{name}_ratio"] = seg / sh
    un, sh = min(times[("rollout", False)]), min(times[("rollout", True)])
    out["rollout_unshared_s"], out["rollout_shared_s"], out["rollout_ratio"] = un, sh, un / sh
    stats = plans[Packing.shared_prefix].stats
    out["packed_prompt_fraction"] = 1 - stats.shared_tokens / prompt_tokens
    before = backends[True].stats.prefill_tokens_computed, backends[True].stats.prefill_tokens_total
    out["rollout_prompt_fraction"] = before[0] / max(before[1], 1)
    out["prompt_tokens"] = prompt_tokens
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", choices=["hotpotqa", "synthetic"], default="hotpotqa")
    ap.add_argument("--data", help="HotpotQA file (default: the one in ../shared/data/hotpotqa)")
    ap.add_argument("--lengths", help="JSON [[shared, own_prompt, output], ...] instead of an environment")
    ap.add_argument("--chunk-tokens", type=int, default=1024)
    ap.add_argument("--memory", type=int, default=128, help="memory budget (tokens)")
    ap.add_argument("--output", type=int, default=80, help="mean output tokens per call")
    ap.add_argument("--groups", type=int, default=2, help="tasks per G")
    ap.add_argument("--sizes", default="1,4,8", help="group sizes G")
    ap.add_argument("--row-tokens", type=int, default=16384)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="one group per G, G = 1 and 8, one round")
    ap.add_argument("--model", default=None, help="model folder (default: the prepared default model)")
    ap.add_argument("--smoke", action="store_true", help="a tiny random model, synthetic, one group of G = 1 and 2")
    args = ap.parse_args()
    if args.quick:
        args.groups, args.sizes, args.repeats = 1, "1,8", 1
    if args.smoke:
        args.env, args.groups, args.sizes, args.repeats, args.chunk_tokens, args.memory, args.output = \
            "synthetic", 1, "1,2", 1, 128, 16, 8
        args.row_tokens = 2048
        args.model = args.model or tiny_model(Path(tempfile.mkdtemp(prefix="prefix-smoke-")))
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model or prepare_default_model(), dtype=args.dtype)
    rows = [measure(args, model, tok, int(g)) for g in args.sizes.split(",")]
    print(f"{args.model or 'default model'}, {args.dtype}, {args.threads} thread(s), env {args.env}, chunks {args.chunk_tokens}, "
          f"memory {args.memory}, output ~{args.output}, {args.groups} group(s) per G, best of {args.repeats}")
    print(f"{'G':>3}{'calls':>6}{'call tok':>9}{'ceiling':>8} | {'score tok/s':>20}{'x':>6} | {'train tok/s':>18}"
          f"{'x':>6} | {'prefill s':>14}{'x':>6} | {'prompt computed':>16}")
    print(f"{'':>26} | {'packed':>10}{'shared':>10}{'':>6} | {'packed':>9}{'shared':>9}{'':>6} | "
          f"{'unsh.':>7}{'shared':>7}{'':>6} | {'packed / rollout':>16}")
    for r in rows:
        print(f"{r['G']:>3}{r['calls']:>6}{r['call_tokens']:>9}{r['ceiling']:>8.2f} | {r['score_packed_tps']:>10.0f}"
              f"{r['score_shared_tps']:>10.0f}{r['score_ratio']:>6.2f} | {r['train_packed_tps']:>9.0f}"
              f"{r['train_shared_tps']:>9.0f}{r['train_ratio']:>6.2f} | {r['rollout_unshared_s']:>7.2f}"
              f"{r['rollout_shared_s']:>7.2f}{r['rollout_ratio']:>6.2f} | {r['packed_prompt_fraction']:>7.2f} / "
              f"{r['rollout_prompt_fraction']:.2f}")
    last = rows[-1]
    for r in rows:
        frac = {k: r[f"{k}_ratio"] / r["ceiling"] for k in ("score", "train", "rollout")}
        print(f"G={r['G']}: share of ceiling " + " ".join(f"{k}={v:.2f}" for k, v in frac.items()))
    print(f"score_shared_vs_packed={last['score_ratio']:.2f} train_shared_vs_packed={last['train_ratio']:.2f} "
          f"rollout_shared_vs_unshared={last['rollout_ratio']:.2f} ceiling={last['ceiling']:.2f}")


if __name__ == "__main__":
    main()

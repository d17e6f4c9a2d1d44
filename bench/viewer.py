"""Viewer speed: server render time of the episode page (50 calls, 20k scored tokens, shown with their
tokenizer pieces) and of the runs page and a run page over a store of 10k episodes.

    python -m bench.viewer [--repeat 5] [--tokenizer MODEL_FOLDER]
    python -m bench.viewer --smoke    # small stores, one repeat, no tokenizer: every page renders, in seconds

Pages are requested in-process through FastAPI's TestClient (the whole app: routing, store reads, template
rendering; no network), on a read-only SQLite store. The first request of each page is reported apart
(cold: tokenizer load, template compile). The last line is exactly
``episode_page_s=<median> runs_page_s=<median> run_page_s=<median>``. Goal: each under 1 s.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient

from agentmem.records import EpisodeStatus, TeacherContext, TeacherScore
from agentmem.testing.store_records import make_episode, make_invocation, make_run
from agentmem.view.app import create_app
from store import repository as repo
from store.engine import make_engine, open_read_only, open_store
from store.migrations import upgrade

DEFAULT_TOKENIZER = Path.home() / ".cache" / "agentmem" / "models" / "SmolLM2-135M-Instruct"


def new_store(folder: Path, name: str):
    url = f"sqlite:///{folder / name}"
    upgrade(make_engine(url))
    return url, open_store(url)


def seed_long_episode(folder: Path, calls: int = 50, output_tokens: int = 400) -> tuple[str, str]:
    """One episode of ``calls`` calls of ``output_tokens`` sampled tokens each, scored under two contexts."""
    url, st = new_store(folder, "episode.db")
    rng = np.random.default_rng(0)
    run = make_run()
    ep = make_episode(run)
    invs = []
    for step in range(calls):
        inv = make_invocation(ep, step, rng, prompt_len=900, output_len=output_tokens)
        words = " ".join(f"fact{step}-{i}" for i in range(60))
        invs.append(inv.model_copy(update={"output_ids": rng.integers(0, 49152, output_tokens).astype(np.int32),
                                           "chunk_text": f"chunk {step} " + words,
                                           "prompt_text": f"Question: ...\nchunk {step} {words}\nMemory: ...",
                                           "memory_before": words[: 40 * step % 400], "memory_after": words}))
    scores = [TeacherScore(invocation_id=i.id, teacher="teacher", context=c,
                           token_logprobs=-rng.exponential(1.0, output_tokens).astype(np.float32),
                           reverse_kl=rng.exponential(0.3, output_tokens).astype(np.float32),
                           entropy=rng.exponential(1.0, output_tokens).astype(np.float32))
              for i in invs for c in (TeacherContext.aligned, TeacherContext.persistent)]
    with st.session() as s:
        repo.insert_run(s, run)
        repo.insert_episodes(s, [ep])
        repo.insert_invocations(s, invs)
        repo.insert_teacher_scores(s, scores)
        s.commit()
    st.dispose()
    return url, ep.id


def seed_many_episodes(folder: Path, runs: int = 10, per_run: int = 1000, calls: int = 4) -> tuple[str, str]:
    """``runs`` runs of ``per_run`` finished episodes (F1 drawn uniformly), ``calls`` short calls each."""
    url, st = new_store(folder, "many.db")
    rng = np.random.default_rng(1)
    first = None
    for _ in range(runs):
        run = make_run()
        first = first or run.id
        episodes = [make_episode(run, task=t).model_copy(update={
            "f1": float(rng.uniform()), "status": EpisodeStatus.answered, "stop_reason": "answered"})
            for t in range(per_run)]
        invs = [make_invocation(ep, step, rng, prompt_len=64, output_len=16) for ep in episodes for step in range(calls)]
        with st.session() as s:
            repo.insert_run(s, run)
            repo.insert_episodes(s, episodes)
            repo.insert_invocations(s, invs)
            s.commit()
    st.dispose()
    return url, first


def timed(client: TestClient, path: str, repeat: int) -> tuple[float, float]:
    """(first request, median of the next ``repeat``) in seconds."""
    times = []
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        r = client.get(path)
        times.append(time.perf_counter() - t0)
        assert r.status_code == 200, (path, r.status_code)
    return times[0], statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER) if DEFAULT_TOKENIZER.is_dir() else None)
    parser.add_argument("--smoke", action="store_true", help="5 calls, 2 runs of 20 episodes, one repeat")
    args = parser.parse_args()
    sizes = {"long": {}, "many": {}}
    if args.smoke:
        args.repeat, args.tokenizer = 1, None
        sizes = {"long": {"calls": 5, "output_tokens": 40}, "many": {"runs": 2, "per_run": 20}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        ep_url, ep_id = seed_long_episode(folder, **sizes["long"])
        many_url, run_id = seed_many_episodes(folder, **sizes["many"])
        print(f"seeded in {time.perf_counter() - t0:.1f}s; tokenizer: {args.tokenizer or 'none (ids)'}")
        rows = []
        ep_store, many_store = open_read_only(ep_url), open_read_only(many_url)
        ep_client = TestClient(create_app(ep_store, tokenizer=args.tokenizer))
        many_client = TestClient(create_app(many_store))
        for label, client, path in [
            ("episode (50 calls, 20k scored tokens)", ep_client, f"/episodes/{ep_id}"),
            ("episode, reverse KL", ep_client, f"/episodes/{ep_id}?metric=reverse_kl"),
            ("compare (2 x 20k tokens)", ep_client, f"/episodes/{ep_id}/compare"),
            ("runs (10 runs, 10k episodes)", many_client, "/"),
            ("run (1k episodes, page of 200)", many_client, f"/runs/{run_id}"),
            ("run sorted by tokens", many_client, f"/runs/{run_id}?sort=tokens&desc=1"),
        ]:
            first, median = timed(client, path, args.repeat)
            size = len(client.get(path).content)
            rows.append((label, first, median, size))
        ep_store.dispose()
        many_store.dispose()
    print(f"{'page':42s} {'first s':>8s} {'median s':>9s} {'KiB':>8s}")
    for label, first, median, size in rows:
        print(f"{label:42s} {first:8.3f} {median:9.3f} {size / 1024:8.0f}")
    print(f"episode_page_s={rows[0][2]:.3f} runs_page_s={rows[3][2]:.3f} run_page_s={rows[4][2]:.3f}")


if __name__ == "__main__":
    main()

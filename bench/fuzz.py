"""Every route of `agentmem serve` fuzzed with property-based requests built from its OpenAPI document, on SQLite
or a Postgres server: no server error, nothing half-written, `/health` answering throughout.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python -m bench.fuzz [--requests 20000] [--db URL] [--seed 0]
    python -m bench.fuzz --smoke      # 60 requests, seconds

A tiny random model is served twice in this process, each server on its own port: directly (transformers,
``chatml_tools``: tools and forced calls) and through a gateway (``--upstream``) in front of a second server;
``--gateway-share`` of the requests go to the gateway. The requests are Hypothesis' (``agentmem.testing.fuzz``:
every route of ``/openapi.json``, bodies from its schemas with realistic values, half of them with one edge value
put in, some raw bytes), sent one at a time, seeded by ``--seed``; ``/health`` is polled every 100 ms meanwhile.
``--db`` is a SQLite URL (default: a new file) or a Postgres server URL (a new database is created on it and
dropped after).

Counted: ``server_errors``, answers of 5xx or broken connections; ``half_written``, stored rows that are not
whole (an invocation without its ``serve_calls`` row, arrays of unequal lengths, a gap in an episode's steps, a
non-finite reward), plus calls stored other than exactly once (an answered call stored twice or not at all, a
refused one stored); ``unnamed_4xx``, 400s and 413s whose error names no field; ``p99_health_ms``, the 99th
percentile of ``/health``'s latency (``max_health_ms`` its worst).

Last line: ``requests=N server_errors=N half_written=N p99_health_ms=MS``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from agentmem.testing.fuzz import Health, Target, half_written, in_flight, model_of, requests, served
from agentmem.testing.tiny_models import tiny_tokenizer
from store.engine import make_engine, open_store, resolve_url
from store.migrations import upgrade


def database(url: str | None, folder: Path) -> tuple[str, object]:
    """A migrated store's URL, and what to call when done (drop a Postgres database made for the run)."""
    if url is None or url.startswith("sqlite"):
        url = url or f"sqlite:///{folder / 'fuzz.db'}"
        upgrade(make_engine(url))
        return url, lambda: None
    import sqlalchemy as sa

    name = f"agentmem_fuzz_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(resolve_url(url), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    fresh = sa.engine.make_url(resolve_url(url)).set(database=name).render_as_string(hide_password=False)
    upgrade(make_engine(fresh))

    def drop() -> None:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()

    return fresh, drop


def fuzz(targets: list[Target], n: int, seed_value: int, gateway_share: float) -> float:
    """Send ``n`` generated requests; the seconds it took."""
    strategy = requests(_document(targets[0]), model_of(targets), len(tiny_tokenizer()))
    cut = int(round(gateway_share * 100)) if len(targets) > 1 else 0

    @seed(seed_value)
    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.integers(0, 99), strategy)
    def send(pick: int, request) -> None:
        target = targets[1] if pick < cut else targets[0]
        target.checker.send(request)

    start = time.monotonic()
    send()
    return time.monotonic() - start


def _document(target: Target) -> dict:
    return target.checker.client.get("/openapi.json").json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--db", default=None, help="sqlite:///FILE or a Postgres server URL (default: a new SQLite "
                                                   "file)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gateway-share", type=float, default=0.2)
    parser.add_argument("--smoke", action="store_true", help="60 requests")
    args = parser.parse_args()
    n = 60 if args.smoke else args.requests
    with tempfile.TemporaryDirectory() as tmp:
        url, drop = database(args.db, Path(tmp))
        store = open_store(url)
        try:
            with served(store, Path(tmp)) as targets, Health(targets[0].root) as health:
                seconds = fuzz(targets, n, args.seed, args.gateway_share)
            problems = half_written(store, [t.run_id for t in targets])
        finally:
            store.dispose()
            drop()  # type: ignore[operator]
    counts: Counter = Counter()
    for t in targets:
        for (route, status), k in t.checker.counts.items():
            counts[(t.name, route, status)] += k
    print(f"{'server':8} {'route':50} {'2xx':>6} {'4xx':>6} {'5xx':>6}")
    for name, route in sorted({(a, b) for a, b, _ in counts}):
        print(f"{name:8} {route:50} " + " ".join(f"{counts[(name, route, c)]:>6}" for c in ("2xx", "4xx", "5xx")))
    server_errors = sum(t.checker.server_errors for t in targets)
    miscounted = sum(t.checker.miscounted for t in targets)
    unnamed = sum(t.checker.refused_without_field for t in targets)
    db = "sqlite" if url.startswith("sqlite") else "postgres"
    for p in problems[:10]:
        print(f"half-written: {p}")
    for t in targets:
        for p in t.checker.problems:
            print(f"{t.name}: {p}")
    worst, during = in_flight(health, [t.checker for t in targets])
    print(f"slowest /health: {worst:.0f} ms, during {repr(during)[:300] if during else 'no request'}")
    print(f"db={db} seconds={seconds:.0f} requests/s={n / seconds:.1f} unnamed_4xx={unnamed} "
          f"health_failures={health.failures} max_health_ms={max(health.latencies_ms, default=0):.0f}")
    print(f"requests={n} server_errors={server_errors} half_written={len(problems) + miscounted} "
          f"p99_health_ms={health.percentile(0.99):.0f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Install, lint, check the import layering and the types, and run the test suite on SQLite and Postgres.
#   bash scripts/test.sh [PYTEST ARGS...]          # everything (CI)
#   bash scripts/test.sh --fast [PYTEST ARGS...]   # the inner loop: no slow, subprocess, postgres, browser or
#                                                  # bench_smoke tests (tests/README.md), no Postgres, no Chromium
# Postgres: uses $AGENTMEM_TEST_PG_URL when set; otherwise starts a throwaway server on 127.0.0.1
# (scripts/pg_throwaway.sh) for the run and stops it on exit. pytest prints the 25 slowest tests.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
if [ "${1:-}" = "--fast" ]; then fast=1; shift; fi
bash scripts/install.sh
if [ -n "${VIRTUAL_ENV:-}" ]; then venv=$VIRTUAL_ENV; else venv=.venv; fi
if [ "$fast" -eq 1 ]; then
  set -- -m "not slow and not subprocess and not postgres and not browser and not bench_smoke" "$@"
elif [ -z "${AGENTMEM_TEST_PG_URL:-}" ]; then
  pgroot=$(mktemp -d /tmp/agentmem-pg.XXXXXX); chmod 755 "$pgroot"
  port=$(( 50000 + RANDOM % 10000 ))
  AGENTMEM_TEST_PG_URL=$(bash scripts/pg_throwaway.sh start "$pgroot/data" "$port")
  export AGENTMEM_TEST_PG_URL
  trap 'bash scripts/pg_throwaway.sh stop "$pgroot/data"; rm -rf "$pgroot"' EXIT
fi
if [ "$fast" -eq 0 ]; then
  echo "postgres for tests: $AGENTMEM_TEST_PG_URL"
  # The viewer's browser tests drive headless Chromium; without it (no root, no apt) they skip with the reason.
  command -v chromium >/dev/null 2>&1 || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) \
    >/dev/null 2>&1 || echo "chromium could not be installed: tests/agentmem/view/test_view_browser.py will skip"
fi
"$venv/bin/ruff" check .
"$venv/bin/lint-imports"
"$venv/bin/mypy"  # the packages [tool.mypy] in pyproject.toml lists
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
set +e
"$venv/bin/pytest" -q --durations=25 "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi
exit "$rc"

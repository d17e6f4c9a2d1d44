#!/usr/bin/env bash
# Start or stop a throwaway PostgreSQL server on 127.0.0.1 for tests and benchmarks.
#   scripts/pg_throwaway.sh start DIR [PORT]   -> prints the server URL on stdout
#   scripts/pg_throwaway.sh stop DIR
# Uses the server binaries of the machine image (/usr/lib/postgresql/*/bin); installs Debian's
# postgresql package when they are missing. Runs the server as the `postgres` user, trust auth.
set -euo pipefail
cmd=${1:?start|stop}; dir=${2:?data directory}; port=${3:-55432}
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
  echo "postgres server binaries missing: installing Debian's postgresql" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >&2
  bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
fi
id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "$*"; else sh -c "$*"; fi; }
case "$cmd" in
  start)
    mkdir -p "$dir"; chown postgres "$dir" 2>/dev/null || true; chmod 700 "$dir"
    if [ ! -f "$dir/PG_VERSION" ]; then
      as_pg "'$bindir/initdb' -D '$dir' -U postgres --auth=trust -E UTF8 --no-sync" >&2
    fi
    as_pg "'$bindir/pg_ctl' -D '$dir' -l '$dir/server.log' -w -o \"-h 127.0.0.1 -p $port -k /tmp -F\" start" >&2
    echo "postgresql://postgres@127.0.0.1:$port/postgres"
    ;;
  stop)
    [ -f "$dir/postmaster.pid" ] && as_pg "'$bindir/pg_ctl' -D '$dir' -m fast -w stop" >&2 || true
    ;;
  *) echo "usage: $0 start|stop DIR [PORT]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Stops what infra/up.sh started (and only that: the processes named by its pid files), gracefully first so
# Kafka writes a clean shutdown marker, then by force after a grace period.
set -euo pipefail
cd "$(dirname "$0")/.."
source infra/env.sh
run="$RLSTREAM_INFRA_DIR/run"

stop() {
  local name=$1 file="$run/$1.pid" pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.25
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "down: $name did not stop in 15s; killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$file"
}

# Stopped in parallel: Kafka's controlled shutdown takes a few seconds and the others need not wait for it.
stop registry &
stop clickhouse &
stop kafka &
wait

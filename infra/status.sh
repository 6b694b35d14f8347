#!/usr/bin/env bash
# One line per service, tab-separated: name, up|down, address, pid (when infra/up.sh started it).
# Exit status 0 when every service answers.
set -uo pipefail
cd "$(dirname "$0")/.."
source infra/env.sh
run="$RLSTREAM_INFRA_DIR/run"

pid_of() { [ -f "$run/$1.pid" ] && kill -0 "$(cat "$run/$1.pid")" 2>/dev/null && cat "$run/$1.pid"; }
kafka_ready() { kcat -L -b "$KAFKA_BROKERS" -m 2 >/dev/null 2>&1; }
clickhouse_ready() { [ "$(curl -sf --max-time 2 "$CLICKHOUSE_URL/ping" 2>/dev/null)" = "Ok." ]; }
registry_ready() { curl -sf --max-time 2 "$SCHEMA_REGISTRY_URL/subjects" >/dev/null 2>&1; }

all=0
line() {
  local name=$1 address=$2 state=down
  if "${name}_ready"; then state=up; else all=1; fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$state" "$address" "$(pid_of "$name" || true)"
}
# The version actually running (from the started process's class path) can differ from KAFKA_VERSION.
running=$(pid=$(pid_of kafka) && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -o 'kafka/[^/]*/libs' | head -n1 | cut -d/ -f2)
line kafka "$KAFKA_BROKERS (Kafka ${running:-$KAFKA_VERSION})"
line clickhouse "$CLICKHOUSE_URL"
line registry "$SCHEMA_REGISTRY_URL (Apicurio $APICURIO_VERSION)"
exit $all

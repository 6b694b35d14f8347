#!/usr/bin/env bash
# Starts Kafka (KRaft, single node), ClickHouse and the schema registry (Apicurio) as plain processes and waits
# until each answers: Kafka a metadata request, ClickHouse /ping, the registry GET /subjects. Idempotent: a
# service that already answers on its address is left alone. Pid files in .infra/run, logs in .infra/logs.
# Run infra/setup.sh first (test/run.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
source infra/env.sh
D="$RLSTREAM_INFRA_DIR"
mkdir -p "$D/run" "$D/logs"
here=$(pwd)

say() { echo "up: $*" >&2; }
broker_host=${KAFKA_BROKERS%%,*}
broker_port=${broker_host##*:}
broker_host=${broker_host%:*}

kafka_ready() {
  if command -v kcat >/dev/null; then
    kcat -L -b "$KAFKA_BROKERS" -m 2 >/dev/null 2>&1
  else
    (exec 3<>"/dev/tcp/$broker_host/$broker_port") 2>/dev/null
  fi
}
clickhouse_ready() { [ "$(curl -sf --max-time 2 "$CLICKHOUSE_URL/ping" 2>/dev/null)" = "Ok." ]; }
registry_ready() { curl -sf --max-time 2 "$SCHEMA_REGISTRY_URL/subjects" >/dev/null 2>&1; }

# Starts a command detached from this shell (its own session, so Ctrl-C here does not stop it).
spawn() {
  local name=$1
  shift
  setsid nohup "$@" >"$D/logs/$name.out" 2>&1 </dev/null &
  echo $! >"$D/run/$name.pid"
}

start_kafka() {
  local libs="$D/kafka/$KAFKA_VERSION/libs" data="$D/kafka/data-$KAFKA_VERSION"
  [ -f "$libs/.complete" ] || { say "Kafka $KAFKA_VERSION is not installed: run infra/setup.sh"; return 1; }
  mkdir -p "$data"
  sed "s#@DATA@#$data#g" infra/kafka/server.properties >"$data/server.properties"
  local java=(java -Xms128m -Xmx512m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true
    -Dlog4j2.configurationFile="$here/infra/kafka/log4j2.properties" -Dkafka.logs.dir="$D/logs" -cp "$libs/*")
  if [ ! -f "$data/log/meta.properties" ]; then
    : >"$D/logs/kafka-format.out"
    # A cluster id is 16 random bytes in URL-safe base64 without padding (what `StorageTool random-uuid` prints,
    # without starting a JVM for it).
    local cluster
    cluster=$(head -c16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
    "${java[@]}" kafka.tools.StorageTool format -t "$cluster" -c "$data/server.properties" >>"$D/logs/kafka-format.out" 2>&1 ||
      { say "Kafka storage format failed: see $D/logs/kafka-format.out"; return 1; }
  fi
  spawn kafka "${java[@]}" kafka.Kafka "$data/server.properties"
}

start_clickhouse() {
  local dir="$D/clickhouse"
  mkdir -p "$dir/log" "$dir/data" "$dir/tmp" "$dir/user_files" "$dir/format_schemas"
  sed "s#@DIR@#$dir#g" infra/clickhouse/config.xml >"$dir/config.xml"
  cp infra/clickhouse/users.xml "$dir/users.xml"
  spawn clickhouse clickhouse-server --config-file="$dir/config.xml"
}

start_registry() {
  local port=${SCHEMA_REGISTRY_URL#*://}
  port=${port%%/*}
  port=${port##*:}
  [ -f "$D/registry/$APICURIO_VERSION/.complete" ] || { say "Apicurio $APICURIO_VERSION is not installed: run infra/setup.sh"; return 1; }
  # Storage in a database file beside the install (setup.sh replaces the install, not the data): schema ids
  # must stay valid for as long as Kafka keeps the records framed with them.
  spawn registry infra/registry/run.sh "$port" "$D/registry/data-$APICURIO_VERSION"
}

# wait_for NAME CHECK SECONDS: polls CHECK; fails early when the process we started has died.
wait_for() {
  local name=$1 check=$2 limit=$3 t0=$SECONDS
  while ! $check; do
    if [ -f "$D/run/$name.pid" ] && ! kill -0 "$(cat "$D/run/$name.pid")" 2>/dev/null; then
      say "$name exited during start-up; last lines of $D/logs/$name.out:"
      tail -n 20 "$D/logs/$name.out" >&2
      rm -f "$D/run/$name.pid"
      return 1
    fi
    if [ $((SECONDS - t0)) -ge "$limit" ]; then
      say "$name not ready after ${limit}s; see $D/logs/$name.out"
      return 1
    fi
    sleep 0.5
  done
}

t0=$SECONDS
todo=()
status=0
if kafka_ready && [ -f "$D/run/kafka.pid" ]; then
  running=$(tr '\0' ' ' <"/proc/$(cat "$D/run/kafka.pid")/cmdline" 2>/dev/null | grep -o 'kafka/[^/]*/libs' | head -n1 | cut -d/ -f2 || true)
  if [ -n "$running" ] && [ "$running" != "$KAFKA_VERSION" ]; then
    say "Kafka $running is running, not KAFKA_VERSION=$KAFKA_VERSION: run infra/down.sh first to switch"
  fi
fi
if ! kafka_ready; then if start_kafka; then todo+=(kafka); else status=1; fi; fi
if ! clickhouse_ready; then if start_clickhouse; then todo+=(clickhouse); else status=1; fi; fi
if ! registry_ready; then if start_registry; then todo+=(registry); else status=1; fi; fi

for name in "${todo[@]}"; do
  wait_for "$name" "${name}_ready" 90 || status=1
done
if [ ${#todo[@]} -gt 0 ] && [ $status = 0 ]; then say "started ${todo[*]} in $((SECONDS - t0))s"; fi
exit $status

#!/usr/bin/env bash
# Runs Apicurio Registry in the foreground: `infra/registry/run.sh <port> <data dir>` serves the Confluent API at
# http://127.0.0.1:<port>/apis/ccompat/v7, its storage an H2 database file in <data dir>. The storage must
# outlive the process: the log keeps records framed with schema ids, and a registry that forgot them (its
# default is an in-memory database) would hand the same ids to other schemas after a restart. WRITE_DELAY=0
# writes each registration through at its commit, so a killed registry keeps every id it answered with.
# infra/up.sh starts it this way; tests start private ones.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 <port> <data dir>" >&2; exit 2; }
port=$1
data=$2
source "$(dirname "$0")/../env.sh"
reg="$RLSTREAM_INFRA_DIR/registry/$APICURIO_VERSION"
[ -f "$reg/.complete" ] || { echo "Apicurio $APICURIO_VERSION is not installed: run infra/setup.sh" >&2; exit 1; }
jar=$(ls "$reg"/*-runner.jar "$reg"/quarkus-run.jar 2>/dev/null | head -n1 || true)
mkdir -p "$data"
export REGISTRY_DATASOURCE_URL="jdbc:h2:file:$(cd "$data" && pwd)/registry;WRITE_DELAY=0"
exec java -Xms64m -Xmx384m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
  -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$port" -Dquarkus.log.level=WARN \
  -Dquarkus.http.access-log.enabled=false -jar "$jar"

#!/usr/bin/env bash
# The whole test suite, as CI and a new user run it: installs what is missing (npm packages, the native
# build, Kafka, ClickHouse, the schema registry, chromium), starts the services, runs every test, and stops
# what it started even when a test fails.
set -euo pipefail
cd "$(dirname "$0")/.."

bash infra/setup.sh            # npm ci, native build, system packages: idempotent and cached
source infra/env.sh            # service addresses (KAFKA_BROKERS, CLICKHOUSE_URL, SCHEMA_REGISTRY_URL)
export RLSTREAM_REQUIRE_SERVICES=1   # a test needing a service fails instead of skipping

trap 'bash infra/down.sh || true' EXIT
bash infra/up.sh

npx tsx schemas/codegen.ts --check
npx tsc -p tsconfig.json --noEmit
npx eslint .

mapfile -t files < <(find test -name '*.test.ts' | sort)
node --import tsx --test --test-concurrency=1 --test-timeout=600000 "${files[@]}"

#!/usr/bin/env bash
# The whole test suite, as CI and a new user run it: installs what is missing (npm packages, the native
# build, Kafka, ClickHouse, the schema registry, chromium), starts the services, runs every test, and stops
# what it started even when a test fails.
set -euo pipefail
cd "$(dirname "$0")/.."

bash infra/setup.sh            # npm ci, native build, system packages: idempotent and cached
source infra/env.sh            # service addresses (KAFKA_BROKERS, CLICKHOUSE_URL, SCHEMA_REGISTRY_URL)
export RLSTREAM_REQUIRE_SERVICES=1   # a test needing a service fails instead of skipping

# The tests' temporary files (mkdtemp under os.tmpdir(), roles' logs, browser profiles) go under one directory:
# removed after a passing run so that repeated runs do not fill /tmp, kept after a failing one for the post-mortem.
tests_tmp=$(mktemp -d "${TMPDIR:-/tmp}/rlstream-tests-XXXXXX")
trap 'rc=$?; bash infra/down.sh || true; if [ "$rc" -eq 0 ]; then rm -rf "$tests_tmp"; else echo "test/run.sh: the tests temporary files are kept in $tests_tmp" >&2; fi' EXIT
bash infra/up.sh
export TMPDIR=$tests_tmp

npx tsx schemas/codegen.ts --check
# The typecheck and the lint side by side (one core each); either failing fails the run.
npx tsc -p tsconfig.json --noEmit &
tsc_pid=$!
lint=0
npx eslint . || lint=$?
wait "$tsc_pid"
[ "$lint" -eq 0 ] || exit "$lint"

# Two files at a time, then the ones test/serial.txt names: its two lanes side by side, each one file at a time
# (it says why). A lane's report goes to a file and is printed when both lanes are done, so they do not interleave.
mapfile -t listed < <(grep -v '^#' test/serial.txt | grep .)
serial=() services_lane=() embedded_lane=() lane=services
for f in "${listed[@]}"; do
  if [ "$f" = '[embedded]' ]; then lane=embedded; continue; fi
  [ -f "$f" ] || { echo "test/serial.txt names $f, which does not exist" >&2; exit 1; }
  serial+=("$f")
  if [ "$lane" = services ]; then services_lane+=("$f"); else embedded_lane+=("$f"); fi
done
mapfile -t parallel < <(find test -name '*.test.ts' | sort | grep -vxF -f <(printf '%s\n' "${serial[@]}"))
# Each part's report ends with its seconds per file (test/file-times.mjs).
report=(--test-reporter=tap --test-reporter-destination=stdout --test-reporter=./test/file-times.mjs --test-reporter-destination=stdout)
status=0
node --import tsx --test --test-concurrency=2 --test-timeout=600000 "${report[@]}" "${parallel[@]}" || status=$?
lane_pids=()
for lane in services embedded; do
  declare -n files="${lane}_lane"
  node --import tsx --test --test-concurrency=1 --test-timeout=600000 "${report[@]}" "${files[@]}" >"$tests_tmp/lane-$lane.tap" 2>&1 &
  lane_pids+=($!)
  unset -n files
done
for i in 0 1; do wait "${lane_pids[$i]}" || status=$?; done
for lane in services embedded; do echo "# serial lane: $lane"; cat "$tests_tmp/lane-$lane.tap"; done
exit "$status"

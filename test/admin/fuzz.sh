#!/usr/bin/env bash
# Fuzzes the admin API with schemathesis against its own /openapi.json, three times: with a read token, with a
# control token and with none. Passes when no answer is a server error and every answer matches the declared
# status codes, content type and response schema (and unknown methods are 405). Bounded: FUZZ_EXAMPLES test
# cases per operation and phase (default 25), about a minute a pass on a 2-core machine.
# schemathesis comes from .infra/schemathesis (infra/setup.sh installs it there) or PATH; exit 3 without it.
# Usage: test/admin/fuzz.sh [extra schemathesis run options]
set -euo pipefail
cd "$(dirname "$0")/../.."
st="${RLSTREAM_INFRA_DIR:-.infra}/schemathesis/bin/schemathesis"
if [ ! -x "$st" ]; then st=$(command -v schemathesis || true); fi
if [ -z "$st" ]; then
  echo "fuzz: schemathesis not found; run infra/setup.sh (or pip install schemathesis)" >&2
  exit 3
fi

export FUZZ_READ_TOKEN="fuzz-read-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
export FUZZ_CONTROL_TOKEN="fuzz-control-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
out=$(mktemp -d)
node --import tsx test/admin/fuzz-server.ts >"$out/server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$out"' EXIT
url=
for _ in $(seq 1 600); do
  url=$(sed -n 's/^listening \([^ ]*\).*/\1/p' "$out/server.log")
  [ -n "$url" ] && break
  kill -0 $server 2>/dev/null || { cat "$out/server.log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { echo "fuzz: the admin server did not start" >&2; cat "$out/server.log" >&2; exit 1; }

status=0
for who in read control none; do
  case $who in
    read) auth=(-H "Authorization: Bearer $FUZZ_READ_TOKEN") ;;
    control) auth=(-H "Authorization: Bearer $FUZZ_CONTROL_TOKEN") ;;
    none) auth=() ;;
  esac
  echo "fuzz: $who token against $url/openapi.json" >&2
  if ! "$st" run "$url/openapi.json" "${auth[@]}" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,unsupported_method \
    --phases examples,coverage,fuzzing --max-examples "${FUZZ_EXAMPLES:-25}" --seed "${FUZZ_SEED:-1}" \
    --workers 2 --request-timeout 20 --no-color --output-truncate true "$@"; then
    status=1
  fi
done
exit $status

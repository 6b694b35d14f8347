# Addresses of the services that infra/up.sh starts (sourced by test/run.sh and by developers).
export RLSTREAM_INFRA_DIR="${RLSTREAM_INFRA_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.infra}"
export KAFKA_BROKERS="${KAFKA_BROKERS:-127.0.0.1:19092}"
export CLICKHOUSE_URL="${CLICKHOUSE_URL:-http://127.0.0.1:18123}"
export SCHEMA_REGISTRY_URL="${SCHEMA_REGISTRY_URL:-http://127.0.0.1:18081/apis/ccompat/v7}"

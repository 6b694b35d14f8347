#!/usr/bin/env bash
# Starts Kafka, ClickHouse and the schema registry (see infra/README.md).
set -euo pipefail

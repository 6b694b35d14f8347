// Addresses of the services the Kafka-side tests need, from the environment infra/env.sh sets. Without one,
// a test file registers a single skipped test saying why, or a failing one under RLSTREAM_REQUIRE_SERVICES=1
// (as `npm test` runs), so a missing service never passes silently.
import { test } from 'node:test';
import { silentLogger } from '../../core/telemetry.ts';
import { openKafkaLog } from '../../core/log/kafka/index.ts';
import { loadRdKafka } from '../../core/log/kafka/librdkafka/binding.ts';
import { KAFKA_CLIENTS, type KafkaClient } from '../../core/log/kafka/options.ts';
import type { EventLog } from '../../core/log/types.ts';

export function service(variable: 'KAFKA_BROKERS' | 'SCHEMA_REGISTRY_URL' | 'CLICKHOUSE_URL', what: string): string | null {
  const value = process.env[variable];
  if (value) return value;
  const why = `${variable} is not set: start the services with infra/up.sh and source infra/env.sh to run ${what}`;
  if (process.env['RLSTREAM_REQUIRE_SERVICES'] === '1') {
    test(what, () => {
      throw new Error(`${why} (RLSTREAM_REQUIRE_SERVICES=1)`);
    });
  } else {
    test(what, { skip: why }, () => {});
  }
  return null;
}

export function brokerList(value: string): string[] {
  return value.split(',').map((b) => b.trim()).filter((b) => b !== '');
}

/**
 * The Kafka clients a test runs on: both, librdkafka once infra/setup.sh has built it. Without the build, a
 * test named `what (librdkafka)` is skipped saying how to build it, or fails under RLSTREAM_REQUIRE_SERVICES=1.
 */
export function kafkaClients(what: string): KafkaClient[] {
  try {
    loadRdKafka();
    return [...KAFKA_CLIENTS];
  } catch (err) {
    const why = (err as Error).message;
    if (process.env['RLSTREAM_REQUIRE_SERVICES'] === '1') {
      test(`${what} (librdkafka)`, () => {
        throw new Error(`${why} (RLSTREAM_REQUIRE_SERVICES=1)`);
      });
    } else test(`${what} (librdkafka)`, { skip: why }, () => {});
    return KAFKA_CLIENTS.filter((c) => c !== 'librdkafka');
  }
}

export async function openTestKafkaLog(brokers: string, client: KafkaClient = 'kafkajs'): Promise<EventLog> {
  return openKafkaLog({ brokers: brokerList(brokers), client, clientId: 'rlstream-test', sessionTimeoutMs: 6000, heartbeatIntervalMs: 500 }, silentLogger);
}

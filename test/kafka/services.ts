// Addresses of the services the Kafka-side tests need, from the environment infra/env.sh sets. Without one,
// a test file registers a single skipped test saying why, or a failing one under RLSTREAM_REQUIRE_SERVICES=1
// (as `npm test` runs), so a missing service never passes silently.
import { test } from 'node:test';
import { silentLogger } from '../../core/telemetry.ts';
import { openKafkaLog } from '../../core/log/kafka/index.ts';
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

export async function openTestKafkaLog(brokers: string): Promise<EventLog> {
  return openKafkaLog({ brokers: brokerList(brokers), clientId: 'rlstream-test', sessionTimeoutMs: 6000, heartbeatIntervalMs: 500 }, silentLogger);
}

// Opens the event log the configuration names: the embedded file-backed log or Kafka. Callers depend only on
// EventLog; the Kafka client is loaded on demand so the embedded shape never loads kafkajs.
import type { Logger } from '../telemetry.ts';
import { silentLogger } from '../telemetry.ts';
import { RlstreamError } from '../errors.ts';
import type { EventLog } from './types.ts';
import type { EmbeddedLogOptions } from './embedded/index.ts';

export interface EmbeddedLogConfig extends EmbeddedLogOptions {
  kind: 'embedded';
}

/** Kafka options are defined by core/log/kafka/index.ts; only the kind is fixed here. */
export interface KafkaLogConfig {
  kind: 'kafka';
  brokers: string[];
  clientId?: string;
  [option: string]: unknown;
}

export type LogConfig = EmbeddedLogConfig | KafkaLogConfig;

export async function openLog(config: LogConfig, logger: Logger = silentLogger): Promise<EventLog> {
  switch (config.kind) {
    case 'embedded': {
      const { openEmbeddedLog } = await import('./embedded/index.ts');
      const { kind: _kind, ...options } = config;
      return openEmbeddedLog(options, logger);
    }
    case 'kafka': {
      // ---- Kafka branch: implemented by core/log/kafka/index.ts (owned by the Kafka side). ----
      // A computed specifier, so this file type-checks before (and without) the Kafka module.
      const kafkaModule = './kafka/index.ts';
      const kafka = (await import(kafkaModule)) as { openKafkaLog(config: KafkaLogConfig, logger: Logger): Promise<EventLog> };
      return kafka.openKafkaLog(config, logger);
    }
    default:
      throw new RlstreamError('CONFIG_INVALID', `log kind must be 'embedded' or 'kafka', got ${JSON.stringify((config as { kind?: unknown }).kind)}`);
  }
}

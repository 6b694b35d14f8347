// Opens the event log the configuration names: the embedded file-backed log or Kafka. Callers depend only on
// EventLog; the Kafka client is loaded on demand so the embedded shape never loads kafkajs.
import type { Logger } from '../telemetry.ts';
import { silentLogger } from '../telemetry.ts';
import { RlstreamError } from '../errors.ts';
import { objectShape, Registry } from '../config/registry.ts';
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

export interface EventLogPlugin {
  open(config: LogConfig, logger: Logger): Promise<EventLog>;
}

/** Event logs by `log.kind`; another implementation registers itself with `eventLogs.register(kind, plugin)`. */
export const eventLogs = new Registry<EventLogPlugin>('event log', objectShape('an event log plug-in ({ open(config, logger) })', ['open']));

eventLogs.register('embedded', {
  async open(config, logger) {
    if (config.kind !== 'embedded') throw new RlstreamError('INTERNAL', `embedded log opened with kind ${config.kind}`);
    const { openEmbeddedLog } = await import('./embedded/index.ts');
    const { kind: _kind, ...options } = config;
    return openEmbeddedLog(options, logger);
  },
});

eventLogs.register('kafka', {
  async open(config, logger) {
    if (config.kind !== 'kafka') throw new RlstreamError('INTERNAL', `Kafka log opened with kind ${config.kind}`);
    // A computed specifier, so the embedded shape never loads kafkajs.
    const kafkaModule = './kafka/index.ts';
    const kafka = (await import(kafkaModule)) as { openKafkaLog(config: KafkaLogConfig, logger: Logger): Promise<EventLog> };
    return kafka.openKafkaLog(config, logger);
  },
});

export async function openLog(config: LogConfig, logger: Logger = silentLogger): Promise<EventLog> {
  return eventLogs.get(String((config as { kind?: unknown }).kind), 'log.kind').open(config, logger);
}

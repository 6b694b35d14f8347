// The registry that goes with a log: the embedded log describes itself (_schemas topic); a Kafka log uses
// a Confluent-compatible registry over HTTP (url given, or SCHEMA_REGISTRY_URL).
import { RlstreamError } from '../errors.ts';
import type { EventLog } from '../log/types.ts';
import type { Logger } from '../telemetry.ts';
import { silentLogger } from '../telemetry.ts';
import { EmbeddedRegistry } from './embedded-registry.ts';
import type { SchemaRegistry } from './registry.ts';

export async function openRegistryFor(log: EventLog, options: { url?: string | null; logger?: Logger } = {}): Promise<SchemaRegistry> {
  const url = options.url ?? process.env['SCHEMA_REGISTRY_URL'] ?? null;
  // Imported here: the HTTP client is a third of a second of start-up an embedded run does not need.
  if (url) return new (await import('./http-registry.ts')).HttpSchemaRegistry({ url });
  if (log.kind === 'embedded') return EmbeddedRegistry.open(log, options.logger ?? silentLogger);
  throw new RlstreamError('CONFIG_INVALID', 'a Kafka log needs a schema registry: set registry.url (kind http) or SCHEMA_REGISTRY_URL');
}

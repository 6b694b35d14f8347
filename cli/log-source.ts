// A log to read a run from, as the commands that read a finished (or running) run take it: an embedded log (a run
// directory or its log/) or Kafka brokers (kafka://host:port[,host:port]), with its schema registry.
import { isRlstreamError } from '../core/errors.ts';
import { openLog } from '../core/log/open.ts';
import type { EventLog } from '../core/log/types.ts';
import { EmbeddedRegistry } from '../core/serde/embedded-registry.ts';
import { EventSerde } from '../core/serde/events.ts';
import { openRegistryFor } from '../core/serde/open.ts';
import type { SchemaRegistry } from '../core/serde/registry.ts';
import { jsonLogger } from '../core/telemetry.ts';
import { resolveEmbeddedLog } from './run-dir.ts';

export interface Opened {
  log: EventLog;
  registry: SchemaRegistry;
  close(): Promise<void>;
}

/**
 * A log and its schema registry: embedded (registry in `_schemas`) or Kafka (registry at SCHEMA_REGISTRY_URL).
 * `readOnly`: the caller writes nothing into this log (see the embedded branch).
 */
export async function openSource(spec: string, readOnly = false, source = true, role = 'replay'): Promise<Opened> {
  if (spec.startsWith('kafka://')) {
    const brokers = spec.slice('kafka://'.length).split(',').filter(Boolean);
    const log = await openLog({ kind: 'kafka', brokers });
    const registry = await openRegistryFor(log).catch(async (err: unknown) => {
      await log.close();
      throw err;
    });
    return { log, registry, close: async () => (await registry.close(), await log.close()) };
  }
  // A source must exist, and a run directory stands for its log/ (opening it as a log would create an empty
  // one there and replay nothing); a destination log may be created.
  const dir = source ? resolveEmbeddedLog(spec, undefined).log : spec;
  // Warnings to stderr: damage the open finds and gaps the readers skip must not pass silently.
  const logger = jsonLogger({ level: 'warn', fields: { role } });
  if (readOnly) {
    // Opened read-only when nothing is written into it: damage is read around and reported rather than
    // rewritten, and a running job's log needs no lock. Unless this version's schemas are not all registered
    // in it yet (registering writes): then it is opened as a writer.
    const log = await openLog({ kind: 'embedded', dir, readOnly: true }, logger);
    let registry: EmbeddedRegistry | null = null;
    try {
      const r = (registry = await EmbeddedRegistry.open(log));
      await new EventSerde(r).init();
      return { log, registry: r, close: async () => (await r.close(), await log.close()) };
    } catch (err) {
      await registry?.close();
      await log.close();
      if (!isRlstreamError(err, 'LOG_READ_ONLY')) throw err;
    }
  }
  const log = await openLog({ kind: 'embedded', dir }, logger);
  const registry = await EmbeddedRegistry.open(log);
  return { log, registry, close: async () => (await registry.close(), await log.close()) };
}


// Opens what every role of a run shares, from the run config: the event log, the schema registry and
// serde, and the trace store. Used by the main job (all roles in one process) and `rlstream worker`.
import type { RunConfig } from '../../core/config.ts';
import { openLog } from '../../core/log/open.ts';
import type { EventLog } from '../../core/log/types.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import type { SchemaRegistry } from '../../core/serde/registry.ts';
import type { Logger } from '../../core/telemetry.ts';
import { openTraceStore } from '../../core/traces/open.ts';
import type { TraceStore } from '../../core/traces/store.ts';

export interface RunContext {
  config: RunConfig;
  log: EventLog;
  registry: SchemaRegistry;
  serde: EventSerde;
  logger: Logger;
  close(): Promise<void>;
}

export async function openRunContext(config: RunConfig, logger: Logger): Promise<RunContext> {
  const lc = config.log;
  const log = await openLog(
    lc.kind === 'embedded'
      ? { kind: 'embedded', dir: lc.dir }
      : { kind: 'kafka', brokers: lc.brokers, clientId: lc.clientId, ssl: lc.ssl, ...(lc.sasl ? { sasl: lc.sasl } : {}) },
    logger.child({ component: 'log' }),
  );
  let registry: SchemaRegistry;
  if (config.registry.kind === 'http') {
    const { HttpRegistry } = await import('../../core/serde/http-registry.ts');
    registry = new HttpRegistry({ url: config.registry.url });
  } else registry = await EmbeddedRegistry.open(log, logger.child({ component: 'registry' }));
  const serde = await new EventSerde(registry).init();
  return {
    config,
    log,
    registry,
    serde,
    logger,
    close: async () => {
      await registry.close();
      await log.close();
    },
  };
}

/** The run's trace store, or null when traces are off. One chDB directory per process. */
export async function openRunTraces(config: RunConfig): Promise<TraceStore | null> {
  const t = config.traces;
  if (t.kind === 'none') return null;
  if (t.kind === 'chdb') return openTraceStore(`chdb:${t.dir}`);
  return openTraceStore(`${t.url}#${t.database}`);
}

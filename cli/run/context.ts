// Opens what every role of a run shares, from the run config: the event log, the schema registry and
// serde, and the trace store. Used by the main job (all roles in one process) and `rlstream worker`.
import type { RunConfig, TopicRetentionConfig } from '../config/run-config.ts';
import { sendDamageDeadLetters } from '../../core/log/embedded/damage-letters.ts';
import { openLog } from '../../core/log/open.ts';
import type { EventLog } from '../../core/log/types.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { openRegistryFor } from '../../core/serde/open.ts';
import { EventSerde } from '../../core/serde/events.ts';
import type { SchemaRegistry } from '../../core/serde/registry.ts';
import type { Logger } from '../../core/telemetry.ts';
import { openTraceStore } from '../../core/traces/open.ts';
import type { TraceStore } from '../../core/traces/store.ts';
import { applyTraceTtl } from '../../core/traces/ttl.ts';
import { TOPICS } from '../../core/topics.ts';
import { resolvePlugins, type RunPlugins } from './plugins.ts';

export interface RunContext {
  config: RunConfig;
  /** The task, reward function and agent loops the config names, resolved before anything opens. */
  plugins: RunPlugins;
  log: EventLog;
  registry: SchemaRegistry;
  serde: EventSerde;
  logger: Logger;
  close(): Promise<void>;
}

export async function openRunContext(config: RunConfig, logger: Logger): Promise<RunContext> {
  const plugins = await resolvePlugins(config);
  const lc = config.log;
  const log = await openLog(
    lc.kind === 'embedded'
      ? { kind: 'embedded', dir: lc.dir }
      : {
          kind: 'kafka',
          brokers: lc.brokers,
          client: lc.client,
          clientId: lc.clientId,
          clientLogLevel: lc.clientLogLevel,
          ...(lc.clientDebug !== null ? { clientDebug: lc.clientDebug } : {}),
          ssl: lc.ssl,
          ...(lc.sasl ? { sasl: lc.sasl } : {}),
        },
    logger.child({ component: 'log' }),
  );
  const registry: SchemaRegistry =
    config.registry.kind === 'http'
      ? await openRegistryFor(log, { url: config.registry.url })
      : await EmbeddedRegistry.open(log, logger.child({ component: 'registry' }));
  const serde = await new EventSerde(registry).init();
  await ensureTopics(log, lc.retention);
  // Damage the embedded log quarantined on open goes to the dead-letter topic (ensured just above).
  await sendDamageDeadLetters(log, serde);
  return {
    config,
    plugins,
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

/** Rollout-side topics are keyed by group_id and partitioned for parallel consumers; the rest are small. */
const TOPIC_PARTITIONS: Record<string, number> = {
  [TOPICS.rolloutEvents]: 4,
  [TOPICS.rewarded]: 4,
  [TOPICS.advantaged]: 4,
  [TOPICS.policyVersions]: 1,
  [TOPICS.trainSteps]: 1,
  [TOPICS.control]: 1,
  [TOPICS.deadLetter]: 1,
};

/** The topics that hold the run's records and take log.retention_*; the small ones keep everything. */
const RETAINED_TOPICS: ReadonlySet<string> = new Set([TOPICS.rolloutEvents, TOPICS.rewarded, TOPICS.advantaged]);

/**
 * Create every topic of the contract (idempotent), so no role depends on another having started first. The
 * retention is set when a topic is created; an existing topic keeps its own.
 */
export async function ensureTopics(log: EventLog, retention?: TopicRetentionConfig): Promise<void> {
  for (const [name, partitions] of Object.entries(TOPIC_PARTITIONS)) {
    await log.createTopic({ name, partitions, ...(retention && RETAINED_TOPICS.has(name) ? { retention: { maxBytes: retention.maxBytes, maxAgeMs: retention.maxAgeMs } } : {}) });
  }
}

/** The run's trace store, or null when traces are off. One chDB directory per process. */
export async function openRunTraces(config: RunConfig): Promise<TraceStore | null> {
  const t = config.traces;
  if (t.kind === 'none') return null;
  if (t.kind === 'chdb') {
    const store = await openTraceStore(`chdb:${t.dir}`);
    await applyTraceTtl(store, 'rlstream', t.ttlDays);
    return store;
  }
  const reader = t.readerUsername === '' ? {} : { reader: { username: t.readerUsername, password: t.readerPassword } };
  return openTraceStore(`${t.url}#${t.database}`, { ...(t.username === '' ? {} : { username: t.username }), ...(t.password === '' ? {} : { password: t.password }), ...reader });
}

// Serves the admin API for an open log (and trace store): builds the AdminContext the routes need and
// starts the server. Used by `rlstream admin` and by the main job, which serves it beside its run (an
// embedded log is locked by the process that runs it, so the run itself must serve the dashboard).
import { randomBytes } from 'node:crypto';
import { collectDefaultMetrics, Registry } from 'prom-client';
import { registerLogDamageMetrics } from '../core/log/embedded/damage-metrics.ts';
import type { EventLog } from '../core/log/types.ts';
import type { EventSerde } from '../core/serde/events.ts';
import type { Logger } from '../core/telemetry.ts';
import type { TraceStore } from '../core/traces/store.ts';
import { envTokens, type TokenSpec } from '../core/auth/tokens.ts';
import { controlPublisher } from './control.ts';
import { LogReplayManager } from './replay-manager.ts';
import { MemoryRunRegistry } from './run-registry.ts';
import { startAdminServer } from './server.ts';
import { adminTraceStore, type TokenTexts } from './traces-adapter.ts';

export interface ServeAdminOptions {
  log: EventLog;
  serde: EventSerde;
  store: TraceStore | null;
  logger: Logger;
  runs?: MemoryRunRegistry;
  host?: string;
  port?: number;
  corsOrigins?: string[];
  /** Tokens besides those of RLSTREAM_ADMIN_TOKENS(_FILE) (`rlstream admin --token-file`). */
  tokens?: TokenSpec[];
  /** Token texts for the trajectory view (from the run's tokenizer); without it the dashboard shows ids. */
  tokenTexts?: TokenTexts;
}

export interface ServedAdmin {
  url: string;
  /** A control token generated for this process when RLSTREAM_ADMIN_TOKENS is unset (shown once, never logged). */
  generatedToken: string | null;
  runs: MemoryRunRegistry;
  close(): Promise<void>;
}

export async function serveAdmin(o: ServeAdminOptions): Promise<ServedAdmin> {
  const metrics = new Registry();
  collectDefaultMetrics({ register: metrics });
  registerLogDamageMetrics(metrics, o.log);
  const publisher = controlPublisher(o.log, o.serde);
  let tokens: TokenSpec[] = [];
  let generatedToken: string | null = null;
  // Read (and removed from the environment) here; the server gets the tokens, not the variable.
  const fromEnv = [...(o.tokens ?? []), ...envTokens()];
  if (fromEnv.length === 0) {
    generatedToken = randomBytes(24).toString('base64url');
    tokens = [{ token: generatedToken, role: 'control', name: 'generated' }];
  }
  const runs = o.runs ?? new MemoryRunRegistry();
  const server = await startAdminServer(
    {
      log: o.log,
      serde: o.serde,
      traces: o.store ? adminTraceStore(o.store, undefined, o.tokenTexts ?? null) : null,
      runs,
      publishControl: (r) => publisher.publish(r),
      replay: new LogReplayManager({ log: o.log, serde: o.serde, traces: o.store }),
      metrics,
      logger: o.logger,
    },
    { host: o.host ?? '127.0.0.1', port: o.port ?? 0, tokens: [...tokens, ...fromEnv], env: {}, ...(o.corsOrigins ? { corsOrigins: o.corsOrigins } : {}) },
  );
  return {
    url: server.url,
    generatedToken,
    runs,
    close: async () => {
      await server.close();
      await publisher.close();
    },
  };
}

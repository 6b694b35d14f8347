// `rlstream admin`: serves the admin API and dashboard for a run's log and traces, on Kafka + ClickHouse or on the
// embedded default (an embedded log directory is locked by the process that writes it, so for a live embedded
// run the main job serves the admin itself). Tokens come from RLSTREAM_ADMIN_TOKENS; without any, a control token
// is generated for this process and printed once, inside the dashboard link.
import type { Command } from 'commander';
import { randomBytes } from 'node:crypto';
import { collectDefaultMetrics, Registry } from 'prom-client';
import { RlstreamError } from '../../core/errors.ts';
import { openLog } from '../../core/log/open.ts';
import type { EventLog } from '../../core/log/types.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import type { SchemaRegistry } from '../../core/serde/registry.ts';
import { jsonLogger } from '../../core/telemetry.ts';
import { openTraceStore } from '../../core/traces/open.ts';
import type { TraceStore } from '../../core/traces/store.ts';
import { controlPublisher } from '../../admin/control.ts';
import { LogReplayManager } from '../../admin/replay-manager.ts';
import { MemoryRunRegistry } from '../../admin/run-registry.ts';
import { startAdminServer } from '../../admin/server.ts';
import { adminTraceStore } from '../../admin/traces-adapter.ts';
import type { TokenSpec } from '../../admin/auth.ts';

const BROKERS = /^[A-Za-z0-9.-]+:\d+(,[A-Za-z0-9.-]+:\d+)*$/;

/** `kafka://h:p,…` or bare `h:p,…` are Kafka brokers; anything else is an embedded log directory. */
export function parseLogTarget(spec: string): { kind: 'kafka'; brokers: string[] } | { kind: 'embedded'; dir: string } {
  const body = spec.startsWith('kafka://') ? spec.slice('kafka://'.length) : spec;
  if (spec.startsWith('kafka://') || BROKERS.test(spec)) {
    const brokers = body.split(',').filter(Boolean);
    if (brokers.length === 0 || !brokers.every((b) => BROKERS.test(b))) throw new RlstreamError('CONFIG_INVALID', `--log ${spec}: brokers must be host:port[,host:port]`);
    return { kind: 'kafka', brokers };
  }
  if (spec.trim() === '') throw new RlstreamError('CONFIG_INVALID', '--log needs an embedded log directory or Kafka brokers');
  return { kind: 'embedded', dir: spec };
}

/** `chdb:<dir>` and http(s) URLs as core/traces understands them; a bare path is a chDB directory. */
export function parseTracesTarget(spec: string): string {
  return spec.startsWith('chdb:') || /^https?:\/\//.test(spec) ? spec : `chdb:${spec}`;
}

async function openRegistry(log: EventLog): Promise<SchemaRegistry> {
  if (log.kind === 'embedded') return EmbeddedRegistry.open(log);
  // The HTTP registry client belongs to the Kafka side; loaded by a computed name (as `rlstream replay` does).
  const modulePath = '../../core/serde/http-registry.ts';
  const mod = (await import(modulePath).catch(() => null)) as { openHttpRegistry?: (url: string) => Promise<SchemaRegistry> } | null;
  const url = process.env['SCHEMA_REGISTRY_URL'];
  if (!mod?.openHttpRegistry || !url) throw new RlstreamError('CONFIG_INVALID', 'a Kafka log needs SCHEMA_REGISTRY_URL and the HTTP registry client (core/serde/http-registry.ts)');
  return mod.openHttpRegistry(url);
}

export function register(program: Command): void {
  program
    .command('admin')
    .description('serve the admin API (OpenAPI at /openapi.json, UI at /docs) and the live dashboard for a run')
    .requiredOption('--log <dir|brokers>', 'embedded log directory, or Kafka brokers (kafka://host:port,… or host:port,…)')
    .option('--traces <dir|url>', 'trace store: chDB directory (chdb:<dir> or a path) or a ClickHouse URL')
    .option('--port <n>', 'port to listen on (0: any free port)', '8080')
    .option('--host <addr>', 'address to bind', '127.0.0.1')
    .option('--cors <origins>', 'comma-separated origins allowed by CORS (off by default)')
    .action(async (opts: { log: string; traces?: string; port: string; host: string; cors?: string }) => {
      const port = Number(opts.port);
      if (!Number.isInteger(port) || port < 0 || port > 65535) throw new RlstreamError('CONFIG_INVALID', `--port must be 0..65535, got ${opts.port}`);
      const logger = jsonLogger({ fields: { role: 'admin' } });
      const log = await openLog(parseLogTarget(opts.log), logger);
      let store: TraceStore | null = null;
      let registry: SchemaRegistry | null = null;
      try {
        registry = await openRegistry(log);
        const serde = await new EventSerde(registry).init();
        store = opts.traces ? await openTraceStore(parseTracesTarget(opts.traces)) : null;
        const metrics = new Registry();
        collectDefaultMetrics({ register: metrics });
        const publisher = controlPublisher(log, serde);
        let tokens: TokenSpec[] = [];
        let generated: string | null = null;
        if (!process.env['RLSTREAM_ADMIN_TOKENS']) {
          generated = randomBytes(24).toString('base64url');
          tokens = [{ token: generated, role: 'control', name: 'generated' }];
        }
        const server = await startAdminServer(
          {
            log,
            serde,
            traces: store ? adminTraceStore(store) : null,
            runs: new MemoryRunRegistry(),
            publishControl: (r) => publisher.publish(r),
            replay: new LogReplayManager({ log, serde, traces: store }),
            metrics,
            logger,
          },
          { host: opts.host, port, tokens, ...(opts.cors ? { corsOrigins: opts.cors.split(',').map((s) => s.trim()).filter(Boolean) } : {}) },
        );
        console.log(`rlstream admin: API ${server.url}/api  docs ${server.url}/docs  dashboard ${server.url}/dashboard/`);
        if (generated) console.log(`no RLSTREAM_ADMIN_TOKENS: a control token was generated for this process; open ${server.url}/dashboard/#token=${generated}`);
        await new Promise<void>((resolve) => {
          const stop = () => resolve();
          process.once('SIGINT', stop);
          process.once('SIGTERM', stop);
        });
        await server.close();
        await publisher.close();
      } finally {
        await store?.close();
        await registry?.close();
        await log.close();
      }
    });
}

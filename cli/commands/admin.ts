// `rlstream admin`: serves the admin API and dashboard for a run's log and traces, on Kafka + ClickHouse or on the
// embedded default (an embedded log directory is locked by the process that writes it, so for a live embedded
// run the main job serves the admin itself). Tokens come from --token-file, RLSTREAM_ADMIN_TOKENS_FILE or
// RLSTREAM_ADMIN_TOKENS; without any, a control token is generated for this process and printed once, inside
// the dashboard link.
import { dirname } from 'node:path';
import type { Command } from 'commander';
import { RlstreamError } from '../../core/errors.ts';
import { openLog } from '../../core/log/open.ts';
import type { EventLog } from '../../core/log/types.ts';
import { openRegistryFor } from '../../core/serde/open.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import type { SchemaRegistry } from '../../core/serde/registry.ts';
import { jsonLogger } from '../../core/telemetry.ts';
import { openTraceStore } from '../../core/traces/open.ts';
import type { TraceStore } from '../../core/traces/store.ts';
import { MemoryRunRegistry } from '../../admin/run-registry.ts';
import { readTokenFile } from '../../core/auth/tokens.ts';
import { serveAdmin } from '../../admin/serve.ts';
import { resolveEmbeddedLog } from '../run-dir.ts';
import { isUnfinishedRun } from '../run/resume.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';

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

/** A busy port as one line that says what to do, instead of the server's stack. */
function listenError(err: unknown, host: string, port: number): unknown {
  const code = (err as { code?: unknown } | null)?.code;
  if (code === 'EADDRINUSE') return new RlstreamError('CONFIG_INVALID', `port ${port} on ${host} is in use: pick another with --port <n>, or --port 0 for any free port`, { cause: err });
  if (code === 'EACCES') return new RlstreamError('CONFIG_INVALID', `no permission to listen on ${host}:${port}: pick a port above 1023 with --port <n>`, { cause: err });
  return err;
}

async function openRegistry(log: EventLog): Promise<SchemaRegistry> {
  // An embedded log carries its own schemas even when SCHEMA_REGISTRY_URL is set for other work.
  return log.kind === 'embedded' ? EmbeddedRegistry.open(log) : openRegistryFor(log);
}

export function register(program: Command): void {
  program
    .command('admin')
    .description('serve the admin API (OpenAPI at /openapi.json, UI at /docs) and the live dashboard for a run')
    .requiredOption('--log <dir|brokers>', 'a run directory (<data_dir>/<run id>: its log and traces), an embedded log directory, or Kafka brokers (kafka://host:port,… or host:port,…)')
    .option('--traces <dir|url>', 'trace store: chDB directory (chdb:<dir> or a path) or a ClickHouse URL')
    .option('--port <n>', 'port to listen on (0: any free port)', '8080')
    .option('--host <addr>', 'address to bind', '127.0.0.1')
    .option('--cors <origins>', 'comma-separated origins allowed by CORS (off by default)')
    .option('--tokenizer <dir>', "the run's tokenizer (e.g. examples/calculator/tokenizer): the trajectory view then shows each token's text, not only its id")
    .option('--token-file <path>', 'the API tokens, `read:<token>` / `control:<token>` one a line (mode 0600); also RLSTREAM_ADMIN_TOKENS_FILE')
    .action(async (opts: { log: string; traces?: string; port: string; host: string; cors?: string; tokenizer?: string; tokenFile?: string }) => {
      const port = Number(opts.port);
      if (!Number.isInteger(port) || port < 0 || port > 65535) throw new RlstreamError('CONFIG_INVALID', `--port must be 0..65535, got ${opts.port}`);
      const logger = jsonLogger({ fields: { role: 'admin' } });
      let target = parseLogTarget(opts.log);
      let traces = opts.traces;
      if (target.kind === 'embedded') {
        const resolved = resolveEmbeddedLog(target.dir, traces);
        target = { kind: 'embedded', dir: resolved.log };
        traces = resolved.traces;
      }
      const log = await openLog(target, logger);
      let store: TraceStore | null = null;
      let registry: SchemaRegistry | null = null;
      try {
        registry = await openRegistry(log);
        const serde = await new EventSerde(registry).init();
        store = traces ? await openTraceStore(parseTracesTarget(traces)) : null;
        // This process holds the embedded log's lock, so no run is writing it: the runs found in it have ended,
        // completed or, in a run directory without its summary (killed, interrupted; `rlstream run` resumes it), stopped.
        const ended = target.kind === 'embedded' && isUnfinishedRun(dirname(target.dir)) ? 'stopped' : 'completed';
        const runs = new MemoryRunRegistry(log.kind === 'embedded' ? ended : 'running');
        const tok = opts.tokenizer ? ChatTokenizer.load(opts.tokenizer) : null;
        const tokenTexts = tok ? (ids: readonly number[]) => ids.map((id) => tok.decode([id])) : undefined;
        const server = await serveAdmin({ log, serde, store, logger, runs, host: opts.host, port, ...(opts.tokenFile ? { tokens: readTokenFile(opts.tokenFile) } : {}), ...(tokenTexts ? { tokenTexts } : {}), ...(opts.cors ? { corsOrigins: opts.cors.split(',').map((s) => s.trim()).filter(Boolean) } : {}) }).catch((err: unknown) => {
          throw listenError(err, opts.host, port);
        });
        console.log(`rlstream admin: API ${server.url}/api  docs ${server.url}/docs  dashboard ${server.url}/dashboard/`);
        if (server.generatedToken) console.log(`no RLSTREAM_ADMIN_TOKENS: a control token was generated for this process; open ${server.url}/dashboard/#token=${server.generatedToken}`);
        await new Promise<void>((resolve) => {
          const stop = () => resolve();
          process.once('SIGINT', stop);
          process.once('SIGTERM', stop);
        });
        await server.close();
      } finally {
        await store?.close();
        await registry?.close();
        await log.close();
      }
    });
}

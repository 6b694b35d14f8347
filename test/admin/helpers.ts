// Shared fixture of the admin tests: a real embedded log and (optionally) a real chDB trace store in a temp
// directory, the default Control publisher, the replay manager on consumers/replay, tokens of both roles; and,
// for the tests of the command, a run recorded into an embedded log and `rlstream admin` as a real process.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Registry } from 'prom-client';
import { openLog } from '../../core/log/open.ts';
import type { EventLog } from '../../core/log/types.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { MemoryRegistry } from '../../core/serde/registry.ts';
import { silentLogger, type Logger } from '../../core/telemetry.ts';
import { openTraceStore } from '../../core/traces/open.ts';
import type { TraceStore } from '../../core/traces/store.ts';
import type { AdminContext } from '../../admin/context.ts';
import { controlPublisher } from '../../admin/control.ts';
import { LogReplayManager } from '../../admin/replay-manager.ts';
import { MemoryRunRegistry } from '../../admin/run-registry.ts';
import { adminTraceStore } from '../../admin/traces-adapter.ts';
import { syntheticRun } from './synthetic-run.ts';

/** The `rlstream` command (bin/rlstream.js), found from here whatever the working directory. */
export const BIN = join(import.meta.dirname, '..', '..', 'bin', 'rlstream.js');

export const READ_TOKEN = 'read-token-0123456789abcdef';
export const CONTROL_TOKEN = 'control-token-fedcba9876543210';
export const TOKENS = [
  { token: READ_TOKEN, role: 'read' as const, name: 'reader' },
  { token: CONTROL_TOKEN, role: 'control' as const, name: 'operator' },
];
export const auth = (token: string) => ({ authorization: `Bearer ${token}` });

export interface Fixture {
  dir: string;
  log: EventLog;
  serde: EventSerde;
  store: TraceStore | null;
  runs: MemoryRunRegistry;
  replay: LogReplayManager;
  ctx: AdminContext;
  close(): Promise<void>;
}

export async function fixture(options: { traces?: boolean; logger?: Logger } = {}): Promise<Fixture> {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-admin-'));
  const log = await openLog({ kind: 'embedded', dir: join(dir, 'log'), fsync: 'none' });
  const serde = await new EventSerde(new MemoryRegistry()).init();
  const store = options.traces ? await openTraceStore(`chdb:${join(dir, 'traces')}`) : null;
  const runs = new MemoryRunRegistry();
  const replay = new LogReplayManager({ log, serde, traces: store });
  const publisher = controlPublisher(log, serde);
  const ctx: AdminContext = {
    log,
    serde,
    traces: store ? adminTraceStore(store) : null,
    runs,
    publishControl: (r) => publisher.publish(r),
    replay,
    metrics: new Registry(),
    logger: options.logger ?? silentLogger,
  };
  return {
    dir, log, serde, store, runs, replay, ctx,
    async close() {
      await publisher.close();
      await log.close();
      await store?.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Records `steps` training steps of a run into an embedded log at logDir, its schemas in the log (as a job leaves it). */
export async function recordRun(logDir: string, steps: number): Promise<string> {
  const log = await openLog({ kind: 'embedded', dir: logDir });
  try {
    const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
    const run = await syntheticRun({ log, serde });
    for (let i = 0; i < steps; i++) await run.step();
    await run.stop();
    return run.runId;
  } finally {
    await log.close();
  }
}

export interface AdminProcess {
  readonly url: string;
  readonly pid: number;
  /** What the process printed so far. */
  output(): { out: string; err: string };
  /** SIGTERM; the process must exit with 0. */
  stop(): Promise<void>;
}

/** `rlstream admin` on logDir and tracesDir (null: what the command finds beside the log, as for a run directory)
 * as a real process, `tokens` in RLSTREAM_ADMIN_TOKENS; resolves with the API's URL once the process prints it,
 * and rejects with its stderr if it exits first. */
export async function startAdmin(logDir: string, tracesDir: string | null, tokens: string, extra: { args?: string[]; env?: Record<string, string> } = {}): Promise<AdminProcess> {
  const traces = tracesDir === null ? [] : ['--traces', tracesDir];
  const child = spawn(process.execPath, [BIN, 'admin', '--log', logDir, ...traces, '--port', '0', ...(extra.args ?? [])], {
    env: { ...process.env, RLSTREAM_ADMIN_TOKENS: tokens, RLSTREAM_LOG_LEVEL: 'warn', ...extra.env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  try {
    const url = await new Promise<string>((resolve, reject) => {
      const t = setInterval(() => {
        const m = /API (http:\/\/[^\s]+)\/api/.exec(out);
        if (m) {
          clearInterval(t);
          resolve(m[1]!);
        }
      }, 100);
      void exited.then((code) => {
        clearInterval(t);
        reject(new Error(`admin exited ${code}: ${err}`));
      });
    });
    return {
      url,
      pid: child.pid!,
      output: () => ({ out, err }),
      async stop() {
        child.kill('SIGTERM');
        assert.equal(await exited, 0, err);
      },
    };
  } catch (e) {
    child.kill('SIGTERM');
    await exited;
    throw e;
  }
}

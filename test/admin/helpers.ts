// Shared fixture of the admin tests: a real embedded log and (optionally) a real chDB trace store in a temp
// directory, the default Control publisher, tokens of both roles, and a FAKE replay manager (until
// consumers/replay's manager is wired in).
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Registry } from 'prom-client';
import { newId } from '../../core/ids.ts';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import type { EventLog } from '../../core/log/types.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { MemoryRegistry } from '../../core/serde/registry.ts';
import { silentLogger, type Logger } from '../../core/telemetry.ts';
import { openTraceStore } from '../../core/traces/open.ts';
import type { TraceStore } from '../../core/traces/store.ts';
import type { AdminContext, ReplayJobInfo, ReplayManager, ReplaySpec } from '../../admin/context.ts';
import { controlPublisher } from '../../admin/control.ts';
import { MemoryRunRegistry } from '../../admin/run-registry.ts';
import { adminTraceStore } from '../../admin/traces-adapter.ts';

export const READ_TOKEN = 'read-token-0123456789abcdef';
export const CONTROL_TOKEN = 'control-token-fedcba9876543210';
export const TOKENS = [
  { token: READ_TOKEN, role: 'read' as const, name: 'reader' },
  { token: CONTROL_TOKEN, role: 'control' as const, name: 'operator' },
];
export const auth = (token: string) => ({ authorization: `Bearer ${token}` });

/** FAKE: an in-memory replay manager with the ReplayManager contract, for route tests only. */
export class FakeReplayManager implements ReplayManager {
  readonly jobs = new Map<string, ReplayJobInfo>();
  async start(spec: ReplaySpec): Promise<ReplayJobInfo> {
    const job: ReplayJobInfo = { id: newId(), spec, state: 'running', startedMs: Date.now(), finishedMs: null, processed: 0, total: 10, error: null };
    this.jobs.set(job.id, job);
    return job;
  }
  list() {
    return [...this.jobs.values()];
  }
  get(id: string) {
    return this.jobs.get(id);
  }
  async cancel(id: string) {
    const j = this.jobs.get(id);
    if (j && j.state === 'running') Object.assign(j, { state: 'cancelled', finishedMs: Date.now() });
    return j;
  }
}

export interface Fixture {
  dir: string;
  log: EventLog;
  serde: EventSerde;
  store: TraceStore | null;
  runs: MemoryRunRegistry;
  replay: FakeReplayManager;
  ctx: AdminContext;
  close(): Promise<void>;
}

export async function fixture(options: { traces?: boolean; logger?: Logger } = {}): Promise<Fixture> {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-admin-'));
  const log = openEmbeddedLog({ dir: join(dir, 'log'), fsync: 'none' });
  const serde = await new EventSerde(new MemoryRegistry()).init();
  const store = options.traces ? await openTraceStore(`chdb:${join(dir, 'traces')}`) : null;
  const runs = new MemoryRunRegistry();
  const replay = new FakeReplayManager();
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

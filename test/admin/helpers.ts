// Shared fixture of the admin tests: a real embedded log and (optionally) a real chDB trace store in a temp
// directory, the default Control publisher, the replay manager on consumers/replay, tokens of both roles.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Registry } from 'prom-client';
import { openLog } from '../../core/log/open.ts';
import type { EventLog } from '../../core/log/types.ts';
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

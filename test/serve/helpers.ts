// Shared by the serve tests: start `rlstream serve`'s job on the calculator config in a fresh data directory,
// and read back what it published.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { silentLogger } from '../../core/telemetry.ts';
import type { DecodedEvent } from '../../core/serde/events.ts';
import { startServeJob, type ServeJob, type ServeJobOptions } from '../../cli/run/serve-job.ts';

export const CONFIG = join(import.meta.dirname, '../../examples/calculator/config.yaml');
export const TOKEN = 'serve-test-token-0123456789';

export async function startServe(options: Partial<ServeJobOptions> & { overrides?: Record<string, unknown> } = {}): Promise<{ job: ServeJob; dir: string; stop: () => Promise<void> }> {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-serve-'));
  const job = await startServeJob({
    configPath: CONFIG,
    port: 0,
    tokens: [{ token: TOKEN, role: 'read' }],
    logger: silentLogger,
    ...options,
    overrides: { 'run.data_dir': dir, 'traces.kind': 'none', 'backend.workers': 1, 'rollout.tokenization_check_every': 1, ...options.overrides },
  });
  return {
    job,
    dir,
    stop: async () => {
      await job.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Every event on a topic so far (a fresh consumer group reads from the beginning). */
export async function topicEvents(job: ServeJob, topic: string): Promise<DecodedEvent[]> {
  const c = await job.ctx.log.consumer({ groupId: `read-${Math.random()}`, topics: [topic], fromBeginning: true });
  const out: DecodedEvent[] = [];
  try {
    for (;;) {
      const recs = await c.poll({ timeoutMs: 200, maxRecords: 10_000 });
      if (recs.length === 0) break;
      for (const r of recs) out.push(await job.ctx.serde.decode(r.value));
    }
  } finally {
    await c.close();
  }
  return out;
}

export async function call(job: ServeJob, method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<{ status: number; json: Record<string, unknown>; headers: Headers; text: string }> {
  const res = await fetch(job.url + path, {
    method,
    headers: { authorization: `Bearer ${TOKEN}`, ...(body !== undefined ? { 'content-type': 'application/json' } : {}), ...headers },
    ...(body !== undefined ? { body: typeof body === 'string' ? body : JSON.stringify(body) } : {}),
  });
  const text = await res.text();
  let json: Record<string, unknown> = {};
  try {
    json = JSON.parse(text) as Record<string, unknown>;
  } catch {
    /* SSE or empty */
  }
  return { status: res.status, json, headers: res.headers, text };
}

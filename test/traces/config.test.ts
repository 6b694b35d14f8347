// The traces section of a run's configuration reaches the trace store and the sink: the sink's batch
// (traces.batch_rows, traces.batch_bytes, else the store's preferred batch) and the server's credentials
// (traces.username, traces.password), checked against the real server's users (infra/clickhouse/users.xml).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { compileRunConfig } from '../../cli/config/run-config.ts';
import { isRlstreamError } from '../../core/errors.ts';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openRunContext, openRunTraces } from '../../cli/run/context.ts';
import { createTraceSink } from '../../cli/run/roles.ts';
import { silentLogger } from '../../core/telemetry.ts';
import { recordRun } from '../../testkit/record-run.ts';
import { openTraceStore } from '../../core/traces/open.ts';
import { TraceWriter } from '../../consumers/traces/writer.ts';
import { targets } from './targets.ts';

const TEST_USER = 'rlstream_test';
const TEST_PASSWORD = 'rlstream-test-password';

function traces(section: Record<string, unknown>) {
  return compileRunConfig({ traces: section }, '/tmp').traces;
}

function configError(section: Record<string, unknown>, message: RegExp): void {
  assert.throws(
    () => traces(section),
    (e) => isRlstreamError(e, 'CONFIG_INVALID') && message.test(e.message),
  );
}

test('traces.batch_rows and batch_bytes are read for both kinds; bad values and unknown fields are named', () => {
  assert.deepEqual(traces({ kind: 'chdb', dir: '/x', batch_rows: 50_000 }), { kind: 'chdb', dir: '/x', batch: { maxRows: 50_000 }, ttlDays: null });
  const server = traces({ kind: 'clickhouse', url: 'http://127.0.0.1:1', batch_rows: 1000, batch_bytes: 1 << 20 });
  assert.equal(server.kind, 'clickhouse');
  assert.deepEqual(server.kind === 'clickhouse' && server.batch, { maxRows: 1000, maxBytes: 1 << 20 });
  assert.deepEqual(server.kind === 'clickhouse' && [server.username, server.password], ['', '']);
  configError({ kind: 'chdb', batch_rows: 0 }, /^traces\.batch_rows: must be >= 1 \(got 0\)/);
  configError({ kind: 'clickhouse', url: 'http://h', batch_bytes: 1.5 }, /^traces\.batch_bytes: must be an integer \(got 1\.5\)/);
  configError({ kind: 'chdb', batch_rows: '100' }, /^traces\.batch_rows: must be an integer \(got "100"\)/);
  configError({ kind: 'clickhouse', url: 'http://h', batchrows: 10 }, /^traces\.batchrows: unknown key \(did you mean batch_rows\?\)/);
  configError({ kind: 'chdb', database: 'x' }, /^traces\.database: unknown key/);
});

for (const target of targets()) {
  test(`a writer on ${target.name} takes the store's preferred batch unless told otherwise`, { skip: target.skip ?? false }, async () => {
    const store = await target.open('batch');
    try {
      // The server prefers larger parts (see ServerTraceStore.preferredBatch); chDB takes the writer's default.
      assert.equal(store.preferredBatch !== undefined, target.name === 'server');
      const preferred = store.preferredBatch ?? { maxRows: 100_000, maxBytes: 64 << 20 };
      const byDefault = new TraceWriter(store);
      assert.deepEqual([byDefault.maxRows, byDefault.maxBytes], [preferred.maxRows, preferred.maxBytes]);
      const told = new TraceWriter(store, { maxRows: 7, maxBytes: 4096 });
      assert.deepEqual([told.maxRows, told.maxBytes], [7, 4096]);
    } finally {
      await store.close();
    }
  });
}

test("a run's traces.batch_rows reaches the sink it starts: a drain writes more, smaller batches", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-batchcfg-'));
  const drain = async (batchRows: number | undefined) => {
    const config = compileRunConfig({ run: { id: `b${batchRows ?? 0}`, data_dir: join(dir, String(batchRows)) }, traces: { kind: 'chdb', ...(batchRows ? { batch_rows: batchRows } : {}) } }, dir);
    const ctx = await openRunContext(config, silentLogger);
    const store = await targets()[0]!.open('batchcfg');
    try {
      const { sent } = await recordRun(ctx.log, ctx.serde, { groups: 300, runId: config.run.id }, 0, false, false);
      const sink = createTraceSink(ctx, store);
      await sink.drain();
      await sink.stop();
      assert.equal(sink.stats.records, sent);
      return sink.stats;
    } finally {
      await store.close();
      await ctx.close();
    }
  };
  try {
    // More records than a poll (5,000): the sink asks whether a batch is due once per poll.
    const small = await drain(1000);
    const plain = await drain(undefined);
    assert.ok(small.rows > 10_000, `${small.rows} rows`);
    assert.equal(plain.flushes, 1, 'the default batch (100,000 rows) takes the whole run at once');
    assert.ok(small.flushes >= 2, `${small.flushes} flushes for ${small.rows} rows in batches of 1,000`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

const server = targets().find((t) => t.name === 'server')!;

/** The user the server runs a query as (18.16 has no currentUser(): the query finds itself among the processes). */
async function userOf(store: Awaited<ReturnType<typeof openRunTraces>>): Promise<string> {
  const mark = randomUUID();
  const r = await store!.query(`SELECT user FROM system.processes WHERE query LIKE '%${mark}%'`);
  return String(r.rows[0]?.['user'] ?? '');
}

test('the server store connects with traces.username and traces.password, and a wrong password fails without showing it', { skip: server.skip ?? false }, async () => {
  const url = process.env['CLICKHOUSE_URL']!;
  const database = `auth_${process.pid}_${Date.now().toString(36)}`;
  const run = (section: Record<string, unknown>) => compileRunConfig({ traces: { kind: 'clickhouse', url, database, ...section } }, '/tmp');
  process.env['RLSTREAM_TEST_CH_PASSWORD'] = TEST_PASSWORD;
  const store = await openRunTraces(run({ username: TEST_USER, password: '${RLSTREAM_TEST_CH_PASSWORD}' }));
  try {
    assert.equal(await userOf(store), TEST_USER);
    const plain = await openRunTraces(run({}));
    try {
      assert.equal(await userOf(plain), 'default', 'without credentials the URL decides (here: the default user)');
    } finally {
      await plain!.close();
    }
    const wrong = 'not-the-password-4c1b';
    await assert.rejects(openRunTraces(run({ username: TEST_USER, password: wrong })), (e: unknown) => {
      assert.ok(isRlstreamError(e, 'TRACE_STORE'), String(e));
      assert.ok(!String((e as Error).message).includes(wrong), `the password is in the error: ${(e as Error).message}`);
      return true;
    });
  } finally {
    await store!.exec(`DROP DATABASE IF EXISTS ${database}`).catch(() => undefined);
    await store!.close();
    delete process.env['RLSTREAM_TEST_CH_PASSWORD'];
  }
});

test("a server store refuses to create its tables in ClickHouse's own database", { skip: server.skip ?? false }, async () => {
  const url = process.env['CLICKHOUSE_URL']!;
  await assert.rejects(openTraceStore(url, { database: 'system' }), (e: unknown) => isRlstreamError(e, 'CONFIG_INVALID') && /own database "system"/.test((e as Error).message));
  const reader = await openTraceStore(url, { database: 'system', migrate: false });
  try {
    const r = await reader.query("SELECT count() AS n FROM system.tables WHERE database = 'system' AND name IN ('schema_migrations', 'trajectories')");
    assert.equal(Number(r.rows[0]?.['n']), 0);
  } finally {
    await reader.close();
  }
});

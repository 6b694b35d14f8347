// `rlstream query` as a real process finds a run's traces the way a new user expects, and never answers from a
// new empty store: without --store it reads the newest run under .rlstream/ (and says which) or refuses; a
// missing --store is refused and not created; a live run (its chDB directory locked by the process that
// writes it) is read through that run's admin API, found through <run dir>/admin-url.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { serveAdmin, type ServedAdmin } from '../../admin/serve.ts';
import { openLog } from '../../core/log/open.ts';
import type { EventLog } from '../../core/log/types.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { jsonLogger } from '../../core/telemetry.ts';
import { openTraceStore } from '../../core/traces/open.ts';
import type { TraceStore } from '../../core/traces/store.ts';
import { syntheticRun } from '../admin/synthetic-run.ts';

const BIN = join(import.meta.dirname, '..', '..', 'bin', 'rlstream.js');
let dir: string;
let runDir: string;
let runId: string;
let trajectories: number;
// The "live run": its log, its chDB store (held open, so locked) and its admin server, in this process.
let log: EventLog;
let registry: EmbeddedRegistry;
let store: TraceStore;
let admin: ServedAdmin;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'rlstream-query-command-'));
  // The main job names a run's directory after the run.
  runId = 'calculator-1-20260101000000';
  runDir = join(dir, '.rlstream', 'calculator', runId);
  log = await openLog({ kind: 'embedded', dir: join(runDir, 'log') });
  registry = await EmbeddedRegistry.open(log);
  const serde = await new EventSerde(registry).init();
  store = await openTraceStore(`chdb:${join(runDir, 'chdb')}`);
  const run = await syntheticRun({ log, serde, traces: store, runId });
  for (let i = 0; i < 2; i++) await run.step();
  await run.stop();
  trajectories = run.trajectoryIds.length;
  admin = await serveAdmin({ log, serde, store, logger: jsonLogger({ level: 'error' }) });
  admin.runs.add({ id: runId });
  writeFileSync(join(runDir, 'admin-url'), `${admin.url}/dashboard/#token=${admin.generatedToken}\n`, { mode: 0o600 });
});

after(async () => {
  await admin?.close();
  await store?.close();
  await registry?.close();
  await log?.close();
  rmSync(dir, { recursive: true, force: true });
});

/** Asynchronously: the admin server answering the child lives in this process's event loop. */
async function query(args: string[], cwd = dir): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const env = { ...process.env };
  delete env['RLSTREAM_TRACES'];
  delete env['CLICKHOUSE_URL'];
  const child = spawn(process.execPath, [BIN, 'query', ...args], { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const code = await new Promise<number | null>((resolve) => child.on('exit', resolve));
  return { code, stdout, stderr };
}

test('a live run (store locked by its process) is read through its admin API, with or without --store', { timeout: 120_000 }, async () => {
  const sql = 'SELECT count() AS n FROM trajectories';
  for (const args of [['--store', runDir, sql], [sql]]) {
    const r = await query([...args, '--format', 'json']);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual((JSON.parse(r.stdout) as { n: number | string }[]).map((x) => Number(x.n)), [trajectories]);
    assert.match(r.stderr, /the run is live .*reading through the admin API/);
    assert.doesNotMatch(r.stderr, /Cannot lock/);
  }
  const named = await query(['--named', 'runs', '--format', 'json']);
  assert.equal(named.code, 0, named.stderr);
  assert.deepEqual((JSON.parse(named.stdout) as { run_id: string }[]).map((x) => x.run_id), [runId]);
  assert.match(named.stderr, /reading the traces of .*calculator-1-20260101000000 \(the newest of 1 run\(s\) under \.rlstream\//);
  // A data directory stands for its newest run too.
  const data = await query(['--store', join(dir, '.rlstream', 'calculator'), sql, '--format', 'json']);
  assert.equal(data.code, 0, data.stderr);
  assert.match(data.stderr, /the newest of 1 run\(s\) under .*calculator/);
});

test('no --store and no run under .rlstream/: refused with the fix, no store created; a missing --store likewise', async () => {
  const empty = join(dir, 'elsewhere');
  mkdirSync(empty);
  const r = await query(['SELECT 1'], empty);
  assert.equal(r.code, 1);
  assert.match(r.stderr, /no trace store given and no run under .*give --store <run dir>/);
  assert.equal(existsSync(join(empty, '.rlstream')), false);
  const missing = await query(['--store', 'chdb:nowhere', 'SELECT 1'], empty);
  assert.equal(missing.code, 1);
  assert.match(missing.stderr, /trace store chdb:nowhere does not exist/);
  assert.equal(existsSync(join(empty, 'nowhere')), false);
  // An existing directory that is no store and holds no run is refused, not turned into an empty store.
  const plain = await query(['--store', empty, 'SELECT 1'], empty);
  assert.equal(plain.code, 1);
  assert.match(plain.stderr, /is no trace store, run directory or data directory with runs/);
  assert.deepEqual(readdirSync(empty), []);
});

// `rlstream admin` (and `replay`) as a real process, on what a new user hands it: a run directory (log and traces both, found
// by itself; its ended run shown as completed, not running, or as stopped when the main job left it unfinished), a directory that is no run (refused with the fix,
// nothing created), and a port already in use (one line, non-zero exit, no hang).
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { openLog } from '../../core/log/open.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { openTraceStore } from '../../core/traces/open.ts';
import { auth, BIN, startAdmin } from '../admin/helpers.ts';
import { syntheticRun } from '../admin/synthetic-run.ts';
import { finishRun } from '../../cli/run/resume.ts';

const TOKEN = 'admin-command-read-token-0123';
let dir: string;
let runDir: string;
let runId: string;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'rlstream-admin-command-'));
  runDir = join(dir, 'calculator-1-20260101000000');
  const log = await openLog({ kind: 'embedded', dir: join(runDir, 'log') });
  const registry = await EmbeddedRegistry.open(log);
  const serde = await new EventSerde(registry).init();
  const traces = await openTraceStore(`chdb:${join(runDir, 'chdb')}`);
  const run = await syntheticRun({ log, serde, traces });
  for (let i = 0; i < 3; i++) await run.step();
  await run.stop();
  runId = run.runId;
  await traces.close();
  await registry.close();
  await log.close();
});

after(() => rmSync(dir, { recursive: true, force: true }));

interface ListedRun {
  id: string;
  status: string;
  lastStep: number | null;
}

/** `rlstream admin --log <run dir>` as a process, handed to `use` once it lists the run's last step (it has read the log to its end). */
async function adminOnRunDir<T>(use: (url: string, runs: ListedRun[]) => Promise<T> | T): Promise<T> {
  const a = await startAdmin(runDir, null, `read:${TOKEN}`);
  try {
    let runs: ListedRun[] = [];
    for (let i = 0; i < 50 && runs[0]?.lastStep !== 2; i++) {
      const res = await fetch(`${a.url}/api/runs`, { headers: auth(TOKEN) });
      assert.equal(res.status, 200, await res.clone().text());
      runs = ((await res.json()) as { runs: ListedRun[] }).runs;
      await new Promise((r) => setTimeout(r, 100));
    }
    return await use(a.url, runs);
  } finally {
    await a.stop();
  }
}

test('--log <run dir> serves its log and its traces; the ended run is completed, not running', { timeout: 90_000 }, async () => {
  await adminOnRunDir(async (url, runs) => {
    assert.deepEqual(runs.map((r) => [r.id, r.status]), [[runId, 'completed']]);
    const res = await fetch(`${url}/api/traces/queries/runs`, { method: 'POST', headers: { ...auth(TOKEN), 'content-type': 'application/json' }, body: '{}' });
    assert.equal(res.status, 200, await res.clone().text());
    const rows = ((await res.json()) as { rows: { run_id: string }[] }).rows;
    assert.deepEqual(rows.map((r) => r.run_id), [runId], 'the run directory\'s chdb/ is served');
  });
});

test('a run directory the main job left unfinished (killed, interrupted) is stopped, not completed; once finished, completed', { timeout: 180_000 }, async () => {
  const statuses = (): Promise<string[][]> => adminOnRunDir((_, runs) => runs.map((r) => [r.id, r.status]));
  writeFileSync(join(runDir, 'run.json'), JSON.stringify({ run_id: runId, config_hash: 'h' }));
  try {
    assert.deepEqual(await statuses(), [[runId, 'stopped']]);
    finishRun(runDir, { steps: 3 });
    assert.deepEqual(await statuses(), [[runId, 'completed']]);
  } finally {
    rmSync(join(runDir, 'run.json'), { force: true });
    rmSync(join(runDir, 'summary.json'), { force: true });
  }
});

test('--log <a directory that is no log and no run> and --log <missing> are refused with the fix; nothing is created', () => {
  const other = join(dir, 'not-a-run');
  mkdirSync(other);
  const r = spawnSync(process.execPath, [BIN, 'admin', '--log', other, '--port', '0'], { encoding: 'utf8', timeout: 30_000 });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /neither an embedded log nor a run directory \(one holding log\/ and chdb\/\): give the run directory \(<data_dir>\/<run id>\) or its log\/ directory/);
  assert.deepEqual(readdirSync(other), []);
  const missing = spawnSync(process.execPath, [BIN, 'admin', '--log', join(dir, 'missing'), '--port', '0'], { encoding: 'utf8', timeout: 30_000 });
  assert.equal(missing.status, 1);
  assert.match(missing.stderr, /does not exist/);
  assert.equal(existsSync(join(dir, 'missing')), false);
});

test('a port in use: one line naming the port and the fix, exit 1, promptly', { timeout: 60_000 }, async () => {
  const busy = createServer();
  await new Promise<void>((resolve) => busy.listen(0, '127.0.0.1', resolve));
  const port = (busy.address() as { port: number }).port;
  try {
    // The listening socket is the kernel's: blocking this process's event loop meanwhile leaves the port taken.
    const r = spawnSync(process.execPath, [BIN, 'admin', '--log', runDir, '--port', String(port)], { encoding: 'utf8', timeout: 30_000, killSignal: 'SIGKILL', env: { ...process.env, RLSTREAM_ADMIN_TOKENS: `read:${TOKEN}` } });
    assert.equal(r.status, 1, `exit ${r.status ?? r.signal} (SIGKILL: it hung): ${r.stderr}`);
    const lines = r.stderr.trim().split('\n');
    assert.equal(lines.length, 1, r.stderr);
    assert.match(lines[0]!, new RegExp(`port ${port} on 127.0.0.1 is in use: pick another with --port`));
  } finally {
    busy.close();
  }
});

test('replay --log <run dir> reads the run\'s log/; a directory that is no run is refused, nothing created in it', { timeout: 60_000 }, () => {
  const out = join(dir, 'sft.jsonl');
  const r = spawnSync(process.execPath, [BIN, 'replay', '--log', runDir, '--into', `jsonl:${out}`], { encoding: 'utf8', timeout: 60_000 });
  assert.equal(r.status, 0, r.stderr);
  const end = JSON.parse(r.stdout.trim().split('\n').pop()!) as { state: string; read: number };
  assert.equal(end.state, 'done');
  assert.ok(end.read > 0, 'the run\'s records were read');
  assert.deepEqual(readdirSync(runDir).sort(), ['chdb', 'log']);
  const other = join(dir, 'not-a-run-either');
  mkdirSync(other);
  const bad = spawnSync(process.execPath, [BIN, 'replay', '--log', other, '--into', `jsonl:${out}`], { encoding: 'utf8', timeout: 60_000 });
  assert.equal(bad.status, 1);
  assert.match(bad.stderr, /neither an embedded log nor a run directory/);
  assert.deepEqual(readdirSync(other), []);
});

test('replay --reward <a task\'s data source> needs the run\'s config, and says so; with --config it re-scores', { timeout: 60_000 }, () => {
  const CONFIG = join(import.meta.dirname, '..', '..', 'examples', 'calculator', 'config.yaml');
  const without = spawnSync(process.execPath, [BIN, 'replay', '--log', runDir, '--into', 'topic:rescored', '--reward', 'rlstream/calculator'], { encoding: 'utf8', timeout: 60_000 });
  assert.equal(without.status, 1);
  assert.match(without.stderr, /--reward rlstream\/calculator: no reward function for that data source .*--config <config.yaml>/);
  const r = spawnSync(process.execPath, [BIN, 'replay', '--log', runDir, '--into', 'topic:rescored', '--reward', 'rlstream/calculator', '--config', CONFIG], { encoding: 'utf8', timeout: 60_000 });
  assert.equal(r.status, 0, r.stderr);
  assert.equal((JSON.parse(r.stdout.trim().split('\n').pop()!) as { state: string }).state, 'done');
});

test('output piped into a reader that stops early ends quietly (no EPIPE stack trace)', { timeout: 60_000 }, async () => {
  // Far more output than a pipe holds, so writes go on after the reader has gone.
  const child = spawn(process.execPath, [BIN, 'score', '--reward', 'gsm8k'], { stdio: ['pipe', 'pipe', 'pipe'] });
  let err = '';
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  child.stdout.once('data', () => child.stdout.destroy());
  child.stdin.on('error', () => {});
  child.stdin.end('{"solution_str":"#### 1","ground_truth":"1"}\n'.repeat(50_000));
  const code = await new Promise<number | null>((resolve) => child.on('exit', resolve));
  assert.equal(err, '');
  assert.equal(code, 0);
});

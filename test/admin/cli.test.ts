// `rlstream admin` as a real process on an embedded log written earlier (schemas in its `_schemas` topic) and
// a chDB trace directory: it prints its URL, serves the API with the env tokens, and exits on SIGTERM.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseLogTarget, parseTracesTarget } from '../../cli/commands/admin.ts';
import { openLog } from '../../core/log/open.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { isRlstreamError } from '../../core/errors.ts';
import { syntheticRun } from './synthetic-run.ts';

test('log and traces targets', () => {
  assert.deepEqual(parseLogTarget('kafka://a:9092,b:9093'), { kind: 'kafka', brokers: ['a:9092', 'b:9093'] });
  assert.deepEqual(parseLogTarget('127.0.0.1:19092'), { kind: 'kafka', brokers: ['127.0.0.1:19092'] });
  assert.deepEqual(parseLogTarget('.rlstream/log'), { kind: 'embedded', dir: '.rlstream/log' });
  assert.throws(() => parseLogTarget('kafka://'), (e) => isRlstreamError(e, 'CONFIG_INVALID'));
  assert.equal(parseTracesTarget('/data/traces'), 'chdb:/data/traces');
  assert.equal(parseTracesTarget('http://127.0.0.1:8123'), 'http://127.0.0.1:8123');
});

test('rlstream admin serves a recorded embedded run', { timeout: 90_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-admin-cli-'));
  const logDir = join(dir, 'log');
  const log = await openLog({ kind: 'embedded', dir: logDir });
  const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
  const run = await syntheticRun({ log, serde });
  for (let i = 0; i < 3; i++) await run.step();
  await run.stop();
  await log.close();

  const token = 'cli-read-token-0123456789';
  const child = spawn(process.execPath, ['bin/rlstream.js', 'admin', '--log', logDir, '--traces', join(dir, 'traces'), '--port', '0'], {
    env: { ...process.env, RLSTREAM_ADMIN_TOKENS: `read:${token}`, RLSTREAM_LOG_LEVEL: 'warn' },
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
    assert.equal((await fetch(`${url}/healthz`)).status, 200);
    assert.equal((await fetch(`${url}/api/runs`)).status, 401);
    let runs: { id: string; lastStep: number | null }[] = [];
    for (let i = 0; i < 50; i++) {
      runs = ((await (await fetch(`${url}/api/runs`, { headers: { authorization: `Bearer ${token}` } })).json()) as { runs: typeof runs }).runs;
      if (runs[0]?.lastStep === 2) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.deepEqual(runs.map((r) => [r.id, r.lastStep]), [[run.runId, 2]]);
    assert.equal(out.includes(token), false, 'the env token is never printed');
    assert.equal(err.includes(token), false);
  } finally {
    child.kill('SIGTERM');
    assert.equal(await exited, 0, err);
    rmSync(dir, { recursive: true, force: true });
  }
});

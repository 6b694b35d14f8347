// `rlstream admin` as a real process on an embedded log written earlier (schemas in its `_schemas` topic) and
// a chDB trace directory: it prints its URL, serves the API with the env tokens, and exits on SIGTERM.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseLogTarget, parseTracesTarget } from '../../cli/commands/admin.ts';
import { isRlstreamError } from '../../core/errors.ts';
import { recordRun, startAdmin } from './helpers.ts';

test('log and traces targets', () => {
  assert.deepEqual(parseLogTarget('kafka://a:9092,b:9093'), { kind: 'kafka', brokers: ['a:9092', 'b:9093'] });
  assert.deepEqual(parseLogTarget('127.0.0.1:19092'), { kind: 'kafka', brokers: ['127.0.0.1:19092'] });
  assert.deepEqual(parseLogTarget('.rlstream/log'), { kind: 'embedded', dir: '.rlstream/log' });
  assert.throws(() => parseLogTarget('kafka://'), (e) => isRlstreamError(e, 'CONFIG_INVALID'));
  assert.equal(parseTracesTarget('/data/traces'), 'chdb:/data/traces');
  assert.equal(parseTracesTarget('http://127.0.0.1:8123'), 'http://127.0.0.1:8123');
});

test('rlstream admin serves a recorded embedded run', { timeout: 90_000 }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-admin-cli-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const logDir = join(dir, 'log');
  const runId = await recordRun(logDir, 3);
  const token = 'cli-read-token-0123456789';
  const admin = await startAdmin(logDir, join(dir, 'traces'), `read:${token}`);
  try {
    assert.equal((await fetch(`${admin.url}/healthz`)).status, 200);
    assert.equal((await fetch(`${admin.url}/api/runs`)).status, 401);
    let runs: { id: string; lastStep: number | null }[] = [];
    for (let i = 0; i < 50; i++) {
      runs = ((await (await fetch(`${admin.url}/api/runs`, { headers: { authorization: `Bearer ${token}` } })).json()) as { runs: typeof runs }).runs;
      if (runs[0]?.lastStep === 2) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.deepEqual(runs.map((r) => [r.id, r.lastStep]), [[runId, 2]]);
    const { out, err } = admin.output();
    assert.equal(out.includes(token), false, 'the env token is never printed');
    assert.equal(err.includes(token), false);
  } finally {
    await admin.stop();
  }
});

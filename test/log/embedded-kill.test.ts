// Exactly-once under SIGKILL on the embedded log: a transactional consume-transform-produce worker is killed
// at random moments (at least 20 times) and restarted until it has consumed all input; `out` must then hold
// every input id exactly once, and the log must reopen cleanly.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { pollUntil } from './conformance.ts';

const WORKER = join(import.meta.dirname, 'fixtures', 'transform-worker.ts');
const INPUT = 4000;
const KILLS = 20;

interface Life {
  exit: Promise<number | null>;
  kill(): void;
  ready: Promise<void>;
  output: () => string;
}

function startWorker(dir: string): Life {
  const child = spawn(process.execPath, ['--import', 'tsx', WORKER, dir], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  let onReady: () => void = () => {};
  const ready = new Promise<void>((r) => (onReady = r));
  child.stdout.on('data', (d: Buffer) => {
    out += d.toString();
    if (out.includes('ready')) onReady();
  });
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const exit = new Promise<number | null>((resolve) => child.on('exit', (code) => (onReady(), resolve(code))));
  return { exit, ready, kill: () => child.kill('SIGKILL'), output: () => out + err };
}

test('transactional consume-transform-produce survives 20+ SIGKILLs with exactly-once output', { timeout: 110_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-kill-'));
  try {
    const setup = openEmbeddedLog({ dir, segmentBytes: 64 * 1024 });
    await setup.createTopic({ name: 'in', partitions: 2 });
    await setup.createTopic({ name: 'out', partitions: 3 });
    const producer = await setup.producer();
    const ids = Array.from({ length: INPUT }, (_, i) => `id-${String(i).padStart(6, '0')}`);
    for (let i = 0; i < INPUT; i += 500) {
      await producer.send('in', ids.slice(i, i + 500).map((id) => ({ key: id, value: Buffer.concat([Buffer.from(id.padEnd(16)), randomBytes(1500)]) })));
    }
    await setup.close();

    let kills = 0;
    const remaining: number[] = [];
    let done = false;
    const started = Date.now();
    while (!done) {
      assert.ok(Date.now() - started < 95_000, `not finished after ${kills} kills`);
      const life = startWorker(dir);
      await life.ready;
      if (kills < KILLS) {
        // Kill while it works: after opening the log, a random moment in its first ~150 ms of transactions,
        // a shorter window as the input runs out, so a fast life cannot finish the input before 20 kills landed.
        const left = (remaining[remaining.length - 1] ?? INPUT) / INPUT;
        await new Promise((r) => setTimeout(r, Math.random() * Math.max(5, 150 * left)));
        life.kill();
        const code = await life.exit;
        if (code === 0 && life.output().includes('done')) done = true;
        else kills++;
        // Between lives the log must open (recovering a torn journal or segment tail) and show progress.
        const check = openEmbeddedLog({ dir });
        remaining.push((await check.lag('xform', 'in')).reduce((n, l) => n + l.lag, 0));
        await check.close();
      } else {
        const code = await life.exit;
        assert.equal(code, 0, `worker failed: ${life.output()}`);
        done = life.output().includes('done');
      }
    }
    assert.ok(kills >= KILLS, `only ${kills} kills`);
    // The killed lives did real work (committed transactions), so kills landed amid transactions.
    assert.ok(remaining.length > 0 && remaining[remaining.length - 1]! < INPUT, `no progress while being killed: ${remaining.join(',')}`);

    const log = openEmbeddedLog({ dir });
    try {
      const offsets = await log.offsets('out');
      const total = offsets.reduce((n, o) => n + o.high, 0);
      const reader = await log.consumer({ groupId: 'verify', topics: ['out'] });
      const got = await pollUntil(reader, total, 20_000);
      const outIds = got.map((r) => r.value.toString('utf8', 0, 16).trim());
      assert.equal(got.length, INPUT, `out holds ${got.length} records for ${INPUT} inputs`);
      assert.deepEqual([...new Set(outIds)].sort(), ids);
      assert.deepEqual((await log.lag('xform', 'in')).map((l) => l.lag), [0, 0]);
    } finally {
      await log.close();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

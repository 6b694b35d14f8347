// The main job's configuration in the distributed shape: rollout, reward, advantage and trainer each in its
// own `rlstream worker` process on a Kafka broker, with the HTTP schema registry. The rollout role evaluates
// held-out problems as policy versions arrive; their rewards, read back from the log, must rise.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { newId } from '../../core/ids.ts';
import { openKafkaLog } from '../../core/log/kafka/index.ts';
import { HttpSchemaRegistry } from '../../core/serde/http-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { silentLogger } from '../../core/telemetry.ts';
import { TOPICS } from '../../core/topics.ts';
import { PrivateBroker } from '../../testkit/kafka-broker.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const CONFIG = join(import.meta.dirname, 'fixtures', 'config.yaml');
const registryUrl = process.env['SCHEMA_REGISTRY_URL'];
const missing = !registryUrl || !PrivateBroker.libs() ? 'needs the schema registry (SCHEMA_REGISTRY_URL) and the Kafka jars (bash infra/setup.sh)' : null;
if (missing && process.env['RLSTREAM_REQUIRE_SERVICES'] === '1') throw new Error(`distributed learning test: ${missing}`);

function role(name: string, brokers: string, sets: string[]): { child: ChildProcess; out: () => string; exit: Promise<number | null> } {
  const child = spawn(process.execPath, ['--import', 'tsx', join(ROOT, 'cli/main.ts'), 'worker', name, CONFIG, ...sets], {
    cwd: ROOT,
    env: { ...process.env, E2E_KAFKA: brokers, RLSTREAM_LOG_LEVEL: 'warn' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out = (out + d.toString()).slice(-4000)));
  child.stderr!.on('data', (d: Buffer) => (out = (out + d.toString()).slice(-4000)));
  return { child, out: () => out, exit: new Promise((r) => child.on('exit', (code) => r(code))) };
}

test('distributed roles on Kafka: held-out reward rises over a few steps', { skip: missing ?? false, timeout: 480_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-e2e-'));
  const broker = await PrivateBroker.start(join(dir, 'kafka'));
  const runId = `e2e-${newId().slice(0, 8)}`;
  const sets = ['--set', `run.id=${runId}`, '--set', `run.data_dir=${join(dir, 'data')}`];
  const roles = ['trainer', 'reward', 'advantage', 'rollout'].map((r) => ({ name: r, ...role(r, broker.brokers, sets) }));
  // A role that fails while the others start (e.g. while the fresh broker elects its first leaders) is
  // restarted, as a supervisor would; its output is kept for the failure message.
  const failures: string[] = [];
  let finished = false;
  const supervise = (i: number) => {
    const r = roles[i]!;
    void r.exit.then((code) => {
      if (finished || r.name === 'trainer' || code === 0 || failures.length > 6) return;
      failures.push(`${r.name} exited ${code}: ${r.out().slice(-600)}`);
      roles[i] = { name: r.name, ...role(r.name, broker.brokers, sets) };
      supervise(i);
    });
  };
  roles.forEach((_, i) => supervise(i));
  const log = await openKafkaLog({ kind: 'kafka', brokers: [broker.brokers], clientId: 'e2e-audit' }, silentLogger);
  try {
    const serde = await new EventSerde(new HttpSchemaRegistry({ url: registryUrl! })).init();
    const trainer = roles[0]!;
    const code = await Promise.race([trainer.exit, sleep(420_000, 'timeout' as const, { ref: false })]);
    assert.equal(code, 0, `trainer did not finish its steps: ${trainer.out()}\nrestarted roles: ${failures.join('\n')}`);
    for (const f of failures) process.stdout.write(`# restarted: ${f.replace(/\n/g, ' ').slice(0, 400)}\n`);
    // Held-out accuracy by the policy version that generated it, from the rewarded stream.
    const byVersion = new Map<number, { correct: number; total: number }>();
    const consumer = await log.consumer({ groupId: `${runId}.audit`, topics: [TOPICS.rewarded], fromBeginning: true });
    const deadline = Date.now() + 120_000;
    while (Date.now() < deadline && [...byVersion.entries()].filter(([v]) => v >= 4).reduce((n, [, e]) => n + e.total, 0) < 60) {
      for (const r of await consumer.poll({ maxRecords: 2000, timeoutMs: 1000 })) {
        const d = await serde.decode(r.value);
        if (d.name !== 'RewardedTrajectory' || d.value.trajectory.run_id !== runId || d.value.trajectory.dataset.split !== 'heldout') continue;
        const v = d.value.trajectory.max_policy_version;
        const e = byVersion.get(v) ?? { correct: 0, total: 0 };
        e.total++;
        if (d.value.reward.correct) e.correct++;
        byVersion.set(v, e);
      }
    }
    await consumer.close();
    const curve = [...byVersion.entries()].sort((a, b) => a[0] - b[0]).map(([v, e]) => ({ version: v, accuracy: e.correct / e.total, n: e.total }));
    process.stdout.write(`# held-out accuracy by policy version: ${JSON.stringify(curve)}\n`);
    // An evaluation spans policy swaps, so its problems spread over neighbouring versions: pool them.
    const pooled = (keep: (v: number) => boolean) => {
      const sel = [...byVersion.entries()].filter(([v]) => keep(v)).map(([, e]) => e);
      const total = sel.reduce((n, e) => n + e.total, 0);
      return { accuracy: sel.reduce((n, e) => n + e.correct, 0) / Math.max(1, total), total };
    };
    const before = pooled((v) => v <= 1);
    const after = pooled((v) => v >= 4);
    assert.equal(curve[0]!.version, 0, 'the warm start is evaluated');
    assert.ok(before.total >= 20 && after.total >= 20, `enough held-out problems on both sides: ${JSON.stringify(curve)}`);
    assert.ok(after.accuracy >= before.accuracy + 0.1, `held-out accuracy rose by at least 10 points (${before.accuracy.toFixed(3)} -> ${after.accuracy.toFixed(3)}): ${JSON.stringify(curve)}`);
  } finally {
    finished = true;
    for (const r of roles) r.child.kill('SIGKILL');
    await Promise.all(roles.map((r) => r.exit));
    await log.close();
    await broker.halt();
    rmSync(dir, { recursive: true, force: true });
  }
});

// Kill/restart of each consumer: child processes killed with SIGKILL at random moments (≥ 10 kills each), then
// a final run to the end; every input must have produced exactly one output (and every poison record exactly
// one dead letter). killTests registers them on one log: processor-restart.test.ts on Kafka (KAFKA_BROKERS), run
// one at a time with the other fault tests; processor-restart-embedded.test.ts on the embedded log, which runs
// beside another file (it only needs the disk).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fork } from 'node:child_process';
import { join } from 'node:path';
import { appendFileSync } from 'node:fs';
import { newId } from '../../core/ids.ts';
import { openLog, type LogConfig } from '../../core/log/open.ts';
import type { EventLog, ProduceRecord } from '../../core/log/types.ts';
import type { EventSerde } from '../../core/serde/events.ts';
import { completed, newSerde, rewarded, tempDir, trajectory } from '../../testkit/events.ts';

const WORKER = join(import.meta.dirname, 'processor-worker.ts');
const KILLS = 12;

function kafkaConfig(): LogConfig | null {
  const brokers = process.env['KAFKA_BROKERS'];
  return brokers ? { kind: 'kafka', brokers: brokers.split(',') } : null;
}

function runWorker(cfg: object, killAfterMs?: number): Promise<{ code: number | null; signal: string | null; stdout: string }> {
  return new Promise((resolve, reject) => {
    const child = fork(WORKER, [JSON.stringify(cfg)], { execArgv: ['--import', 'tsx'], stdio: ['ignore', 'pipe', 'pipe', 'ipc'] });
    let stdout = '';
    let stderr = '';
    child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    let timer: NodeJS.Timeout | undefined;
    if (killAfterMs !== undefined) child.once('message', () => (timer = setTimeout(() => child.kill('SIGKILL'), killAfterMs)));
    child.on('error', reject);
    child.on('exit', (code, signal) => {
      if (timer) clearTimeout(timer);
      if (signal === null && code !== 0) reject(new Error(`worker exited ${code}: ${stderr.slice(-2000)}`));
      else resolve({ code, signal, stdout });
    });
  });
}

/** Every committed record of a topic, decoded: event ids and the trajectory ids / dead-letter offsets. */
async function readAll(log: EventLog, serde: EventSerde, topic: string): Promise<{ ids: string[]; keys: string[] }> {
  const consumer = await log.consumer({ groupId: `verify-${newId()}`, topics: [topic], readCommitted: true });
  const ids: string[] = [];
  const keys: string[] = [];
  let empty = 0;
  while (empty < 3) {
    const batch = await consumer.poll({ maxRecords: 1000, timeoutMs: 300 });
    if (batch.length === 0) empty++;
    for (const r of batch) {
      const ev = await serde.decode(r.value);
      const v = ev.value as { event_id: string; trajectory?: { trajectory_id: string }; source_offset?: number; source_partition?: number };
      ids.push(v.event_id);
      keys.push(v.trajectory?.trajectory_id ?? `${v.source_partition}@${v.source_offset}`);
      if (process.env['RLSTREAM_DUMP']) appendFileSync(process.env['RLSTREAM_DUMP'], JSON.stringify({ p: r.partition, o: r.offset, id: v.event_id, k: keys[keys.length - 1], t: (v as { time_ms?: number }).time_ms, g: (v as { group?: unknown }).group }) + '\n');
    }
  }
  await consumer.close();
  return { ids, keys };
}

function assertExactlyOnce(keys: string[], expected: Set<string>, what: string): void {
  const counts = new Map<string, number>();
  for (const k of keys) counts.set(k, (counts.get(k) ?? 0) + 1);
  const dup = [...counts].filter(([, n]) => n > 1);
  const missing = [...expected].filter((k) => !counts.has(k));
  const extra = [...counts.keys()].filter((k) => !expected.has(k));
  assert.deepEqual({ dup: dup.slice(0, 5), missing: missing.slice(0, 5), extra: extra.slice(0, 5) }, { dup: [], missing: [], extra: [] }, what);
  assert.equal(keys.length, expected.size, what);
}

/** Shuffle within a sliding window so groups interleave (several open at once) while staying partition-local. */
function interleave<T>(xs: T[], window: number, seed: number): T[] {
  let s = seed;
  const rand = () => ((s = (s * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  const out = [...xs];
  for (let i = 0; i < out.length; i++) {
    const j = Math.min(out.length - 1, i + Math.floor(rand() * window));
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

async function killLoop(cfg: object, seed: number): Promise<number> {
  let s = seed;
  const rand = () => ((s = (s * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  let kills = 0;
  for (let i = 0; i < KILLS; i++) {
    const r = await runWorker(cfg, 150 + Math.floor(rand() * 1400));
    if (r.signal === 'SIGKILL') kills++;
  }
  return kills;
}

export function killTests(kind: 'embedded' | 'kafka'): void {
  const skip = kind === 'kafka' && !kafkaConfig() ? (process.env['RLSTREAM_REQUIRE_SERVICES'] === '1' ? false : 'KAFKA_BROKERS is not set') : false;

  test(`reward consumer: SIGKILL at random moments (${kind}), no output lost or duplicated`, { skip, timeout: 300_000 }, async (tc) => {
    if (kind === 'kafka' && !kafkaConfig()) assert.fail('KAFKA_BROKERS is not set and RLSTREAM_REQUIRE_SERVICES=1');
    const serde = await newSerde();
    const config: LogConfig = kind === 'embedded' ? { kind: 'embedded', dir: tempDir('reward-kill') } : kafkaConfig()!;
    const suffix = newId().slice(0, 8);
    const topics = { input: `t-in-${suffix}`, output: `t-out-${suffix}`, deadLetter: `t-dlq-${suffix}` };
    const log = await openLog(config);
    // A failed assertion must not leave the Kafka client open: it would hold the test file until its timeout.
    if (kind === 'kafka') tc.after(() => log.close().catch(() => {}));
    for (const t of Object.values(topics)) await log.createTopic({ name: t, partitions: 3 });
    const expected = new Set<string>();
    const records: ProduceRecord[] = [];
    for (let g = 0; g < 250; g++) {
      for (let i = 0; i < 8; i++) {
        const poison = g % 50 === 7 && i === 0;
        const t = trajectory({ groupId: `g${g}`, index: i, tokens: 300, dataSource: poison ? 'throws' : 'gsm8k' });
        records.push({ key: t.group_id, value: serde.encode('TrajectoryCompleted', completed(t)) });
        if (!poison) expected.add(t.trajectory_id);
      }
      if (g % 60 === 3) records.push({ key: `g${g}`, value: Buffer.from([0, 0, 0, 0, 99, 1, 2]) }); // unknown schema id
    }
    for (let i = 0; i < records.length; i += 500) await log.producer().then(async (p) => (await p.send(topics.input, records.slice(i, i + 500)), await p.close()));
    if (kind === 'embedded') await log.close();

    const cfg = { role: 'reward', id: `reward-${suffix}`, log: config, topics, batch: 40 };
    const kills = await killLoop(cfg, 11);
    assert.ok(kills >= 10, `only ${kills} workers were killed`);
    await runWorker({ ...cfg, untilIdle: true });

    const check = kind === 'embedded' ? await openLog(config) : log;
    if (kind === 'embedded') tc.after(() => check.close().catch(() => {}));
    const out = await readAll(check, serde, topics.output);
    assertExactlyOnce(out.keys, expected, 'rewarded outputs');
    assert.equal(new Set(out.ids).size, out.ids.length);
    const dlq = await readAll(check, serde, topics.deadLetter);
    assert.equal(dlq.keys.length, 5 + 5, `dead letters: ${dlq.keys.join(' ')}`); // 5 throwing rewards, 5 unknown schema ids
    assert.equal(new Set(dlq.keys).size, dlq.keys.length);
    await check.close();
  });

  test(`advantage consumer: SIGKILL at random moments with interleaved and partial groups (${kind}), exactly once`, { skip, timeout: 300_000 }, async (tc) => {
    if (kind === 'kafka' && !kafkaConfig()) assert.fail('KAFKA_BROKERS is not set and RLSTREAM_REQUIRE_SERVICES=1');
    const serde = await newSerde();
    const config: LogConfig = kind === 'embedded' ? { kind: 'embedded', dir: tempDir('adv-kill') } : kafkaConfig()!;
    const suffix = newId().slice(0, 8);
    const topics = { input: `t-in-${suffix}`, output: `t-out-${suffix}`, deadLetter: `t-dlq-${suffix}` };
    const log = await openLog(config);
    // A failed assertion must not leave the Kafka client open: it would hold the test file until its timeout.
    if (kind === 'kafka') tc.after(() => log.close().catch(() => {}));
    for (const t of Object.values(topics)) await log.createTopic({ name: t, partitions: 3 });
    const expected = new Set<string>();
    const events: ProduceRecord[] = [];
    // One write time for all: a group's age is its first member's timestamp on the partition's clock, so complete
    // groups can only close complete, however slowly a restarted worker reads; the short ones close at the end.
    const writtenAt = Date.now();
    for (let g = 0; g < 250; g++) {
      // Every 25th group is missing members: it can only close on its timeout, as a partial group.
      const present = g % 25 === 5 ? 5 : 8;
      for (let i = 0; i < present; i++) {
        const t = trajectory({ groupId: `g${g}`, index: i, tokens: 200 });
        events.push({ key: t.group_id, value: serde.encode('RewardedTrajectory', rewarded(t, i % 3 === 0 ? 1 : 0)), timestamp: writtenAt });
        expected.add(t.trajectory_id);
      }
    }
    const p = await log.producer();
    const mixed = interleave(events, 40, 5);
    for (let i = 0; i < mixed.length; i += 500) await p.send(topics.input, mixed.slice(i, i + 500));
    await p.close();
    if (kind === 'embedded') await log.close();

    const cfg = { role: 'advantage', id: `adv-${suffix}`, log: config, topics, batch: 30, groupTimeoutMs: 1500, partialGroups: 'emit' };
    const kills = await killLoop(cfg, 23);
    assert.ok(kills >= 10, `only ${kills} workers were killed`);
    await runWorker({ ...cfg, untilIdle: true });

    const check = kind === 'embedded' ? await openLog(config) : log;
    if (kind === 'embedded') tc.after(() => check.close().catch(() => {}));
    const out = await readAll(check, serde, topics.output);
    assertExactlyOnce(out.keys, expected, 'advantaged outputs');
    assert.equal(new Set(out.ids).size, out.ids.length);
    await check.close();
  });
}

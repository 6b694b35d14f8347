// Disk use of a long run stays bounded: the trainer deletes the weights of policy versions nothing can still
// need (keeping every version a record not yet trained names), keeps its last checkpoints, and the record
// topics take retention. A trainer-only run of 500 steps on a tiny model is the cheap, faithful shape of a
// long run: the same weights store, checkpoints, transactions and embedded log, with sizes scaled down
// (segments, journal and retention) so that their limits are reached within the run.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ensureTopics, openRunTraces } from '../../cli/run/context.ts';
import { compileRunConfig, ConfigError } from '../../cli/config/run-config.ts';
import { TRACE_TABLES } from '../../core/traces/store.ts';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { TOPICS } from '../../core/topics.ts';
import { Trainer } from '../../consumers/trainer/trainer.ts';
import { mustKeepVersion, pruneWeights, storeWeights } from '../../consumers/trainer/weights-store.ts';
import type { PolicyVersion } from '../../schemas/generated/types.ts';
import { advantagedRecords, syntheticGroup, tinyTrainer, trainerInputs, writeInitialWeights } from './fixtures/synthetic.ts';

/** Bytes allocated on disk under `dir` (what `du` counts). */
function diskBytes(dir: string): number {
  if (!existsSync(dir)) return 0;
  let n = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    n += e.isDirectory() ? diskBytes(p) : statSync(p).blocks * 512;
  }
  return n;
}

const RUN = 'disk-test';
const SEGMENT = 16 * 1024;
const JOURNAL = 256 * 1024;
const RETENTION = 64 * 1024;

interface Measured {
  bytes: number[];
  weightsFile: number;
  checkpoint: number;
  dataDir: string;
}

/** Train `steps` steps, each on a fresh group of the trainer's current version; measure disk every `every` steps. */
async function longRun(dir: string, steps: number, every: number, retention: boolean): Promise<Measured> {
  const logDir = join(dir, 'log');
  const dataDir = join(dir, 'data');
  const log = openEmbeddedLog({ dir: logDir, segmentBytes: SEGMENT, journalMaxBytes: JOURNAL, retentionCheckMs: 0, fsync: 'none' });
  await ensureTopics(log, retention ? { maxBytes: RETENTION, maxAgeMs: null } : { maxBytes: null, maxAgeMs: null });
  const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
  const producer = await log.producer();
  const send = (g: number, version: number) => producer.send(TOPICS.advantaged, advantagedRecords(serde, syntheticGroup(RUN, g, 2, version)));
  const weights = join(dir, 'init.safetensors');
  await writeInitialWeights(weights);
  // Two groups ahead of the trainer, each generated at the version current when it is sent.
  await send(0, 0);
  await send(1, 0);
  let next = 2;
  let pending: Promise<unknown> = Promise.resolve();
  const bytes: number[] = [];
  const trainer: Trainer = tinyTrainer(
    { log, serde, runId: RUN, dataDir, weights },
    { max_steps: steps, groups_per_step: 1, staleness_bound: 2, keep_checkpoints: 2, keep_versions: retention ? 2 : 1_000_000 },
    {
      followControl: false,
      onStep: (s) => {
        const version = s.produced_version ?? s.policy_version;
        pending = pending.then(() => send(next++, version));
        if (s.step % every === 0) bytes.push(diskBytes(dir));
      },
    },
  );
  await trainer.start();
  await trainer.run();
  await pending;
  await trainer.close();
  await producer.close();
  await log.close();
  const ckpt = readdirSync(join(dataDir, 'trainer'))[0]!;
  return { bytes, weightsFile: statSync(weights).blocks * 512, checkpoint: diskBytes(join(dataDir, 'trainer', ckpt)), dataDir };
}

test('500 training steps stay under a stated disk bound with the default retention, and grow past it without', { timeout: 300_000 }, async () => {
  const STEPS = 500;
  const EVERY = 50;
  const on = mkdtempSync(join(tmpdir(), 'rlstream-disk-on-'));
  const off = mkdtempSync(join(tmpdir(), 'rlstream-disk-off-'));
  try {
    const kept = await longRun(on, STEPS, EVERY, true);
    const all = await longRun(off, STEPS, EVERY, false);
    // The bound, stated: the weights of the kept versions (staleness window of 3, version 0, one spare),
    // the kept checkpoints plus one being written, per record-topic partition its retention plus the active
    // and the rolling segment, the journal's limit and its checkpoint, the schemas, and the small topics
    // (train.steps, policy.versions: kept whole, a restart reads them) at 4 KiB a step.
    const partitions = 3 * 4;
    const bound = 5 * kept.weightsFile + 3 * kept.checkpoint + partitions * (RETENTION + 2 * SEGMENT) + 2 * JOURNAL + 64 * 1024 + STEPS * 4096;
    const last = kept.bytes.at(-1)!;
    const perStepOn = (last - kept.bytes[kept.bytes.length / 2 - 1]!) / (STEPS / 2);
    const perStepOff = (all.bytes.at(-1)! - all.bytes[all.bytes.length / 2 - 1]!) / (STEPS / 2);
    console.log(`disk after ${STEPS} steps: ${last} bytes with retention (bound ${bound}), ${all.bytes.at(-1)} without; second half ${perStepOn.toFixed(0)} vs ${perStepOff.toFixed(0)} bytes/step; weights ${kept.weightsFile}, checkpoint ${kept.checkpoint}`);
    console.log(`with retention every ${EVERY} steps: ${kept.bytes.join(' ')}`);
    console.log(`without retention every ${EVERY} steps: ${all.bytes.join(' ')}`);
    for (const b of kept.bytes) assert.ok(b <= bound, `disk ${b} bytes is over the bound ${bound}`);
    assert.ok(all.bytes.at(-1)! > bound, `without retention the run should outgrow the bound (${all.bytes.at(-1)} <= ${bound}): the test could not fail`);
    assert.ok(perStepOn < 4096, `with retention the run still grows ${perStepOn} bytes a step`);
    assert.ok(perStepOff > kept.weightsFile / 2, `without retention each step keeps its weights (${perStepOff} bytes a step)`);
    const files = readdirSync(join(kept.dataDir, 'weights')).filter((f) => f.endsWith('.safetensors'));
    assert.ok(files.length <= 4, `weights files kept: ${files.length}`);
  } finally {
    rmSync(on, { recursive: true, force: true });
    rmSync(off, { recursive: true, force: true });
  }
});

test('a version a record not yet trained names keeps its weights until that record is consumed; a file a kept version shares stays', { timeout: 60_000 }, async () => {
  // Group 0 of version 0, groups 1 and 2 of version 1, on one partition (read in the order sent). Step 1 trains
  // group 0 and publishes version 1; step 2 trains group 1 and publishes version 2, while group 2, read but not
  // consumed, still names version 1 (out of keep_versions = 1 and staleness_bound = 0); step 3 drops group 2 as
  // stale and publishes version 3 with unchanged weights, the same file as version 2.
  const { dir, logDir, weights } = await trainerInputs('disk-ref', RUN, [{ g: 0 }, { g: 1, version: 1 }, { g: 2, version: 1 }], 2);
  try {
    const log = openEmbeddedLog({ dir: logDir });
    const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
    const store = join(dir, 'data', 'weights');
    const after: Set<string>[] = [];
    const trainer = tinyTrainer({ log, serde, runId: RUN, dataDir: join(dir, 'data'), weights }, { max_steps: 3, groups_per_step: 1, staleness_bound: 0, keep_versions: 1 }, { followControl: false, onStep: () => after.push(new Set(readdirSync(store))) });
    await trainer.start();
    await trainer.run();
    await trainer.close();
    const c = await log.consumer({ groupId: 'audit', topics: [TOPICS.policyVersions] });
    const versions: PolicyVersion[] = [];
    for (const r of await c.poll({ maxRecords: 100, timeoutMs: 500 })) {
      const d = await serde.decode(r.value);
      if (d.name === 'PolicyVersion') versions.push(d.value);
    }
    await c.close();
    await log.close();
    assert.deepEqual(versions.map((v) => v.policy_version), [0, 1, 2, 3]);
    const file = (v: number) => `${versions[v]!.checksum}.safetensors`;
    assert.ok(after[1]!.has(file(1)), 'after step 2, version 1 stays: group 2, not yet consumed, names it');
    assert.ok(!after[2]!.has(file(1)), 'after step 3, group 2 consumed, version 1 is deleted');
    assert.equal(versions[3]!.checksum, versions[2]!.checksum, 'step 3 trained on nothing');
    assert.ok(after[2]!.has(file(2)), 'version 2 is out of the window, but its file is version 3\'s too');
    assert.ok(after[2]!.has(file(0)), 'version 0 stays');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('weights retention keeps the newest versions, the staleness window, referenced versions and version 0, and never a file a kept version shares', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-prune-'));
  try {
    const versions = new Map<number, string>();
    for (let v = 0; v <= 9; v++) {
      // Versions 6 and 7 have the same weights (a step that trained on nothing).
      const stored = await storeWeights(dir, (p) => writeFile(p, `weights ${v === 7 ? 6 : v}`));
      versions.set(v, stored.checksum);
    }
    const keep = { current: 9, keepVersions: 2, stalenessBound: 1, referenced: [[3, 4]] as const };
    assert.deepEqual([...versions.keys()].filter((v) => mustKeepVersion(v, { ...keep, referenced: [[3, 4]] })), [0, 3, 4, 8, 9]);
    const gone = await pruneWeights(dir, versions, (v) => mustKeepVersion(v, { ...keep, referenced: [[3, 4]] }));
    assert.deepEqual(gone.sort((a, b) => a - b), [1, 2, 5, 6, 7]);
    assert.equal(readdirSync(dir).length, 5);
    // Version 6 goes, but its file stays while version 7 (same checksum) is kept.
    const more = new Map([[6, 'a'], [7, 'a']]);
    await storeWeights(dir, (p) => writeFile(p, 'x')); // unrelated file, untouched
    assert.deepEqual(await pruneWeights(dir, more, (v) => v === 7), [6]);
    assert.deepEqual([...more.keys()], [7]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the retention settings are in the effective config (what `rlstream config print` prints), with their defaults', () => {
  const c = compileRunConfig({}, tmpdir());
  const effective = c.effective as Record<string, Record<string, unknown>>;
  assert.equal(effective['trainer']!['keep_versions'], 2);
  assert.equal(effective['trainer']!['keep_checkpoints'], 2);
  assert.equal(effective['log']!['retention_bytes'], 512 * 1024 * 1024);
  assert.equal(effective['log']!['retention_ms'], null);
  assert.equal(effective['traces']!['ttl_days'], null);
  assert.deepEqual(c.log.retention, { maxBytes: 512 * 1024 * 1024, maxAgeMs: null });
  const k = compileRunConfig({ log: { kind: 'kafka', brokers: 'localhost:9092', retention_bytes: null, retention_ms: 86_400_000 } }, tmpdir());
  assert.deepEqual(k.log.retention, { maxBytes: null, maxAgeMs: 86_400_000 });
});

test('traces.ttl_days is refused for a ClickHouse server store, naming the field and the fix', () => {
  assert.throws(
    () => compileRunConfig({ traces: { kind: 'clickhouse', url: 'http://localhost:8123', ttl_days: 7 } }, tmpdir()),
    (err: Error) => err instanceof ConfigError && /traces\.ttl_days/.test(err.message) && /18\.16/.test(err.message) && /chdb/.test(err.message),
  );
  assert.doesNotThrow(() => compileRunConfig({ traces: { kind: 'clickhouse', url: 'http://localhost:8123' } }, tmpdir()));
});

test('traces.ttl_days sets a TTL on every chDB trace table at start, and null removes it', { timeout: 120_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-ttl-'));
  try {
    const ttlOf = async (ttlDays: number | null) => {
      const store = (await openRunTraces(compileRunConfig({ traces: { kind: 'chdb', dir, ttl_days: ttlDays } }, tmpdir())))!;
      try {
        const r = await store.query(`SELECT name, engine_full FROM system.tables WHERE database = 'rlstream'`);
        return new Map(r.rows.map((row) => [String(row['name']), String(row['engine_full'])]));
      } finally {
        await store.close();
      }
    };
    const on = await ttlOf(7);
    for (const t of TRACE_TABLES) assert.match(on.get(t) ?? '', /TTL toDateTime\(time\) \+ toIntervalDay\(7\)/, t);
    const off = await ttlOf(null);
    for (const t of TRACE_TABLES) assert.doesNotMatch(off.get(t) ?? '', /\bTTL\b/, t);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the run creates the record topics with the configured retention and keeps the small topics whole', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-topics-'));
  try {
    const log = openEmbeddedLog({ dir });
    await ensureTopics(log, compileRunConfig({ log: { retention_bytes: 4096, retention_ms: 60_000 } }, tmpdir()).log.retention);
    const specs = new Map((await log.listTopics()).map((t) => [t.name, t.retention]));
    await log.close();
    for (const t of [TOPICS.rolloutEvents, TOPICS.rewarded, TOPICS.advantaged]) assert.deepEqual(specs.get(t), { maxBytes: 4096, maxAgeMs: 60_000 }, t);
    for (const t of [TOPICS.policyVersions, TOPICS.trainSteps, TOPICS.control, TOPICS.deadLetter]) assert.equal(specs.get(t)?.maxBytes ?? null, null, t);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

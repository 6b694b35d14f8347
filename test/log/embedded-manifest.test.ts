// The damage matrix of the embedded log against its manifest: on a log closed by its writer, every damage a
// failing disk or a careless user does (a segment deleted, truncated to half, cut by 7 bytes, its last 10 bytes
// flipped, cut at a record boundary, replaced by a directory or by another log's segment of the same length; a
// partition or topic directory deleted; a stale LOCK of a live unrelated process) is refused by a read-write
// open with the exact offsets lost and the repair command, reported by a check with the exact ranges and nothing
// written, listed by the repair with the same ranges; the repaired log opens, every intact record is read at its
// offset, new records continue after the last offset ever written, and a check then finds nothing. Generated
// cases (seeded random cuts and flips at random bytes) hold the same. Expected ranges are computed from the
// record frames in the files before the damage, never taken from the log's own report.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, truncateSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { crc32 } from 'node:zlib';
import { join } from 'node:path';
import { isRlstreamError } from '../../core/errors.ts';
import { describeDamage } from '../../core/log/embedded/damage-report.ts';
import { type DamageReport, type EmbeddedLog, openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { checkLog, repairLog } from '../../core/log/embedded/repair.ts';
import { rng } from '../../core/random.ts';
import type { LogRecord } from '../../core/log/types.ts';
import { pollFor } from './conformance.ts';

const SEGMENT_BYTES = 16 * 1024;
/** Records per partition of the fixture: t/0 spans several segments, t/1 fewer, s/0 (a small topic) two records. */
const SIZES: Record<string, number[]> = { t: [700, 300], s: [2] };

function value(topic: string, partition: number, i: number, salt = ''): Buffer {
  return Buffer.from(`${salt}${topic}-${partition}-record-${i}-`.padEnd(120, 'x'));
}

function open(dir: string, options: { readOnly?: boolean } = {}): EmbeddedLog {
  return openEmbeddedLog({ dir, segmentBytes: SEGMENT_BYTES, ...options });
}

async function build(dir: string, salt = ''): Promise<void> {
  const log = open(dir);
  for (const [topic, sizes] of Object.entries(SIZES)) {
    await log.createTopic({ name: topic, partitions: sizes.length });
    const p = await log.producer();
    for (const [part, n] of sizes.entries()) {
      for (let i = 0; i < n; i += 50) await p.send(topic, Array.from({ length: Math.min(50, n - i) }, (_, k) => ({ value: value(topic, part, i + k, salt), partition: part })));
    }
    await p.close();
  }
  const c = await log.consumer({ groupId: 'g', topics: ['t'] });
  await c.seek('t', 0, 650);
  await c.seek('t', 1, 300);
  await c.commit();
  await c.close();
  await log.close();
}

let fixture: string | null = null;
/** A fresh copy of the fixture log (built once). */
async function fresh(): Promise<string> {
  if (!fixture) {
    fixture = mkdtempSync(join(tmpdir(), 'rlstream-manifest-fixture-'));
    await build(fixture);
  }
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-manifest-'));
  cpSync(fixture, dir, { recursive: true });
  return dir;
}

function pdir(dir: string, topic: string, partition: number): string {
  return join(dir, 'topics', topic, String(partition));
}

function segments(dir: string, topic: string, partition: number): string[] {
  return readdirSync(pdir(dir, topic, partition))
    .filter((f) => /^\d{20}\.log$/.test(f))
    .sort()
    .map((f) => join(pdir(dir, topic, partition), f));
}

interface Frame {
  offset: number;
  start: number;
  end: number;
}

function frames(file: string): Frame[] {
  const buf = readFileSync(file);
  const out: Frame[] = [];
  for (let pos = 0; pos + 8 <= buf.length; pos += 8 + buf.readUInt32BE(pos)) out.push({ offset: buf.readUInt32BE(pos + 12), start: pos, end: pos + 8 + buf.readUInt32BE(pos) });
  return out;
}

/** The offset after a segment's last record: the next segment's base, or the partition's end. */
function segmentEnd(dir: string, topic: string, partition: number, file: string): number {
  const segs = segments(dir, topic, partition);
  const i = segs.indexOf(file);
  return i + 1 < segs.length ? frames(segs[i + 1]!)[0]!.offset : SIZES[topic]![partition]!;
}

type Range = [topic: string, partition: number, from: number, to: number];

function ranges(gaps: DamageReport['foundNow']): Range[] {
  return gaps.map((g): Range => [g.topic, g.partition, g.fromOffset, g.toOffset ?? -1]).sort((a, b) => a[0].localeCompare(b[0]) || a[1] - b[1] || a[2] - b[2]);
}

function snapshot(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (d: string) => {
    for (const f of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, f.name);
      if (f.isDirectory()) {
        out[p] = 'dir';
        walk(p);
      } else out[p] = `${statSync(p).mtimeMs} ${createHash('sha256').update(readFileSync(p)).digest('hex')}`;
    }
  };
  walk(dir);
  return out;
}

async function readTopic(log: EmbeddedLog, topic: string): Promise<LogRecord[]> {
  const c = await log.consumer({ groupId: `read-${Math.random()}`, topics: [topic] });
  const got = await pollFor(c, 300);
  await c.close();
  return got;
}

function lostSet(expected: Range[]): Set<string> {
  const s = new Set<string>();
  for (const [t, p, from, to] of expected) for (let o = from; o < to; o++) s.add(`${t}/${p}/${o}`);
  return s;
}

/**
 * The whole check of one damage: refused with every range, checked read-only with the exact ranges and no byte
 * written, repaired with the same ranges, then every intact record read at its offset, appends after the last
 * offset ever written, committed offsets kept, and a clean check.
 */
async function assertMatrixRow(dir: string, expected: Range[], options: { extra?: RegExp } = {}): Promise<void> {
  const described = expected.map(([t, p, from, to]) => `${to - from === 1 ? `offset ${from}` : `offsets ${from} to ${to - 1}`} of ${t}/${p} are lost`);
  assert.throws(
    () => open(dir),
    (e) => {
      assert.ok(isRlstreamError(e, 'LOG_CORRUPT'), `LOG_CORRUPT expected, got ${String(e)}`);
      for (const d of described) assert.ok(e.message.includes(d), `the refusal says "${d}": ${e.message}`);
      assert.match(e.message, /Run `rlstream log repair [^`]+`/);
      return true;
    },
  );
  const before = snapshot(dir);
  const checked = await checkLog(dir);
  assert.deepEqual(ranges(checked.foundNow), expected, 'check reports exactly the ranges lost');
  assert.ok(describeDamage(checked, 'check').problems > 0, 'check fails');
  if (options.extra) assert.ok(checked.extra.some((x) => options.extra!.test(`${x.file}: ${x.reason}`)), `check lists ${options.extra}`);
  assert.deepEqual(snapshot(dir), before, 'check writes nothing');
  const repaired = await repairLog(dir);
  assert.deepEqual(ranges(repaired.foundNow), expected, 'repair lists exactly the ranges lost');
  assert.ok(!describeDamage(repaired, 'repair').lines.some((l) => /^0 range/.test(l)));
  const log = open(dir);
  try {
    const lost = lostSet(expected);
    for (const [topic, sizes] of Object.entries(SIZES)) {
      const got = await readTopic(log, topic);
      const want = sizes.flatMap((n, p) => Array.from({ length: n }, (_, o) => [p, o] as const).filter(([, o]) => !lost.has(`${topic}/${p}/${o}`)));
      assert.deepEqual(
        got.map((r) => [r.partition, r.offset]).sort((a, b) => a[0]! - b[0]! || a[1]! - b[1]!),
        want.map(([p, o]) => [p, o]),
        `every intact record of ${topic} is read, nothing else`,
      );
      for (const r of got) assert.ok(r.value.equals(value(topic, r.partition, r.offset)), `${topic}/${r.partition}@${r.offset} holds its own value`);
      // Offsets are never given out twice: the next record goes after the last one ever written.
      assert.deepEqual(
        (await log.offsets(topic)).map((o) => o.high),
        sizes,
      );
    }
    assert.deepEqual(
      (await log.committed('g', 't')).map((c) => c.offset),
      [650, 300],
      'committed offsets stay where the group left them',
    );
  } finally {
    await log.close();
  }
  const after = await checkLog(dir);
  assert.deepEqual(after.foundNow, [], 'a check after the repair finds nothing new');
  assert.equal(describeDamage(after, 'check').problems, 0, describeDamage(after, 'check').lines.join('\n'));
  assert.deepEqual(ranges(after.gaps), expected, 'and lists what the repair accepted');
}

async function withDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await fresh();
  try {
    await fn(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('the fixture: several segments per partition, a clean check, a manifest that lists each segment', async () => {
  await withDir(async (dir) => {
    assert.ok(segments(dir, 't', 0).length >= 5, `${segments(dir, 't', 0).length} segments in t/0`);
    const manifest = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8')) as { clean: boolean; topics: Record<string, { partitions: { segments: { base: number; next: number; bytes: number }[] }[] }> };
    assert.equal(manifest.clean, true);
    const listed = manifest.topics['t']!.partitions[0]!.segments;
    assert.deepEqual(
      listed.map((s) => [s.base, s.bytes]),
      segments(dir, 't', 0).map((f) => [frames(f)[0]!.offset, statSync(f).size]),
    );
    assert.equal(listed[listed.length - 1]!.next, 700);
    const report = await checkLog(dir);
    assert.equal(describeDamage(report, 'check').problems, 0);
  });
});

test('a segment deleted (the middle one, the active one, the only one of a small topic)', async () => {
  await withDir(async (dir) => {
    const segs = segments(dir, 't', 0);
    const gone = segs[2]!;
    const range: Range = ['t', 0, frames(gone)[0]!.offset, segmentEnd(dir, 't', 0, gone)];
    for (const ext of ['.log', '.index', '.timeindex']) unlinkSync(gone.replace(/\.log$/, ext));
    await assertMatrixRow(dir, [range]);
  });
  await withDir(async (dir) => {
    const segs = segments(dir, 't', 0);
    const gone = segs[segs.length - 1]!;
    const range: Range = ['t', 0, frames(gone)[0]!.offset, 700];
    for (const ext of ['.log', '.index', '.timeindex']) unlinkSync(gone.replace(/\.log$/, ext));
    await assertMatrixRow(dir, [range]);
  });
  await withDir(async (dir) => {
    const [only] = segments(dir, 's', 0);
    for (const ext of ['.log', '.index', '.timeindex']) unlinkSync(only!.replace(/\.log$/, ext));
    await assertMatrixRow(dir, [['s', 0, 0, 2]]);
  });
});

test('a segment truncated to half, cut by 7 bytes, or with its last 10 bytes flipped (active and sealed)', async () => {
  const damages: [string, (file: string) => void, (fs: Frame[], size: number) => number][] = [
    // What each damage leaves: the first record it touches, whose offset starts the loss.
    ['truncated to half', (f) => truncateSync(f, Math.floor(statSync(f).size / 2)), (fs, size) => fs.find((x) => x.end > Math.floor(size / 2))!.offset],
    ['cut by 7 bytes', (f) => truncateSync(f, statSync(f).size - 7), (fs) => fs[fs.length - 1]!.offset],
    [
      'last 10 bytes flipped',
      (f) => {
        const b = readFileSync(f);
        for (let i = b.length - 10; i < b.length; i++) b[i]! ^= 0xff;
        writeFileSync(f, b);
      },
      (fs) => fs[fs.length - 1]!.offset,
    ],
  ];
  for (const [name, damage, firstLost] of damages) {
    for (const which of ['active', 'sealed'] as const) {
      await withDir(async (dir) => {
        const segs = segments(dir, 't', 0);
        const file = which === 'active' ? segs[segs.length - 1]! : segs[1]!;
        const from = firstLost(frames(file), statSync(file).size);
        const to = segmentEnd(dir, 't', 0, file);
        damage(file);
        await assertMatrixRow(dir, [['t', 0, from, to]]).catch((err: unknown) => {
          throw new Error(`${name}, ${which} segment: ${(err as Error).message}`, { cause: err });
        });
      });
    }
  }
});

test('a sealed segment cut at a record boundary (every frame left valid) still loses exactly the records cut', async () => {
  await withDir(async (dir) => {
    const file = segments(dir, 't', 0)[2]!;
    const fs = frames(file);
    truncateSync(file, fs[10]!.start);
    await assertMatrixRow(dir, [['t', 0, fs[10]!.offset, segmentEnd(dir, 't', 0, file)]]);
  });
});

test('a partition directory or a topic directory deleted', async () => {
  await withDir(async (dir) => {
    rmSync(pdir(dir, 't', 1), { recursive: true });
    await assertMatrixRow(dir, [['t', 1, 0, 300]]);
  });
  await withDir(async (dir) => {
    rmSync(join(dir, 'topics', 's'), { recursive: true });
    await assertMatrixRow(dir, [['s', 0, 0, 2]]);
  });
});

test('a segment replaced by a directory: a clear error, not EISDIR; repair moves the directory aside', async () => {
  await withDir(async (dir) => {
    const file = segments(dir, 't', 0)[3]!;
    const range: Range = ['t', 0, frames(file)[0]!.offset, segmentEnd(dir, 't', 0, file)];
    unlinkSync(file);
    mkdirSync(file);
    writeFileSync(join(file, 'something'), 'x');
    await assertMatrixRow(dir, [range], { extra: /is a directory where a segment file belongs/ });
    assert.ok(existsSync(`${file}.quarantine/something`), 'the directory is kept, moved aside');
  });
});

test("a segment replaced by another log's segment of the same length (every frame valid): its checksum gives it away", async () => {
  const other = mkdtempSync(join(tmpdir(), 'rlstream-manifest-other-'));
  try {
    // The same records but for one byte in each value: same lengths, same offsets, other bytes.
    await build(other, 'X');
    await withDir(async (dir) => {
      const file = segments(dir, 't', 0)[1]!;
      const foreign = join(pdir(other, 't', 0), file.split('/').pop()!);
      assert.equal(statSync(foreign).size, statSync(file).size);
      const range: Range = ['t', 0, frames(file)[0]!.offset, segmentEnd(dir, 't', 0, file)];
      cpSync(foreign, file);
      // A plain open trusts the sealed segment's indexes and length, so it opens: a check reads every byte.
      const plain = open(dir);
      await plain.close();
      const before = snapshot(dir);
      const checked = await checkLog(dir);
      assert.deepEqual(ranges(checked.foundNow), [range]);
      assert.match(checked.foundNow[0]!.reason, /replaced by another file: its CRC-32 is 0x[0-9a-f]{8}, 0x[0-9a-f]{8} was written/);
      assert.deepEqual(snapshot(dir), before);
      const repaired = await repairLog(dir);
      assert.deepEqual(ranges(repaired.foundNow), [range]);
      assert.ok(existsSync(`${file}.quarantine`), 'the foreign segment is kept aside');
      const log = open(dir);
      const got = await readTopic(log, 't');
      assert.ok(got.every((r) => r.value.equals(value('t', r.partition, r.offset))), 'no record of the other log is read');
      assert.equal(got.length, 1000 - (range[3] - range[2]));
      await log.close();
      assert.equal(describeDamage(await checkLog(dir), 'check').problems, 0);
    });
  } finally {
    rmSync(other, { recursive: true, force: true });
  }
});

test('an extra segment the log never wrote is refused, reported, and moved aside by repair with nothing lost', async () => {
  await withDir(async (dir) => {
    const [src] = segments(dir, 't', 1);
    const extra = join(pdir(dir, 't', 1), `${String(5000).padStart(20, '0')}.log`);
    cpSync(src!, extra);
    assert.throws(() => open(dir), (e) => isRlstreamError(e, 'LOG_CORRUPT') && e.message.includes(`${extra}: a segment the manifest does not list`));
    const checked = await checkLog(dir);
    assert.deepEqual(checked.foundNow, []);
    assert.deepEqual(
      checked.extra.map((x) => x.file),
      [extra],
    );
    assert.ok(describeDamage(checked, 'check').problems > 0);
    const repaired = await repairLog(dir);
    assert.deepEqual(
      repaired.extra.map((x) => [x.file, x.quarantine]),
      [[extra, `${extra}.quarantine`]],
    );
    const log = open(dir);
    assert.equal((await readTopic(log, 't')).length, 1000);
    await log.close();
    assert.equal(describeDamage(await checkLog(dir), 'check').problems, 0);
  });
});

function spawnIdle(): ChildProcess {
  return spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], { stdio: 'ignore' });
}

test('a stale LOCK naming a live unrelated process: reported with the fix, taken over by repair; a LOCK of a live holder is never broken', async () => {
  await withDir(async (dir) => {
    const unrelated = spawnIdle();
    try {
      writeFileSync(join(dir, 'LOCK'), `${unrelated.pid}\n`);
      assert.throws(
        () => open(dir),
        (e) => isRlstreamError(e, 'LOG_LOCKED') && /running but has no file of this log open/.test(e.message) && /Run `rlstream log repair [^`]+` to take it over/.test(e.message),
      );
      const checked = await checkLog(dir);
      assert.equal(checked.lock?.state, 'stale');
      assert.equal(checked.lock?.pid, unrelated.pid);
      assert.ok(describeDamage(checked, 'check').lines.some((l) => /^stale LOCK: /.test(l)));
      assert.ok(describeDamage(checked, 'check').problems > 0);
      const repaired = await repairLog(dir);
      assert.equal(repaired.lock?.pid, unrelated.pid);
      assert.deepEqual(repaired.foundNow, []);
      const log = open(dir);
      assert.equal((await readTopic(log, 't')).length, 1000);
      await log.close();
      assert.equal(describeDamage(await checkLog(dir), 'check').problems, 0);
      assert.equal(unrelated.exitCode, null, 'the unrelated process was left alone');
    } finally {
      unrelated.kill('SIGKILL');
    }
  });
  // A real holder: another process with the log open. Neither an open nor a repair takes its lock.
  await withDir(async (dir) => {
    const script = `import { openEmbeddedLog } from ${JSON.stringify(join(import.meta.dirname, '../../core/log/embedded/index.ts'))};\nopenEmbeddedLog({ dir: ${JSON.stringify(dir)} }); console.log('open'); setInterval(() => {}, 1000);`;
    const holder = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
    try {
      await new Promise<void>((resolve, reject) => {
        holder.stdout!.on('data', (d: Buffer) => d.toString().includes('open') && resolve());
        holder.on('exit', (code) => reject(new Error(`holder exited ${code}`)));
      });
      assert.throws(() => open(dir), (e) => isRlstreamError(e, 'LOG_LOCKED') && /has the log open/.test(e.message));
      await assert.rejects(repairLog(dir), (e) => isRlstreamError(e, 'LOG_LOCKED'));
      assert.equal((await checkLog(dir)).lock?.state, 'held');
    } finally {
      holder.kill('SIGKILL');
    }
  });
});

test('generated damage: seeded random cuts and flips at random bytes of random segments, each loss found exactly', async () => {
  for (let seed = 1; seed <= 16; seed++) {
    const random = rng(seed);
    await withDir(async (dir) => {
      const topic = 't';
      const partition = random() < 0.7 ? 0 : 1;
      const segs = segments(dir, topic, partition);
      // The active segment a third of the time: there a loss at the end is no longer taken for a torn tail.
      const file = random() < 0.35 ? segs[segs.length - 1]! : segs[Math.floor(random() * segs.length)]!;
      const fs = frames(file);
      const size = statSync(file).size;
      const end = segmentEnd(dir, topic, partition, file);
      const last = file === segs[segs.length - 1];
      let expected: Range[];
      let what: string;
      if (random() < 0.5) {
        // Half the cuts at a record boundary, where every frame left is valid and only the manifest knows better.
        const at = random() < 0.5 ? fs[Math.floor(random() * fs.length)]!.start : Math.floor(random() * size);
        truncateSync(file, at);
        const first = fs.find((f) => f.end > at)!;
        expected = [[topic, partition, first.offset, end]];
        what = `cut at byte ${at} of ${size}`;
      } else {
        // Flips in distinct records, none in the last one (damage there leaves nothing valid after it: the
        // loss then runs to the segment's end, the case above).
        const count = 1 + Math.floor(random() * 4);
        const hit = new Set<number>();
        while (hit.size < Math.min(count, fs.length - 1)) hit.add(Math.floor(random() * (fs.length - 1)));
        const b = readFileSync(file);
        for (const i of hit) b[fs[i]!.start + 8 + Math.floor(random() * (fs[i]!.end - fs[i]!.start - 8))]! ^= 1 + Math.floor(random() * 255);
        writeFileSync(file, b);
        const offsets = [...hit].sort((x, y) => x - y).map((i) => fs[i]!.offset);
        expected = [];
        for (const o of offsets) {
          const prev = expected[expected.length - 1];
          if (prev && prev[3] === o) prev[3] = o + 1;
          else expected.push([topic, partition, o, o + 1]);
        }
        what = `flipped records ${offsets.join(', ')}`;
      }
      const context = `seed ${seed}: ${topic}/${partition} ${last ? 'active' : 'sealed'} segment ${file.split('/').pop()} ${what}`;
      const checked = await checkLog(dir);
      assert.deepEqual(ranges(checked.foundNow), expected, context);
      const repaired = await repairLog(dir);
      assert.deepEqual(ranges(repaired.foundNow), expected, context);
      const log = open(dir);
      const got = await readTopic(log, topic);
      const lost = lostSet(expected);
      assert.equal(got.length, 1000 - lost.size, context);
      for (const r of got) assert.ok(!lost.has(`${topic}/${r.partition}/${r.offset}`) && r.value.equals(value(topic, r.partition, r.offset)), context);
      assert.deepEqual(
        (await log.offsets(topic)).map((o) => o.high),
        SIZES[topic],
        context,
      );
      await log.close();
      assert.equal(describeDamage(await checkLog(dir), 'check').problems, 0, context);
    });
  }
});

test('a log written before the manifest opens, says so in its check, and is recorded from its first read-write open on', async () => {
  await withDir(async (dir) => {
    // What an older rlstream left: no manifest.json, meta.json without the marker.
    unlinkSync(join(dir, 'manifest.json'));
    for (const t of Object.keys(SIZES)) writeFileSync(join(dir, 'topics', t, 'meta.json'), JSON.stringify({ name: t, partitions: SIZES[t]!.length }));
    const old = await checkLog(dir);
    assert.equal(old.manifest, 'predates');
    assert.ok(describeDamage(old, 'check').lines.some((l) => /written by an older rlstream/.test(l)));
    assert.equal(describeDamage(old, 'check').problems, 0);
    const log = open(dir);
    assert.equal((await readTopic(log, 't')).length, 1000);
    await log.close();
    assert.ok(existsSync(join(dir, 'manifest.json')));
    assert.equal((JSON.parse(readFileSync(join(dir, 'topics', 't', 'meta.json'), 'utf8')) as { manifest?: boolean }).manifest, true);
    // From now on a loss is found as in any other log, and deleting the manifest does not make it an old log.
    const segs = segments(dir, 't', 0);
    for (const ext of ['.log', '.index', '.timeindex']) unlinkSync(segs[segs.length - 1]!.replace(/\.log$/, ext));
    const found = await checkLog(dir);
    assert.deepEqual(ranges(found.foundNow), [['t', 0, frames(segs[segs.length - 2]!)[0]!.offset + frames(segs[segs.length - 2]!).length, 700]]);
    unlinkSync(join(dir, 'manifest.json'));
    assert.throws(() => open(dir), (e) => isRlstreamError(e, 'LOG_CORRUPT') && /manifest\.json: is missing, yet the topics were written with one/.test(e.message));
    assert.equal((await checkLog(dir)).manifest, 'missing');
    assert.ok(describeDamage(await checkLog(dir), 'check').problems > 0);
  });
});

/** The fixture's topic t written by a process killed (SIGKILL) instead of closing: its last rolls may be unlisted. */
async function buildKilled(dir: string): Promise<void> {
  const script = `
    import { openEmbeddedLog } from ${JSON.stringify(join(import.meta.dirname, '../../core/log/embedded/index.ts'))};
    const log = openEmbeddedLog({ dir: ${JSON.stringify(dir)}, segmentBytes: ${SEGMENT_BYTES} });
    await log.createTopic({ name: 't', partitions: 1 });
    const p = await log.producer();
    for (let i = 0; i < 700; i += 50) await p.send('t', Array.from({ length: 50 }, (_, k) => ({ value: Buffer.from(\`t-0-record-\${i + k}-\`.padEnd(120, 'x')), partition: 0 })));
    process.kill(process.pid, 'SIGKILL');`;
  const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { stdio: ['ignore', 'ignore', 'inherit'] });
  assert.equal(await new Promise((resolve) => child.on('exit', (_code, signal) => resolve(signal))), 'SIGKILL');
}

test('a writer killed after rolls its manifest does not list yet: its segments are its own, and a segment deleted among them is still found exactly', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-manifest-killed-'));
  try {
    await buildKilled(dir);
    const segs = segments(dir, 't', 0);
    const listed = (JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8')) as { clean: boolean; topics: Record<string, { partitions: { segments: unknown[] }[] }> }).topics['t']!.partitions[0]!.segments.length;
    assert.ok(segs.length >= 5, `${segs.length} segments, ${listed} listed`);
    const checked = await checkLog(dir);
    assert.deepEqual(checked.foundNow, []);
    assert.deepEqual(checked.extra, []);
    assert.equal(checked.closedCleanly, false);
    // A segment deleted before the last: listed or not, the gap it leaves is found with its exact range.
    const gone = segs[segs.length - 2]!;
    const range: Range = ['t', 0, frames(gone)[0]!.offset, frames(segs[segs.length - 1]!)[0]!.offset];
    for (const ext of ['.log', '.index', '.timeindex']) unlinkSync(gone.replace(/\.log$/, ext));
    assert.throws(() => open(dir), (e) => isRlstreamError(e, 'LOG_CORRUPT') && e.message.includes(`offsets ${range[2]} to ${range[3] - 1} of t/0 are lost`));
    assert.deepEqual(ranges((await checkLog(dir)).foundNow), [range]);
    assert.deepEqual(ranges((await repairLog(dir)).foundNow), [range]);
    const log = open(dir);
    const got = await readTopic(log, 't');
    assert.equal(got.length, 700 - (range[3] - range[2]));
    assert.ok(got.every((r) => r.value.equals(value('t', 0, r.offset))));
    await log.close();
    assert.equal(describeDamage(await checkLog(dir), 'check').problems, 0);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a killed writer noted its high-water marks: on the same boot a cut below them is a loss with its exact range, not a torn tail; after a reboot the manifest alone decides', async () => {
  for (const reboot of [false, true]) {
    const dir = mkdtempSync(join(tmpdir(), 'rlstream-manifest-written-'));
    try {
      // Killed right after its last append: its marks were noted with each append, its manifest lists less.
      await buildKilled(dir);
      const marks = JSON.parse(readFileSync(join(dir, 'written.json'), 'utf8')) as { bootId: string; highs: [string, number, number][] };
      assert.deepEqual(marks.highs, [['t', 0, 700]]);
      const segs = segments(dir, 't', 0);
      const active = segs[segs.length - 1]!;
      const fs = frames(active);
      const cut = fs[Math.floor(fs.length / 2)]!;
      truncateSync(active, cut.start + 3);
      if (reboot) writeFileSync(join(dir, 'written.json'), JSON.stringify({ ...marks, bootId: 'another-boot' }));
      const checked = await checkLog(dir);
      if (reboot) {
        // Without the marks a cut after the manifest's entries may be a machine crash's torn tail.
        assert.deepEqual(checked.foundNow, []);
        continue;
      }
      assert.deepEqual(ranges(checked.foundNow), [['t', 0, cut.offset, 700]]);
      assert.throws(() => open(dir), (e) => isRlstreamError(e, 'LOG_CORRUPT') && e.message.includes(`offsets ${cut.offset} to 699 of t/0 are lost`));
      assert.deepEqual(ranges((await repairLog(dir)).foundNow), [['t', 0, cut.offset, 700]]);
      const log = open(dir);
      assert.deepEqual(await log.offsets('t'), [{ partition: 0, low: 0, high: 700 }]);
      assert.equal((await readTopic(log, 't')).length, cut.offset);
      await log.close();
      assert.equal(describeDamage(await checkLog(dir), 'check').problems, 0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }
});

test('a killed writer whose every segment file is deleted: the loss runs to the last record it wrote, and offsets go on after it', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-manifest-allgone-'));
  try {
    await buildKilled(dir);
    const listed = (JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8')) as { topics: Record<string, { partitions: { segments: { next: number }[] }[] }> }).topics['t']!.partitions[0]!.segments;
    // The manifest lists fewer records than were written: only the marks say where the loss ends.
    assert.ok(listed[listed.length - 1]!.next < 700, `the manifest lists up to ${listed[listed.length - 1]!.next}`);
    for (const seg of segments(dir, 't', 0)) unlinkSync(seg);
    assert.deepEqual(ranges((await checkLog(dir)).foundNow), [['t', 0, 0, 700]]);
    assert.deepEqual(ranges((await repairLog(dir)).foundNow), [['t', 0, 0, 700]]);
    const log = open(dir);
    assert.deepEqual(await log.offsets('t'), [{ partition: 0, low: 700, high: 700 }]);
    const p = await log.producer();
    assert.equal((await p.send('t', [{ value: Buffer.from('after'), partition: 0 }]))[0]!.offset, 700);
    await log.close();
    assert.equal(describeDamage(await checkLog(dir), 'check').problems, 0);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a writer killed between noting an append and writing it: with its files there the append is cut by the kill, not damage; with every segment file deleted, or the files cut below the mark, the append is listed as lost too, and offsets go on after it', async () => {
  for (const damage of ['none', 'deleted', 'cut'] as const) {
    const dir = mkdtempSync(join(tmpdir(), 'rlstream-manifest-inflight-'));
    try {
      await buildKilled(dir);
      // The note an append makes before its segment write (written.ts): 4 more records under way at the kill.
      const marks = JSON.parse(readFileSync(join(dir, 'written.json'), 'utf8')) as { bootId: string; highs: unknown[] };
      assert.deepEqual(marks.highs, [['t', 0, 700]], 'after its last append a writer notes no append under way');
      const highs = [['t', 0, 700, 704]];
      writeFileSync(join(dir, 'written.json'), JSON.stringify({ bootId: marks.bootId, crc: crc32(JSON.stringify(highs)), highs }));
      if (damage === 'none') {
        assert.deepEqual((await checkLog(dir)).foundNow, [], 'the files end where the note says the append began');
        const log = open(dir);
        assert.deepEqual(await log.offsets('t'), [{ partition: 0, low: 0, high: 700 }]);
        await log.close();
        continue;
      }
      let from = 0;
      if (damage === 'deleted') for (const seg of segments(dir, 't', 0)) unlinkSync(seg);
      else {
        const segs = segments(dir, 't', 0);
        const active = segs[segs.length - 1]!;
        const cut = frames(active)[Math.floor(frames(active).length / 2)]!;
        truncateSync(active, cut.start + 3);
        from = cut.offset;
      }
      const checked = await checkLog(dir);
      assert.deepEqual(ranges(checked.foundNow), [['t', 0, from, 704]]);
      // (a cut inside a frame is reported as the truncated frame, its range running to the append under way)
      if (damage === 'deleted') assert.match(describeDamage(checked, 'check').lines.join('\n'), /offsets 700\.\.703 were being appended when it stopped/);
      assert.deepEqual(ranges((await repairLog(dir)).foundNow), [['t', 0, from, 704]]);
      const log = open(dir);
      assert.deepEqual(await log.offsets('t'), [{ partition: 0, low: damage === 'deleted' ? 704 : 0, high: 704 }]);
      const p = await log.producer();
      assert.equal((await p.send('t', [{ value: Buffer.from('after'), partition: 0 }]))[0]!.offset, 704);
      assert.equal((await readTopic(log, 't')).length, from + 1, 'the records before the loss and the new one');
      await log.close();
      assert.equal(describeDamage(await checkLog(dir), 'check').problems, 0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }
});

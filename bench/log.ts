// Event-log throughput: produce and consume rates (records/s, MB/s) and produce latency (p50/p99) for 8 KiB
// records, one table row per target. Targets are a list: the embedded log with each fsync policy here; the
// Kafka side adds its rows by pushing to `targets` (see LogTarget) or calling benchLog().
// What a row measures is labelled, since the figures differ by orders of magnitude for that reason alone:
// - storage: whether the produce path waits for the disk (fsync) or only writes to the page cache, and that
//   every consume here reads records just written, from the page cache, never from the disk;
// - latency: ours is per send() call of `batch` records, Kafka's tools' per record (send to ack); the two are
//   not compared as a ratio.
// Targets run in interleaved rounds (bench/harness.ts) with a machine-speed probe before each; a row is the
// median of its rounds per column, with every round in the report.
// 100,000 records by default (~820 MB a target and round), so that a page-cache produce or consume lasts about
// two seconds here rather than a fraction of one.
//   npm run bench -- log [records] [batch] [--rounds 3] [--quick]   (--quick: 2,000 records, 2 rounds)
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { openEmbeddedLog } from '../core/log/embedded/index.ts';
import type { EventLog } from '../core/log/types.ts';
import { kafkaTargets } from './log-kafka.ts';
import { int, parseFlags, ROUND_FLAGS } from './flags.ts';
import { fmtStats, interleaved, probeSummary, stats, summarize } from './harness.ts';
import { runTopic } from './kafka-topics.ts';

export interface BenchOptions {
  records: number;
  recordBytes: number;
  batch: number;
  partitions: number;
}

export interface BenchRow {
  target: string;
  records: number;
  recordBytes: number;
  batch: number;
  produceRecordsPerSec: number;
  produceMBPerSec: number;
  /** Null where no figure applies (the ratio row: per-call and per-record latencies are not comparable). */
  produceP50Ms: number | null;
  produceP99Ms: number | null;
  /** What one latency sample is: one send() call of `batch` records, or one record from send to ack. */
  latencyPer?: string;
  /** What the produce and consume paths touch: the disk, or only the page cache. */
  storage?: string;
  consumeRecordsPerSec: number;
  consumeMBPerSec: number;
}

/** A row source: either an EventLog to drive with benchLog, or a function measuring on its own (perf tools). */
export interface LogTarget {
  label: string;
  /** Skip (with this reason) when the target cannot run here, e.g. no broker address in env. */
  unavailable?: () => string | null;
  open?: () => Promise<{ log: EventLog; cleanup(): Promise<void> }>;
  run?: (options: BenchOptions) => Promise<BenchRow>;
  /** What the row's produce and consume paths touch (see BenchRow.storage). */
  storage?: string;
}

function quantile(sorted: number[], q: number): number {
  return sorted.length === 0 ? NaN : sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
}

/** Produce then consume `records` records through an EventLog; the topic is new and random. */
export async function benchLog(log: EventLog, label: string, o: BenchOptions): Promise<BenchRow> {
  const topic = runTopic('bench', randomBytes(4).toString('hex'));
  await log.createTopic({ name: topic, partitions: o.partitions });
  const producer = await log.producer();
  const value = randomBytes(o.recordBytes);
  const latencies: number[] = [];
  const t0 = performance.now();
  for (let sent = 0; sent < o.records; sent += o.batch) {
    const n = Math.min(o.batch, o.records - sent);
    const records = Array.from({ length: n }, (_, i) => ({ key: `k${(sent + i) % 1024}`, value }));
    const s = performance.now();
    await producer.send(topic, records);
    latencies.push(performance.now() - s);
  }
  const produceSec = (performance.now() - t0) / 1000;
  await producer.close();

  const consumer = await log.consumer({ groupId: `bench-${topic}`, topics: [topic] });
  let got = 0;
  let bytes = 0;
  const t1 = performance.now();
  const deadline = Date.now() + 120_000;
  while (got < o.records && Date.now() < deadline) {
    const rs = await consumer.poll({ maxRecords: 1000, timeoutMs: 1000 });
    got += rs.length;
    for (const r of rs) bytes += r.value.length;
  }
  const consumeSec = (performance.now() - t1) / 1000;
  await consumer.close();
  if (got < o.records) throw new Error(`${label}: consumed ${got} of ${o.records} records`);
  latencies.sort((a, b) => a - b);
  const mb = (o.records * o.recordBytes) / 1e6;
  return {
    target: label,
    records: o.records,
    recordBytes: o.recordBytes,
    batch: o.batch,
    produceRecordsPerSec: Math.round(o.records / produceSec),
    produceMBPerSec: +(mb / produceSec).toFixed(1),
    produceP50Ms: +quantile(latencies, 0.5).toFixed(3),
    produceP99Ms: +quantile(latencies, 0.99).toFixed(3),
    latencyPer: `send() of ${o.batch}`,
    consumeRecordsPerSec: Math.round(got / consumeSec),
    consumeMBPerSec: +(bytes / 1e6 / consumeSec).toFixed(1),
  };
}

/** Where the embedded log's produce path waits, by fsync policy (core/log/embedded/options.ts). */
const EMBEDDED_STORAGE = {
  always: 'produce: disk (fsync each send); consume: page cache',
  transaction: 'produce: page cache (plain sends reach the disk at segment roll/checkpoint); consume: page cache',
  none: 'produce: page cache only; consume: page cache',
} as const;

function embeddedTarget(fsync: 'always' | 'transaction' | 'none'): LogTarget {
  return {
    label: `embedded (fsync ${fsync})`,
    storage: EMBEDDED_STORAGE[fsync],
    open: async () => {
      const dir = mkdtempSync(join(tmpdir(), 'rlstream-bench-'));
      const log = openEmbeddedLog({ dir, fsync });
      return { log, cleanup: async () => (await log.close(), rmSync(dir, { recursive: true, force: true })) };
    },
  };
}

/** The rows of the table, in order. Kafka targets are appended here by the Kafka side. */
export const targets: LogTarget[] = [embeddedTarget('transaction'), embeddedTarget('always'), embeddedTarget('none'), ...kafkaTargets()];

export function printTable(rows: BenchRow[]): void {
  const head = ['target', 'records', 'batch', 'produce rec/s', 'produce MB/s', 'p50 ms', 'p99 ms', 'latency per', 'consume rec/s', 'consume MB/s'];
  const body = rows.map((r) => [r.target, r.records, r.batch, r.produceRecordsPerSec, r.produceMBPerSec, r.produceP50Ms ?? '-', r.produceP99Ms ?? '-', r.latencyPer ?? '-', r.consumeRecordsPerSec, r.consumeMBPerSec].map(String));
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((b) => b[i]!.length)));
  const line = (cells: string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
  console.log(line(head));
  console.log(widths.map((w) => '-'.repeat(w)).join('  '));
  for (const b of body) console.log(line(b));
  const storage = rows.filter((r) => r.storage);
  if (storage.length > 0) {
    console.log('storage touched (every consume reads records just written):');
    for (const r of storage) console.log(`  ${r.target}: ${r.storage}`);
  }
}

/** A row of medians: each column the median of that target's rounds. */
function medianRow(rows: BenchRow[]): BenchRow {
  const med = (f: (r: BenchRow) => number | null) => {
    const xs = rows.map(f).filter((x): x is number => x !== null);
    return xs.length ? +stats(xs).median.toFixed(3) : null;
  };
  const first = rows[0]!;
  return {
    ...first,
    produceRecordsPerSec: med((r) => r.produceRecordsPerSec)!,
    produceMBPerSec: med((r) => r.produceMBPerSec)!,
    produceP50Ms: med((r) => r.produceP50Ms),
    produceP99Ms: med((r) => r.produceP99Ms),
    consumeRecordsPerSec: med((r) => r.consumeRecordsPerSec)!,
    consumeMBPerSec: med((r) => r.consumeMBPerSec)!,
  };
}

async function runTarget(t: LogTarget, options: BenchOptions): Promise<BenchRow> {
  let row: BenchRow;
  if (t.run) row = await t.run(options);
  else if (t.open) {
    const { log, cleanup } = await t.open();
    try {
      row = await benchLog(log, t.label, options);
    } finally {
      await cleanup();
    }
  } else throw new Error(`target ${t.label} has neither run nor open`);
  return t.storage ? { ...row, storage: t.storage } : row;
}

/** Targets in interleaved rounds; the median row of each, and every round for the report. */
export async function benchTargets(list: LogTarget[], options: BenchOptions, rounds: number): Promise<{ rows: BenchRow[]; skipped: Record<string, string>; rounds: unknown[]; machineSpeed: unknown; ranges: Record<string, unknown> }> {
  const skipped: Record<string, string> = {};
  const available = list.filter((t) => {
    const why = t.unavailable?.() ?? null;
    if (why) skipped[t.label] = why;
    return !why;
  });
  const recs = await interleaved(available.map((t) => ({ name: t.label, run: () => runTarget(t, options) })), rounds);
  for (const r of recs) if (r.error) console.log(`round ${r.round + 1} ${r.mode}: FAILED\n${r.error}`);
  if (recs.some((r) => r.error)) process.exitCode = 1;
  const rows = available.map((t) => recs.filter((r) => r.mode === t.label && r.result).map((r) => r.result!)).filter((rs) => rs.length > 0).map(medianRow);
  const produce = summarize(recs, (r) => r.produceRecordsPerSec);
  const consume = summarize(recs, (r) => r.consumeRecordsPerSec);
  const ranges = Object.fromEntries(Object.keys(produce).map((k) => [k, { produceRecordsPerSec: produce[k], consumeRecordsPerSec: consume[k] }]));
  return { rows, skipped, rounds: recs, machineSpeed: probeSummary(recs), ranges };
}

export function printRanges(ranges: Record<string, unknown>, rounds: number): void {
  console.log(`median of ${rounds} interleaved rounds per column; records/s median [min–max]:`);
  for (const [k, v] of Object.entries(ranges)) {
    const x = v as { produceRecordsPerSec: ReturnType<typeof stats>; consumeRecordsPerSec: ReturnType<typeof stats> };
    const d = (st: ReturnType<typeof stats>) => (st.median < 100 ? 2 : 0); // the ratio row's figures are near 1
    console.log(`  ${k}: produce ${fmtStats(x.produceRecordsPerSec, d(x.produceRecordsPerSec))}, consume ${fmtStats(x.consumeRecordsPerSec, d(x.consumeRecordsPerSec))}`);
  }
}

/** `npm run bench -- log [records] [batch] [--rounds R] [--quick]`; defaults: 100,000 records of 8 KiB (~820 MB), batches of 100, 3 rounds. */
export async function main(args: string[] = []): Promise<unknown> {
  const { values: f, positional } = parseFlags(args, ROUND_FLAGS, { positionals: [['records', int(1)], ['batch', int(1)]] });
  const quick = f.quick === true;
  const rounds = f.rounds ?? (quick ? 2 : 3);
  const options: BenchOptions = { records: positional.records ?? (quick ? 2000 : 100_000), recordBytes: 8192, batch: positional.batch ?? 100, partitions: 4 };
  const r = await benchTargets(targets, options, rounds);
  printTable(r.rows);
  printRanges(r.ranges, rounds);
  for (const [label, why] of Object.entries(r.skipped)) console.log(`skipped ${label}: ${why}`);
  return { options: { ...options, rounds }, ...r };
}

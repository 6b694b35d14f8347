// Event-log throughput: produce and consume rates (records/s, MB/s) and produce latency (p50/p99 per send
// call) for 8 KiB records, one table row per target. Targets are a list: the embedded log with each fsync
// policy here; the Kafka side adds its rows by pushing to `targets` (see LogTarget) or calling benchLog().
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { openEmbeddedLog } from '../core/log/embedded/index.ts';
import type { EventLog } from '../core/log/types.ts';
import { kafkaTargets } from './log-kafka.ts';

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
  produceP50Ms: number;
  produceP99Ms: number;
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
}

function quantile(sorted: number[], q: number): number {
  return sorted.length === 0 ? NaN : sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
}

/** Produce then consume `records` records through an EventLog; the topic is new and random. */
export async function benchLog(log: EventLog, label: string, o: BenchOptions): Promise<BenchRow> {
  const topic = `bench-${randomBytes(4).toString('hex')}`;
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
    consumeRecordsPerSec: Math.round(got / consumeSec),
    consumeMBPerSec: +(bytes / 1e6 / consumeSec).toFixed(1),
  };
}

function embeddedTarget(fsync: 'always' | 'transaction' | 'none'): LogTarget {
  return {
    label: `embedded (fsync ${fsync})`,
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
  const head = ['target', 'records', 'batch', 'produce rec/s', 'produce MB/s', 'p50 ms', 'p99 ms', 'consume rec/s', 'consume MB/s'];
  const body = rows.map((r) => [r.target, r.records, r.batch, r.produceRecordsPerSec, r.produceMBPerSec, r.produceP50Ms, r.produceP99Ms, r.consumeRecordsPerSec, r.consumeMBPerSec].map(String));
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((b) => b[i]!.length)));
  const line = (cells: string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
  console.log(line(head));
  console.log(widths.map((w) => '-'.repeat(w)).join('  '));
  for (const b of body) console.log(line(b));
}

/** `npm run bench -- log [records] [batch]`; defaults: 20000 records of 8 KiB (~164 MB), batches of 100. */
export async function main(args: string[] = []): Promise<{ options: BenchOptions; rows: BenchRow[]; skipped: Record<string, string> }> {
  const options: BenchOptions = { records: Number(args[0] ?? 20_000), recordBytes: 8192, batch: Number(args[1] ?? 100), partitions: 4 };
  const rows: BenchRow[] = [];
  const skipped: Record<string, string> = {};
  for (const t of targets) {
    const why = t.unavailable?.() ?? null;
    if (why) {
      skipped[t.label] = why;
      continue;
    }
    if (t.run) rows.push(await t.run(options));
    else if (t.open) {
      const { log, cleanup } = await t.open();
      try {
        rows.push(await benchLog(log, t.label, options));
      } finally {
        await cleanup();
      }
    }
  }
  printTable(rows);
  for (const [label, why] of Object.entries(skipped)) console.log(`skipped ${label}: ${why}`);
  return { options, rows, skipped };
}

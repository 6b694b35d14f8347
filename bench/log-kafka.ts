// Kafka rows of the event-log benchmark (bench/log.ts adds them to its table): our EventLog on each client
// (kafkajs, librdkafka), Kafka's own perf tools (org.apache.kafka.tools.ProducerPerformance /
// ConsumerPerformance, from the broker's jars in .infra/) on the same broker, record size and count, and the ratio of the two (throughput only: our latency is
// per send() call of a batch, the tools' per record, so their latencies are shown side by side, not divided).
// The broker writes to the page cache and leaves flushing to the OS (Kafka's default): no row waits for the disk.
// `npm run bench -- log-kafka [records] [batch] [--rounds 3] [--quick]` runs only these rows.
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { openKafkaLog } from '../core/log/kafka/index.ts';
import { rdKafkaAvailable } from '../core/log/kafka/librdkafka/binding.ts';
import type { KafkaClient } from '../core/log/kafka/options.ts';
// Types only at load: bench/log.ts imports this module to build its targets, so its functions are loaded
// lazily (a static import both ways breaks module initialisation order).
import type { BenchOptions, BenchRow, LogTarget } from './log.ts';
import { int, parseFlags, ROUND_FLAGS } from './flags.ts';
import { runTopic } from './kafka-topics.ts';

const KAFKA_STORAGE = 'produce: broker page cache (flushing left to the OS); consume: page cache';

const run = promisify(execFile);
const ROOT = join(import.meta.dirname, '..');

function brokers(): string[] {
  return (process.env['KAFKA_BROKERS'] ?? '').split(',').filter((b) => b);
}

function kafkaLibs(): string {
  const dir = process.env['RLSTREAM_INFRA_DIR'] ?? join(ROOT, '.infra');
  return join(dir, 'kafka', process.env['KAFKA_VERSION'] ?? '4.3.1', 'libs');
}

function noBroker(): string | null {
  return brokers().length === 0 ? 'KAFKA_BROKERS is not set (source infra/env.sh; infra/up.sh)' : null;
}

async function java(cls: string, args: string[]): Promise<string> {
  const { stdout } = await run('java', ['-Xmx512m', '-cp', `${kafkaLibs()}/*`, cls, ...args], { maxBuffer: 64 * 1024 * 1024, timeout: 300_000 });
  return stdout;
}

/** Kafka's own tools; their latency is per record (send to ack), ours per send() call of `batch` records. */
async function perfTools(o: BenchOptions, label: string, producerProps: string[]): Promise<BenchRow> {
  const bootstrap = brokers().join(',');
  const topic = runTopic('bench', `tools-${randomBytes(4).toString('hex')}`);
  const log = await openKafkaLog({ brokers: brokers() });
  await log.createTopic({ name: topic, partitions: o.partitions });
  await log.close();
  // Defaults of the Java producer (acks=all, idempotence on), as our producer runs. A fresh JVM is slow at
  // first (JIT, connections): a quarter more records go first as warm-up, and the steady-state line is the figure.
  // ConsumerPerformance has no such option: it reads them all, its rate taken over the fetch time.
  const warmup = Math.max(500, Math.round(o.records / 4));
  const prod = await java('org.apache.kafka.tools.ProducerPerformance', [
    '--topic', topic, '--num-records', String(o.records + warmup), '--warmup-records', String(warmup), '--record-size', String(o.recordBytes), '--throughput', '-1',
    '--producer-props', `bootstrap.servers=${bootstrap}`, 'acks=all', ...producerProps,
  ]);
  // "N [steady state ]records sent, R records/sec (M MB/sec), A ms avg latency, X ms max latency, P50 ms 50th, P95 ms 95th, P99 ms 99th, ..."
  const sent = prod.trim().split('\n').filter((l) => l.includes('records sent'));
  const last = sent.find((l) => l.includes('steady state')) ?? sent.pop() ?? '';
  const m = /([\d.]+) records\/sec \(([\d.]+) MB\/sec\).*?(\d+) ms 50th.*?(\d+) ms 99th/.exec(last);
  if (!m) throw new Error(`could not read ProducerPerformance output: ${prod.slice(-500)}`);
  const cons = await java('org.apache.kafka.tools.ConsumerPerformance', [
    '--bootstrap-server', bootstrap, '--topic', topic, '--messages', String(o.records + warmup), '--group', `bench-tools-${randomBytes(4).toString('hex')}`, '--timeout', '60000',
  ]);
  // header: start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms,
  // fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec. The fetch rate leaves out the group join, which our row
  // includes: the comparison is tilted toward the tool, on purpose.
  const row = cons.trim().split('\n').pop()!.split(',').map((s) => s.trim());
  const consumed = Number(row[4]);
  if (!(consumed >= o.records + warmup)) throw new Error(`ConsumerPerformance read ${row[4]} of ${o.records + warmup}: ${cons.slice(-500)}`);
  // Its MB are MiB; our table's MB are 10^6 bytes: convert through records/s.
  const consumeRecordsPerSec = Number(row[9]);
  const produceRecordsPerSec = Number(m[1]);
  return {
    target: label,
    records: o.records,
    recordBytes: o.recordBytes,
    batch: 1,
    produceRecordsPerSec: Math.round(produceRecordsPerSec),
    produceMBPerSec: +((produceRecordsPerSec * o.recordBytes) / 1e6).toFixed(1),
    produceP50Ms: Number(m[3]),
    produceP99Ms: Number(m[4]),
    latencyPer: 'record (send to ack)',
    consumeRecordsPerSec: Math.round(consumeRecordsPerSec),
    consumeMBPerSec: +((consumeRecordsPerSec * o.recordBytes) / 1e6).toFixed(1),
  };
}

/**
 * The Kafka rows: ours on each client (kafkajs; librdkafka once infra/setup.sh has built it), the perf tools'
 * (two settings), and ours divided by the better tools' throughput of the same round (target ≥ 0.5), per client.
 * The rows run in this order every round, so the ratio rows divide that round's figures.
 */
export function kafkaTargets(): LogTarget[] {
  const ours = new Map<KafkaClient, BenchRow>();
  const tools: BenchRow[] = [];
  const version = process.env['KAFKA_VERSION'] ?? '4.3.1';
  const clients: KafkaClient[] = ['kafkajs', 'librdkafka'];
  const unbuilt = () => (rdKafkaAvailable() ? null : 'librdkafka is not built (bash infra/setup.sh --kafka-native)');
  return [
    ...clients.map((client, i) => ({
      label: `kafka ${version} (our EventLog, ${client})`,
      unavailable: () => noBroker() ?? (client === 'librdkafka' ? unbuilt() : null),
      storage: KAFKA_STORAGE,
      run: async (o: BenchOptions) => {
        if (i === 0) {
          // A new round: the ratios compare with this round's rows only.
          tools.length = 0;
          ours.clear();
        }
        const log = await openKafkaLog({ brokers: brokers(), client, clientId: 'rlstream-bench' });
        try {
          const { benchLog } = await import('./log.ts');
          const row = await benchLog(log, `kafka ${version} (our EventLog, ${client})`, o);
          ours.set(client, row);
          return row;
        } finally {
          await log.close();
        }
      },
    })),
    ...(
      [
        // The Java producer's defaults (16 KiB batches: two 8 KiB records per batch), and batches as large as
        // the requests our producer sends (about 1 MiB), which is the fairer and harder comparison.
        ['defaults', []],
        ['batch.size=1MiB linger.ms=5', ['batch.size=1048576', 'linger.ms=5']],
      ] as const
    ).map(([what, props]) => ({
      label: `kafka ${version} (perf tools, ${what})`,
      unavailable: () => noBroker() ?? (existsSync(kafkaLibs()) ? null : `no Kafka jars in ${kafkaLibs()} (run infra/setup.sh)`),
      storage: KAFKA_STORAGE,
      run: async (o: BenchOptions) => {
        const row = await perfTools(o, `kafka ${version} perf tools (${what})`, [...props]);
        tools.push(row);
        return row;
      },
    })),
    ...clients.map((client) => ({
      label: `ratio ours (${client}) / best perf tools`,
      unavailable: () => noBroker() ?? (client === 'librdkafka' ? unbuilt() : null),
      run: async (o: BenchOptions): Promise<BenchRow> => {
        const mine = ours.get(client);
        if (!mine || tools.length === 0) throw new Error('the ratio row needs our row and a perf-tools row before it');
        // Against the faster of the perf-tool runs, per column.
        const best = (f: (r: BenchRow) => number) => Math.max(...tools.map(f));
        const r = (a: number, b: number) => +(a / b).toFixed(2);
        return {
          target: `ratio ours (${client}) / best perf tools`,
          records: o.records,
          recordBytes: o.recordBytes,
          batch: mine.batch,
          produceRecordsPerSec: r(mine.produceRecordsPerSec, best((t) => t.produceRecordsPerSec)),
          produceMBPerSec: r(mine.produceMBPerSec, best((t) => t.produceMBPerSec)),
          // Per send() call of a batch against per record: no meaningful ratio.
          produceP50Ms: null,
          produceP99Ms: null,
          consumeRecordsPerSec: r(mine.consumeRecordsPerSec, best((t) => t.consumeRecordsPerSec)),
          consumeMBPerSec: r(mine.consumeMBPerSec, best((t) => t.consumeMBPerSec)),
        };
      },
    })),
  ];
}

/** `npm run bench -- log-kafka [records] [batch] [--rounds R] [--quick]`: the Kafka rows only. */
export async function main(args: string[] = []): Promise<unknown> {
  const { values: f, positional } = parseFlags(args, ROUND_FLAGS, { positionals: [['records', int(1)], ['batch', int(1)]] });
  const quick = f.quick === true;
  const rounds = f.rounds ?? (quick ? 2 : 3);
  const options: BenchOptions = { records: positional.records ?? (quick ? 2000 : 20_000), recordBytes: 8192, batch: positional.batch ?? 100, partitions: 4 };
  const { benchTargets, printTable, printRanges } = await import('./log.ts');
  const r = await benchTargets(kafkaTargets(), options, rounds);
  printTable(r.rows);
  printRanges(r.ranges, rounds);
  for (const [label, why] of Object.entries(r.skipped)) console.log(`skipped ${label}: ${why}`);
  return { options: { ...options, rounds }, ...r };
}

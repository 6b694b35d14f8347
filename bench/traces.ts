// Trace store benchmark: sink throughput over a synthetic run of ≥ 1M turns, then the latency of every named
// query over that run; on chDB and, when CLICKHOUSE_URL is set, on the server.
// Throughput: rows/s counts the rows written to every table (one per event today), over the wall time of the
// sink's whole path from a decoded event to stored rows: rowsOf, TraceWriter.add (RowBinary encoding) and
// TraceWriter.flush (the engine's INSERTs). Only generating the synthetic events is left out (a chunk is
// generated before each timed stretch). MB/s is the binary payload handed to the engine (Native blocks where
// the addon is built, RowBinary otherwise). The process CPU
// time over the same stretches is reported too: on a shared machine it moves less with load than wall time.
// The engine's background merges count where they overlap the inserts; queries run right after the last one.
// Read rows/s as the general path's main-thread cost, not the sink's throughput: Avro decoding is not in it
// (events arrive decoded), the deployed sink transcodes most events natively instead of rowsOf + codec, and
// the engine's inserts overlap the untimed generation of the next chunk. Rows over the whole wall time
// (generation included) is printed beside it as the pessimistic bound.
// The sink itself is measured after that, end to end, which is the figure to read: a synthetic run is
// recorded into an embedded log (Avro, untimed), then the real TraceSink drains it into a fresh database (read,
// CRC checks, native transcoding of the planned events, INSERTs, offset commits) in a process of its own, as
// it runs deployed; rows/s is over the drain's wall time. The log's pages are written back to disk before the first
// drain, untimed: the recording leaves ~250 MB of them dirty, whose writeback would otherwise share the 2 cores
// with the drain (an effect not separated from this VM's noise when measured).
// The same log is drained with transcoding off too (decode, rowsOf, codec for every record), as the comparison.
// With the server as a target and KAFKA_BROKERS set, the log is also copied into Kafka (under topics of its own,
// untimed, schemas registered at SCHEMA_REGISTRY_URL) and the sink drains it from there into the server (the
// distributed shape), through each Kafka client (kafkajs, librdkafka). The copy's topics are deleted at the end,
// by main() itself, so also when it is called from a script rather than through bench/main.ts; with
// RLSTREAM_BENCH_KEEP_TOPICS=1 they are kept (their names printed), for bench/traces-sink-process.ts to drain again.
// The drains and the engine print where the CPU went, per row (bench/cpu.ts): the main thread, chDB's insert and merge threads,
// Node's other threads (GC, and libuv's pool, where chDB's queries start), a ClickHouse server on this machine, and the hypervisor's steal; their sum caps
// what the machine's cores can take at that cost. Merges still running when a drain ends are not in it.
// Last, the engine alone: a TraceWriter encodes and batches a synthetic run into a recorder (untimed), then
// only its INSERTs are timed (with the conversion of their rows to Native blocks, on libuv's pool, where the
// addon is built), flush by flush as the writer issued them (every table of a flush at once). It is the ceiling
// of any sink on that target and machine, whatever the client's decoding costs.
// Nothing is dropped until the end: the server's databases are dropped and the chDB directory removed after the
// last measurement. On this machine's ext4, creating files within minutes of deleting many costs several times
// more (the inode allocator skips each recently deleted inode, ext4's recently_deleted() in a profile of the
// server), and every insert creates a part's files, so a drain right after the previous phase's DROP is
// markedly slower (docs/benchmarks.md).
// For the same reason each timed mode first waits (up to two minutes) until no target runs merges: a mode's
// own merges count, the previous mode's do not. The wait is printed.
// Every phase above, on every target and source, is one of the harness's modes (bench/harness.ts): they run in
// interleaved rounds (each round: every mode of chDB, then every mode of the server), with a machine-speed probe
// before each, and a figure is the median [min–max] over rounds; a VM's speed moves from hour to hour (the same
// drain's CPU-µs a row ranged 6.4-9.5 here in one afternoon). The recording and the copy into Kafka are made
// once, untimed, before the first round; every drain reads them from the start into a fresh database.
// Usage: npm run bench -- traces [--rounds 3] [--turns 1000000] (0 skips the store path) [--tokens 24]
//                                [--targets chdb,server] [--batch-rows 250000]
//                                [--sink-turns 1000000] (0 skips the end-to-end sink)
//                                [--kafka-sink true|false] (default: true where KAFKA_BROKERS is set)
//                                [--engine-turns 300000] (0 skips the engine alone) [--quick]
// --sink-runs N is the older name of --rounds N. --quick: 2,000 turns in the store path, the sink's log and the
// engine, one round, no general-path drain, no Kafka unless --kafka-sink true: proves the benchmark runs, its
// figures mean nothing.
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { rdKafkaAvailable } from '../core/log/kafka/librdkafka/binding.ts';
import { openEmbeddedLog } from '../core/log/embedded/index.ts';
import { openLog } from '../core/log/open.ts';
import { openRegistryFor } from '../core/serde/open.ts';
import { TOPICS } from '../core/topics.ts';
import { ReplayJob } from '../consumers/replay/job.ts';
import { LogCopyTarget } from '../consumers/replay/targets.ts';
import { EmbeddedRegistry } from '../core/serde/embedded-registry.ts';
import { EventSerde } from '../core/serde/events.ts';
import { openTraceStore, parseStoreTarget } from '../core/traces/open.ts';
import { TRACE_TABLES, type TraceStore } from '../core/traces/store.ts';
import type { TableCodec } from '../core/traces/rowbinary.ts';
import { listNamedQueries, runNamed } from '../core/traces/queries.ts';
import type { DecodedEvent } from '../core/serde/events.ts';
import { rowsOf } from '../consumers/traces/rows.ts';
import { TraceWriter, type WriterOptions } from '../consumers/traces/writer.ts';
import { recordRun } from '../testkit/record-run.ts';
import { cpuReport, describeCpu, sampleCpu, type CpuReport } from './cpu.ts';
import { choice, FlagError, int, names, parseFlags, ROUND_FLAGS } from './flags.ts';
import { fmtStats, interleaved, probeSummary, summarize, type Mode } from './harness.ts';
import { deleteRunTopics, runTopic } from './kafka-topics.ts';
import { syntheticRun, syntheticTurnCount, type SyntheticRunOptions } from '../testkit/synthetic-run.ts';

const HERE = dirname(fileURLToPath(import.meta.url));

interface TargetReport {
  target: string;
  dialect: string;
  turns: number;
  rows: number;
  /** Wall time in the sink's path (rowsOf + add + flush). */
  seconds: number;
  /** Process CPU time over the same stretches (the engine's threads included on chDB, not the server's). */
  cpuSeconds: number;
  /** Including generation of the synthetic events. */
  totalSeconds: number;
  rowsPerSecond: number;
  mbPerSecond: number;
  queries: { name: string; rows: number; medianMs: number; maxMs: number }[];
}

/** A synthetic run of about `turnsWanted` turns, in the shape every stage of this bench uses. */
function benchRun(runId: string, turnsWanted: number, tokens: number, seed: number): SyntheticRunOptions {
  const assistantTurns = 4;
  const groupSize = 4;
  const groups = Math.ceil(turnsWanted / (groupSize * (2 * assistantTurns - 1)));
  return { runId, groups, groupSize, assistantTurns, tokensPerTurn: tokens, trajectoriesPerStep: 256, seed };
}

async function benchTarget(spec: string, turnsWanted: number, tokens: number, batchRows: number): Promise<TargetReport> {
  const store = await openTraceStore(spec, { database: `bench_traces_${Date.now().toString(36)}` });
  try {
    const run = benchRun('bench', turnsWanted, tokens, 3);
    const writer = new TraceWriter(store, catchUpBatches(batchRows));
    await writer.prepare(TRACE_TABLES);
    let someTrajectory = '';
    let sinkMs = 0;
    let cpuMicros = 0;
    const t0 = performance.now();
    const events = syntheticRun(run);
    let flushing: Promise<number> = Promise.resolve(0);
    let sincePoll = 0;
    for (let done = false; !done; ) {
      // Small chunks: the sink decodes a poll's records one at a time and maps each at once, so only a few
      // decoded events are alive at a time (holding a whole poll's 5,000 decoded events alive made every
      // young-generation GC copy ~10 MB of them, a cost the sink does not have).
      const chunk: DecodedEvent[] = [];
      while (chunk.length < 100) {
        const next = events.next();
        if (next.done) {
          done = true;
          break;
        }
        const ev = next.value;
        if (!someTrajectory && ev.name === 'TrajectoryStarted') someTrajectory = (ev.value as { trajectory_id: string }).trajectory_id;
        chunk.push({ name: ev.name, value: ev.value, schemaId: 0 } as DecodedEvent);
      }
      const c = process.cpuUsage();
      const s = performance.now();
      for (const ev of chunk) for (const { table, row } of rowsOf(ev)) writer.add(table, row);
      // Asked once per chunk, as the sink asks once per poll (a batch overshoots maxRows by < 100 rows).
      if (writer.due()) {
        // As the sink does: one write in flight while the next batch is mapped and encoded.
        await flushing;
        flushing = writer.flush();
        flushing.catch(() => undefined); // thrown by the await above
      }
      // Every 5,000 events (the sink's poll size) the sink awaits its next poll: the event loop turns, so a
      // flush in flight moves on to its next table's INSERT (a loop that never yields would leave the engine
      // idle until it awaits that flush).
      sincePoll += chunk.length;
      if (sincePoll >= 5_000) {
        sincePoll = 0;
        await new Promise<void>((resolve) => setImmediate(resolve));
      }
      if (done) {
        await flushing;
        await writer.flush();
      }
      sinkMs += performance.now() - s;
      const u = process.cpuUsage(c);
      cpuMicros += u.user + u.system;
    }
    const totalSeconds = (performance.now() - t0) / 1000;
    const seconds = sinkMs / 1000;
    const rows = writer.stats.rows;
    const queries: TargetReport['queries'] = [];
    for (const q of listNamedQueries()) {
      const params = q.params.some((p) => p.name === 'id') ? { id: someTrajectory, run: 'bench' } : {};
      const times: number[] = [];
      let n = 0;
      for (let i = 0; i < 3; i++) {
        const s = performance.now();
        n = (await runNamed(store, q.name, params)).rows.length;
        times.push(performance.now() - s);
      }
      times.sort((a, b) => a - b);
      queries.push({ name: q.name, rows: n, medianMs: Math.round(times[1]!), maxMs: Math.round(times[2]!) });
    }
    return {
      target: store.kind,
      dialect: store.dialect,
      turns: syntheticTurnCount(run),
      rows,
      seconds: Math.round(seconds * 10) / 10,
      cpuSeconds: Math.round(cpuMicros / 1e5) / 10,
      totalSeconds: Math.round(totalSeconds * 10) / 10,
      rowsPerSecond: Math.round(rows / seconds),
      mbPerSecond: Math.round((((store as { bytesSent?: number }).bytesSent ?? 0) / 1e6 / seconds) * 10) / 10,
      queries,
    };
  } finally {
    dropAtEnd(store.kind, spec, store.database);
    await store.close();
  }
}

interface SinkReport {
  target: string;
  /** 'native transcoders' (the default) or 'general path' (decode, rowsOf, codec for every record). */
  path: string;
  /** Where the sink read the run: the embedded log (in place) or Kafka through one of its clients. */
  source: 'embedded log' | 'Kafka (kafkajs)' | 'Kafka (librdkafka)';
  /** The round of the drain (1-based). */
  run: number;
  turns: number;
  records: number;
  /** Records written through a transcoder. */
  transcoded: number;
  rows: number;
  logMB: number;
  seconds: number;
  cpuSeconds: number;
  /** CPU by role over the drain (main thread, engine inserts and merges, a local server's process, steal). */
  cpu: CpuReport | null;
  rowsPerSecond: number;
  mbPerSecond: number;
}

/** The recorded run the sink drains: recorded once (untimed), drained on every target. */
interface SinkLog {
  dir: string;
  turns: number;
  /** Records written (each drain must read them all). */
  records: number;
  bytes: number;
}

async function recordSinkLog(dir: string, turnsWanted: number, tokens: number): Promise<SinkLog> {
  const logDir = mkdtempSync(join(dir, 'log-'));
  const run = benchRun('sink', turnsWanted, tokens, 5);
  const log = openEmbeddedLog({ dir: logDir, fsync: 'none' });
  try {
    const registry = await EmbeddedRegistry.open(log);
    const { sent, bytes } = await recordRun(log, await new EventSerde(registry).init(), run, 0, false);
    await registry.close();
    return { dir: logDir, turns: syntheticTurnCount(run), records: sent, bytes };
  } finally {
    await log.close(); // the drain's process takes the log's lock
    // Written back now, untimed (see the header); `sync -f` syncs the file system that holds the log.
    spawnSync('sync', ['-f', logDir]);
  }
}

/** The log a drain reads: an embedded log's directory, or Kafka's brokers with the prefix of the copy's topics. */
interface DrainSource {
  log: string;
  prefix: string;
  source: SinkReport['source'];
}

/**
 * The real TraceSink draining a recorded run into a fresh database of `spec`, in a process of its own
 * (bench/traces-sink-process.ts), from the start of `from`: with its native transcoders (the default) or, with
 * `transcode` false, through the general path only.
 */
async function drainOnce(spec: string, dir: string, sinkLog: SinkLog, from: DrainSource, transcode: boolean, round: number): Promise<SinkReport> {
  const { bytes: logBytes } = sinkLog;
  const kind = parseStoreTarget(spec).kind;
  // chDB: a directory of the drain's own (one process per chDB directory).
  const target = kind === 'chdb' ? `chdb:${mkdtempSync(join(dir, 'sink-chdb-'))}` : spec;
  const database = `bench_sink_${Date.now().toString(36)}`;
  const args = ['--import', 'tsx', join(HERE, 'traces-sink-process.ts'), from.log, target, String(transcode), database, from.prefix];
  const child = spawnSync(process.execPath, args, { encoding: 'utf8', maxBuffer: 16 << 20 });
  dropAtEnd(kind, spec, database);
  const line = child.stdout.trim().split('\n').pop() ?? '';
  if (child.status !== 0 || !line.startsWith('{')) throw new Error(`the sink's drain process failed (status ${child.status}):\n${child.stderr.slice(-2000)}`);
  const k = JSON.parse(line) as { records: number; transcoded: number; rows: number; seconds: number; cpuSeconds: number; cpu: CpuReport | null };
  if (k.records !== sinkLog.records) throw new Error(`the sink's drain read ${k.records} records of the log's ${sinkLog.records}`);
  return {
    target: kind,
    path: transcode ? 'native transcoders' : 'general path',
    source: from.source,
    run: round + 1,
    turns: sinkLog.turns,
    records: k.records,
    transcoded: k.transcoded,
    rows: k.rows,
    logMB: Math.round(logBytes / 1e5) / 10,
    seconds: Math.round(k.seconds * 10) / 10,
    cpuSeconds: Math.round(k.cpuSeconds * 10) / 10,
    cpu: k.cpu,
    rowsPerSecond: Math.round(k.rows / k.seconds),
    mbPerSecond: Math.round((logBytes / 1e6 / k.seconds) * 10) / 10,
  };
}

/**
 * Copies the recorded log into Kafka under topics of its own (`<prefix><topic>`, `prefix` a runTopic name),
 * untimed, through the replay's log copy (schemas registered in the registry at SCHEMA_REGISTRY_URL, which the
 * drain reads them from).
 */
async function copyToKafka(sinkLog: SinkLog, brokers: string[], prefix: string): Promise<DrainSource> {
  const source = openEmbeddedLog({ dir: sinkLog.dir, fsync: 'none' });
  const kafka = await openLog({ kind: 'kafka', brokers });
  try {
    const sourceRegistry = await EmbeddedRegistry.open(source);
    const kafkaRegistry = await openRegistryFor(kafka);
    try {
      const topics = Object.values(TOPICS).filter((t) => t !== TOPICS.schemas);
      const target = new LogCopyTarget({ log: source, registry: sourceRegistry }, { log: kafka, registry: kafkaRegistry, describe: 'kafka' }, (t) => prefix + t);
      const serde = await new EventSerde(sourceRegistry).init();
      // The topics the copy makes (one for each with records) are deleted when main() ends, even if it fails here.
      const end = await ReplayJob.start({ log: source, serde, target, topics }).done;
      if (end.state !== 'done' || end.written !== sinkLog.records) throw new Error(`copying the sink's log into Kafka ended ${end.state} with ${end.written} of ${sinkLog.records} records: ${end.error ?? ''}`);
    } finally {
      await kafkaRegistry.close();
      await sourceRegistry.close();
    }
  } finally {
    await kafka.close();
    await source.close();
  }
  return { log: `kafka://${brokers.join(',')}`, prefix, source: 'Kafka (kafkajs)' };
}

interface EngineReport {
  target: string;
  rows: number;
  mb: number;
  seconds: number;
  cpuSeconds: number;
  cpu: CpuReport | null;
  rowsPerSecond: number;
  mbPerSecond: number;
}

/** Batches as the sink would take them during catch-up or replay: by rows, or 256 MiB of encoded rows. */
function catchUpBatches(batchRows: number): WriterOptions {
  return { maxRows: batchRows, maxBytes: 256 << 20, maxDelayMs: 600_000 };
}

/**
 * The engine's INSERTs alone. A TraceWriter encodes and batches the run into a recorder (untimed), which keeps
 * each flush's payloads instead of sending them; then those flushes are sent to the store as the writer sent
 * them (every table of a flush at once), and only that is timed.
 */
async function benchEngine(spec: string, turnsWanted: number, tokens: number, batchRows: number): Promise<EngineReport> {
  const store = await openTraceStore(spec, { database: `bench_engine_${Date.now().toString(36)}` });
  try {
    type Payload = { codec: TableCodec; payload: Buffer; rows: number };
    let parts: Payload[] = [];
    // Only what the writer calls; a copy of each payload, since the writer reuses its buffers once a flush ends.
    const recorder: Pick<TraceStore, 'rowCodec' | 'insert' | 'insertEncoded'> = {
      rowCodec: (table) => store.rowCodec(table),
      insertEncoded: async (codec, payload, rows) => void parts.push({ codec, payload: Buffer.from(payload), rows }),
      insert: async (table) => {
        throw new Error(`the engine bench needs a RowBinary codec for every table; ${table} has none on ${store.kind}`);
      },
    };
    const writer = new TraceWriter(recorder as TraceStore, catchUpBatches(batchRows));
    await writer.prepare(TRACE_TABLES);
    const flushes: Payload[][] = [];
    const flush = async () => {
      await writer.flush();
      if (parts.length > 0) flushes.push(parts);
      parts = [];
    };
    for (const e of syntheticRun(benchRun('engine', turnsWanted, tokens, 7))) {
      for (const { table, row } of rowsOf({ name: e.name, value: e.value, schemaId: 0 } as DecodedEvent)) writer.add(table, row);
      if (writer.due()) await flush();
    }
    await flush();
    const rows = writer.stats.rows;
    const bytes = flushes.flat().reduce((n, p) => n + p.payload.length, 0);
    await settleMerges(store);
    const c0 = process.cpuUsage();
    const s0 = sampleCpu();
    const t0 = performance.now();
    for (const parts of flushes) await Promise.all(parts.map((p) => store.insertEncoded(p.codec, p.payload, p.rows)));
    const seconds = (performance.now() - t0) / 1000;
    const cpu = process.cpuUsage(c0);
    const byRole = cpuReport(s0, sampleCpu(), rows);
    return {
      target: store.kind,
      rows,
      mb: Math.round(bytes / 1e6),
      seconds: Math.round(seconds * 100) / 100,
      cpuSeconds: Math.round((cpu.user + cpu.system) / 1e4) / 100,
      cpu: byRole,
      rowsPerSecond: Math.round(rows / seconds),
      mbPerSecond: Math.round((bytes / 1e6 / seconds) * 10) / 10,
    };
  } finally {
    dropAtEnd(store.kind, spec, store.database);
    await store.close();
  }
}

/** Waits until `store`'s engine runs no merges (at most two minutes); see the header. */
async function settleMerges(store: TraceStore): Promise<void> {
  const t0 = performance.now();
  let running = 0;
  while (performance.now() - t0 < 120_000) {
    running = Number((await store.query('SELECT count() AS n FROM system.merges')).rows[0]?.['n'] ?? 0);
    if (running === 0) break;
    await sleep(250);
  }
  const waited = (performance.now() - t0) / 1000;
  if (waited >= 0.25) console.log(`  (waited ${waited.toFixed(1)} s for the ${store.kind}'s merges to end${running > 0 ? `; ${running} still running` : ''})`);
}

async function settle(spec: string): Promise<void> {
  const store = await openTraceStore(spec, { database: 'system', migrate: false });
  try {
    await settleMerges(store);
  } finally {
    await store.close();
  }
}

/** Server databases the bench made, dropped when it ends (see the header); chDB's go with the bench's directory. */
const serverDatabases: { spec: string; database: string }[] = [];

function dropAtEnd(kind: TraceStore['kind'], spec: string, database: string): void {
  if (kind === 'server') serverDatabases.push({ spec, database });
}

async function dropServerDatabases(): Promise<void> {
  for (const { spec, database } of serverDatabases.splice(0)) {
    const store = await openTraceStore(spec, { database, migrate: false });
    await store.exec(`DROP DATABASE IF EXISTS ${database}`).catch((e: unknown) => console.error(`could not drop ${database}: ${String(e)}`));
    await store.close();
  }
}

const FLAGS = {
  ...ROUND_FLAGS,
  turns: int(0),
  tokens: int(1),
  targets: names(['chdb', 'server']),
  'batch-rows': int(1),
  'sink-turns': int(0),
  // The name --rounds had here before the bench ran on the harness's rounds; the README's Kafka row gives it.
  'sink-runs': int(1),
  'kafka-sink': choice(['true', 'false'] as const),
  'engine-turns': int(0),
};

/** A round's result of one mode: a store path, a drain or an engine; each counts rows, seconds and CPU. */
export type PhaseResult = TargetReport | SinkReport | EngineReport;

export interface TracesOptions {
  quick: boolean;
  rounds: number;
  turns: number;
  tokens: number;
  batchRows: number;
  targets: ('chdb' | 'server')[];
  sinkTurns: number;
  engineTurns: number;
  kafkaSink: boolean;
}

export function parseOptions(args: string[]): TracesOptions {
  const { values: f } = parseFlags(args, FLAGS);
  if (f.rounds !== undefined && f['sink-runs'] !== undefined && f.rounds !== f['sink-runs']) {
    throw new FlagError(`--sink-runs is the older name of --rounds (every mode runs once a round); give one (got --rounds ${f.rounds} --sink-runs ${f['sink-runs']})`);
  }
  const quick = f.quick === true;
  const server = Boolean(process.env['CLICKHOUSE_URL']);
  const brokers = Boolean(process.env['KAFKA_BROKERS']);
  const kafkaSink = (f['kafka-sink'] ?? (brokers && !quick ? 'true' : 'false')) === 'true';
  if (kafkaSink && !brokers) throw new FlagError('--kafka-sink true needs KAFKA_BROKERS (source infra/env.sh)');
  const targets = (f.targets ?? (server ? ['chdb', 'server'] : ['chdb'])) as TracesOptions['targets'];
  return {
    quick,
    rounds: f.rounds ?? f['sink-runs'] ?? (quick ? 1 : 3),
    turns: f.turns ?? (quick ? 2_000 : 1_000_000),
    tokens: f.tokens ?? 24,
    batchRows: f['batch-rows'] ?? 250_000,
    targets,
    sinkTurns: f['sink-turns'] ?? (quick ? 2_000 : 1_000_000),
    engineTurns: f['engine-turns'] ?? (quick ? 2_000 : 300_000),
    kafkaSink,
  };
}

const cpuMicrosPerRow = (r: PhaseResult) => (r.cpuSeconds * 1e6) / r.rows;
const serverMicrosPerRow = (r: PhaseResult) => ('cpu' in r ? (r.cpu?.microsPerRow['server process'] ?? NaN) : NaN);

/** Waits until no target runs merges: a mode's own merges count, the previous mode's do not (see the header). */
async function settleAll(specs: string[]): Promise<void> {
  for (const spec of specs) await settle(spec);
}

export async function main(args: string[]): Promise<unknown> {
  const o = parseOptions(args);
  const brokers = (process.env['KAFKA_BROKERS'] ?? '').split(',').filter((b) => b);
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-bench-traces-'));
  // The Kafka copy's topics: deleted in the finally below (bench/kafka-topics.ts), not only by bench/main.ts's
  // sweep, which then finds none of them left.
  let kafkaPrefix: string | null = null;
  try {
    const specs: [string, string][] = [];
    for (const t of o.targets) {
      if (t === 'server' && !process.env['CLICKHOUSE_URL']) console.log('server: CLICKHOUSE_URL is not set, skipped');
      else specs.push([t, t === 'server' ? process.env['CLICKHOUSE_URL']! : `chdb:${dir}`]);
    }
    if (specs.length === 0) throw new Error(`no target to measure (--targets ${o.targets.join(',')})`);
    const allSpecs = specs.map(([, spec]) => spec);
    // Untimed, once: the log every drain reads, and its copy in Kafka (each drain reads it from the start in a
    // group of its own).
    let sinkLog: SinkLog | null = null;
    let kafkaCopy: DrainSource | null = null;
    if (o.sinkTurns > 0) {
      console.log(`recording ${o.sinkTurns} turns into an embedded log (untimed), for every sink mode to drain…`);
      sinkLog = await recordSinkLog(dir, o.sinkTurns, o.tokens);
      if (o.kafkaSink && specs.some(([t]) => t === 'server')) {
        kafkaPrefix = runTopic('bench', `traces-${randomBytes(4).toString('hex')}-`);
        console.log(`copying the log into Kafka under ${kafkaPrefix}* (untimed), for the sink to drain from there…`);
        kafkaCopy = await copyToKafka(sinkLog, brokers, kafkaPrefix);
        if (!rdKafkaAvailable()) console.log('librdkafka is not built (bash infra/setup.sh --kafka-native): the drain from Kafka through it is skipped');
      }
    }
    const modes: Mode<PhaseResult>[] = [];
    const mode = (name: string, run: (round: number) => Promise<PhaseResult>, describe: (r: PhaseResult) => string) =>
      modes.push({
        name,
        run: async (round) => {
          await settleAll(allSpecs);
          const r = await run(round);
          console.log(`  ${name}: ${describe(r)}`);
          if ('cpu' in r && r.cpu) console.log(`    ${describeCpu(r.cpu)}`);
          return r;
        },
      });
    for (const [t, spec] of specs) {
      const own = t === 'chdb' ? 'engine included' : "the server's own CPU not counted";
      if (o.turns > 0) {
        mode(`${t} store path`, () => benchTarget(spec, o.turns, o.tokens, o.batchRows), (r) => {
          const x = r as TargetReport;
          const slow = x.queries.filter((q) => q.maxMs >= 1000).map((q) => q.name);
          return (
            `${x.rows} rows (${x.turns} turns) in ${x.seconds} s of main-thread sink path (${x.totalSeconds} s with generation) = ${x.rowsPerSecond} rows/s, ${x.mbPerSecond} MB/s; ` +
            `process CPU ${x.cpuSeconds} s (${own}); named queries: slowest ${Math.max(...x.queries.map((q) => q.maxMs))} ms${slow.length > 0 ? ` (over 1000 ms: ${slow.join(', ')})` : ''}`
          );
        });
      }
      if (sinkLog) {
        const log = sinkLog;
        const drain = (r: PhaseResult) => {
          const k = r as SinkReport;
          return `${k.records} records (${k.transcoded} transcoded; ${k.turns} turns, ${k.logMB} MB of Avro) → ${k.rows} rows in ${k.seconds} s = ${k.rowsPerSecond} rows/s, ${k.mbPerSecond} MB/s of log; process CPU ${k.cpuSeconds} s (${own})`;
        };
        const embedded: DrainSource = { log: log.dir, prefix: '', source: 'embedded log' };
        mode(`${t} sink, embedded log`, (round) => drainOnce(spec, dir, log, embedded, true, round), drain);
        if (!o.quick) mode(`${t} sink, embedded log, general path`, (round) => drainOnce(spec, dir, log, embedded, false, round), drain);
        if (t === 'server' && kafkaCopy) {
          const copy = kafkaCopy;
          for (const client of rdKafkaAvailable() ? (['kafkajs', 'librdkafka'] as const) : (['kafkajs'] as const)) {
            const from: DrainSource = { ...copy, log: `${client === 'librdkafka' ? 'kafka+librdkafka' : 'kafka'}://${brokers.join(',')}`, source: `Kafka (${client})` };
            mode(`${t} sink, Kafka (${client})`, (round) => drainOnce(spec, dir, log, from, true, round), drain);
          }
        }
      }
      if (o.engineTurns > 0) {
        mode(`${t} engine alone`, () => benchEngine(spec, o.engineTurns, o.tokens, o.batchRows), (r) => {
          const g = r as EngineReport;
          return `${g.rows} rows, ${g.mb} MB in ${g.seconds} s = ${g.rowsPerSecond} rows/s, ${g.mbPerSecond} MB/s (binary rows built beforehand; the INSERTs timed, with their conversion to Native blocks); process CPU ${g.cpuSeconds} s (${own})`;
        });
      }
    }
    if (modes.length === 0) throw new Error('nothing to measure: --turns, --sink-turns and --engine-turns are all 0');
    console.log(
      `${o.rounds} interleaved round${o.rounds === 1 ? '' : 's'} of ${modes.map((m) => m.name).join('; ')}: store path ${o.turns} turns, sink ${o.sinkTurns}, engine ${o.engineTurns} (${o.tokens} tokens a turn, batches of ${o.batchRows} rows)${o.quick ? ' (--quick: smoke size, figures mean nothing)' : ''}`,
    );
    const recs = await interleaved(modes, o.rounds);
    for (const r of recs) if (r.error) console.log(`round ${r.round + 1} ${r.mode}: FAILED\n${r.error}`);
    const rowsPerSecond = summarize(recs, (r) => r.rowsPerSecond);
    const cpuUsPerRow = summarize(recs, cpuMicrosPerRow);
    const serverUsPerRow = summarize(recs, serverMicrosPerRow);
    const queryMaxMs = summarize(
      recs.filter((r) => r.result && 'queries' in r.result),
      (r) => Math.max(...(r as TargetReport).queries.map((q) => q.maxMs)),
    );
    console.log(`\nmedian [min–max] over ${o.rounds} round${o.rounds === 1 ? '' : 's'} (target: the sink ≥ 200,000 rows/s, every named query < 1,000 ms)`);
    console.log('mode                                          rows/s                        CPU-µs a row (its process)   server CPU-µs a row');
    for (const m of modes) {
      console.log(`${m.name.padEnd(45)} ${fmtStats(rowsPerSecond[m.name]!, 0).padEnd(29)} ${fmtStats(cpuUsPerRow[m.name]!, 1).padEnd(28)} ${fmtStats(serverUsPerRow[m.name]!, 1)}`);
    }
    for (const [m, st] of Object.entries(queryMaxMs)) console.log(`${m}: slowest named query ${fmtStats(st, 0, ' ms')}`);
    const speed = probeSummary(recs);
    console.log(`machine speed before each mode: sgemm ${fmtStats(speed.sgemmGflops, 0)} GFLOP/s, JS loop ${fmtStats(speed.jsLoopMs, 0)} ms, load ${fmtStats(speed.load1m, 1)}`);
    if (recs.some((r) => r.error)) process.exitCode = 1;
    return {
      options: o,
      sinkLog: sinkLog && { turns: sinkLog.turns, records: sinkLog.records, bytes: sinkLog.bytes },
      summary: { rowsPerSecond, cpuUsPerRow, serverUsPerRow, queryMaxMs },
      machineSpeed: speed,
      rounds: recs,
      note: "CPU-µs a row: the sink's or the bench's process (chDB's engine included; a server's CPU is its own column)",
    };
  } finally {
    await dropServerDatabases();
    if (kafkaPrefix !== null) await deleteRunTopics(brokers, kafkaPrefix);
    rmSync(dir, { recursive: true, force: true });
  }
}

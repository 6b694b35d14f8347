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
// A VM's speed moves from hour to hour (the same drain's CPU-µs a row ranged 6.4-9.5 here in one afternoon), so
// the drain runs --sink-runs times (default 3) and the median, least and most are printed. The same log is
// drained again with transcoding off (decode, rowsOf, codec for every record), once, as the comparison.
// With the server as a target and KAFKA_BROKERS set, the log is also copied into Kafka (under topics of its own,
// untimed, schemas registered at SCHEMA_REGISTRY_URL) and the sink drains it from there into the server: the
// distributed shape), once through each Kafka client (kafkajs, librdkafka). The copy's topics are deleted at the end.
// Both print where the CPU went, per row (bench/cpu.ts): the main thread, chDB's insert and merge threads,
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
// For the same reason each timed phase first waits (up to two minutes) until the target runs no merges: a
// phase's own merges count, the previous phase's do not. The wait is printed.
// Usage: npm run bench -- traces [--turns 1000000] [--tokens 24] [--targets chdb,server] [--batch-rows 250000]
//                                [--sink-turns 1000000] (0 skips the end-to-end sink) [--sink-runs 3]
//                                [--kafka-sink true|false] (default: true where KAFKA_BROKERS is set)
//                                [--engine-turns 300000] (0 skips the engine alone)
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import os, { tmpdir } from 'node:os';
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
import { syntheticRun, syntheticTurnCount, type SyntheticRunOptions } from '../testkit/synthetic-run.ts';

const HERE = dirname(fileURLToPath(import.meta.url));

function arg(args: string[], name: string, fallback: string): string {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] ? args[i + 1]! : fallback;
}

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
  /** Which of the drains of this target, path and source this is (1-based). */
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
 * (bench/traces-sink-process.ts), from the start of `from`: `runs` times with its native transcoders (the default)
 * and, unless `general` is false, once through the general path only.
 */
async function benchSink(spec: string, dir: string, sinkLog: SinkLog, from: DrainSource, runs: number, general = true): Promise<SinkReport[]> {
  const { bytes: logBytes } = sinkLog;
  const reports: SinkReport[] = [];
  const kind = parseStoreTarget(spec).kind;
  const drains = [...Array.from({ length: runs }, (_, i) => ({ transcode: true, run: i + 1 })), ...(general ? [{ transcode: false, run: 1 }] : [])];
  for (const { transcode, run } of drains) {
    // chDB: a directory of the drain's own (one process per chDB directory).
    const target = kind === 'chdb' ? `chdb:${mkdtempSync(join(dir, 'sink-chdb-'))}` : spec;
    const database = `bench_sink_${Date.now().toString(36)}`;
    await settle(spec); // chDB: the drain's directory is new, but this process's engine may still merge
    const args = ['--import', 'tsx', join(HERE, 'traces-sink-process.ts'), from.log, target, String(transcode), database, from.prefix];
    const child = spawnSync(process.execPath, args, { encoding: 'utf8', maxBuffer: 16 << 20 });
    dropAtEnd(kind, spec, database);
    const line = child.stdout.trim().split('\n').pop() ?? '';
    if (child.status !== 0 || !line.startsWith('{')) throw new Error(`the sink's drain process failed (status ${child.status}):\n${child.stderr.slice(-2000)}`);
    const k = JSON.parse(line) as { records: number; transcoded: number; rows: number; seconds: number; cpuSeconds: number; cpu: CpuReport | null };
    if (k.records !== sinkLog.records) throw new Error(`the sink's drain read ${k.records} records of the log's ${sinkLog.records}`);
    reports.push({
      target: kind,
      path: transcode ? 'native transcoders' : 'general path',
      source: from.source,
      run,
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
    });
  }
  return reports;
}

/** Median, least and most rows/s of the drains of one target, path and source. */
function summarize(drains: SinkReport[]): { median: number; min: number; max: number } {
  const r = drains.map((d) => d.rowsPerSecond).sort((a, b) => a - b);
  return { median: r[(r.length - 1) >> 1]!, min: r[0]!, max: r[r.length - 1]! };
}

/** Kafka topics the bench made (the copies of the sink's log), deleted when it ends. */
const kafkaTopics: string[] = [];

/**
 * Copies the recorded log into Kafka under topics of its own (`<prefix><topic>`), untimed, through the replay's
 * log copy (schemas registered in the registry at SCHEMA_REGISTRY_URL, which the drain reads them from).
 */
async function copyToKafka(sinkLog: SinkLog, brokers: string[]): Promise<DrainSource> {
  const prefix = `bench-traces-${randomBytes(4).toString('hex')}-`;
  const source = openEmbeddedLog({ dir: sinkLog.dir, fsync: 'none' });
  const kafka = await openLog({ kind: 'kafka', brokers });
  try {
    const sourceRegistry = await EmbeddedRegistry.open(source);
    const kafkaRegistry = await openRegistryFor(kafka);
    try {
      const topics = Object.values(TOPICS).filter((t) => t !== TOPICS.schemas);
      const target = new LogCopyTarget({ log: source, registry: sourceRegistry }, { log: kafka, registry: kafkaRegistry, describe: 'kafka' }, (t) => prefix + t);
      const serde = await new EventSerde(sourceRegistry).init();
      const end = await ReplayJob.start({ log: source, serde, target, topics })
        .done.finally(async () => {
          // The topics the copy made (one for each with records, at the source's retention: none), deleted at the end
          // even when the copy failed part way.
          kafkaTopics.push(...(await kafka.listTopics()).map((t) => t.name).filter((n) => n.startsWith(prefix)));
        });
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

async function deleteKafkaTopics(brokers: string[]): Promise<void> {
  if (kafkaTopics.length === 0) return;
  // The EventLog contract has no topic deletion (no role needs one); the bench cleans up with kafkajs's admin.
  const { Kafka, logLevel } = await import('kafkajs');
  const admin = new Kafka({ brokers, logLevel: logLevel.NOTHING }).admin();
  try {
    await admin.connect();
    await admin.deleteTopics({ topics: kafkaTopics.splice(0) });
  } catch (e) {
    console.error(`could not delete the bench's Kafka topics: ${String(e)}`);
  } finally {
    await admin.disconnect();
  }
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

export async function main(args: string[]): Promise<{ stores: TargetReport[]; sinks: SinkReport[]; engines: EngineReport[] }> {
  const turns = Number(arg(args, 'turns', '1000000'));
  const tokens = Number(arg(args, 'tokens', '24'));
  const batchRows = Number(arg(args, 'batch-rows', '250000'));
  const wanted = arg(args, 'targets', process.env['CLICKHOUSE_URL'] ? 'chdb,server' : 'chdb').split(',');
  const sinkTurns = Number(arg(args, 'sink-turns', '1000000'));
  const engineTurns = Number(arg(args, 'engine-turns', '300000'));
  const sinkRuns = Number(arg(args, 'sink-runs', '3'));
  if (!Number.isInteger(sinkRuns) || sinkRuns < 1) throw new Error(`--sink-runs must be a positive integer, got ${sinkRuns}`);
  const brokers = (process.env['KAFKA_BROKERS'] ?? '').split(',').filter((b) => b);
  const kafkaSink = arg(args, 'kafka-sink', brokers.length > 0 ? 'true' : 'false') === 'true';
  if (kafkaSink && brokers.length === 0) throw new Error('--kafka-sink true needs KAFKA_BROKERS (source infra/env.sh)');
  const reports: TargetReport[] = [];
  const sinks: SinkReport[] = [];
  const engines: EngineReport[] = [];
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-bench-traces-'));
  let sinkLog: SinkLog | null = null;
  try {
    for (const t of wanted) {
      if (t === 'server' && !process.env['CLICKHOUSE_URL']) {
        console.log('server: CLICKHOUSE_URL is not set, skipped');
        continue;
      }
      const spec = t === 'server' ? process.env['CLICKHOUSE_URL']! : `chdb:${dir}`;
      console.log(`${t}: inserting a synthetic run of ${turns} turns (${tokens} tokens each), batches of ${batchRows} rows; load average ${os.loadavg()[0]!.toFixed(1)}…`);
      await settle(spec);
      const r = await benchTarget(spec, turns, tokens, batchRows);
      reports.push(r);
      console.log(
        `${t} (${r.dialect}): ${r.rows} rows (${r.turns} turns) in ${r.seconds} s of main-thread sink path (${r.totalSeconds} s with generation) = ${r.rowsPerSecond} rows/s, ${r.mbPerSecond} MB/s  [target ≥ 200000 rows/s]; ` +
          `${Math.round(r.rows / r.totalSeconds)} rows/s over the whole wall time (generation included, engine work overlapping it); ` +
          `process CPU ${r.cpuSeconds} s = ${Math.round(r.rows / r.cpuSeconds)} rows per CPU-second (${t === 'chdb' ? 'engine included' : "the server's own CPU not counted"}); load average ${os.loadavg()[0]!.toFixed(1)}`,
      );
      console.log('  named query                 rows   median ms   max ms   (target < 1000 ms)');
      for (const q of r.queries) console.log(`  ${q.name.padEnd(34)} ${String(q.rows).padStart(6)} ${String(q.medianMs).padStart(11)} ${String(q.maxMs).padStart(8)}${q.maxMs >= 1000 ? '   OVER' : ''}`);
      if (sinkTurns > 0) {
        if (!sinkLog) console.log(`recording ${sinkTurns} turns into an embedded log (untimed), for every target's sink to drain…`);
        sinkLog ??= await recordSinkLog(dir, sinkTurns, tokens);
        console.log(`${t}: the trace sink end to end, draining that log ${sinkRuns} times…`);
        const drained = await benchSink(spec, dir, sinkLog, { log: sinkLog.dir, prefix: '', source: 'embedded log' }, sinkRuns);
        if (t === 'server' && kafkaSink) {
          console.log(`${t}: copying the log into Kafka (untimed), for the sink to drain from there…`);
          const copy = await copyToKafka(sinkLog, brokers);
          // One drain per Kafka client, of the same copy (each drain reads it from the start in a group of its own).
          for (const client of rdKafkaAvailable() ? (['kafkajs', 'librdkafka'] as const) : (['kafkajs'] as const)) {
            drained.push(...(await benchSink(spec, dir, sinkLog, { ...copy, log: `${client === 'librdkafka' ? 'kafka+librdkafka' : 'kafka'}://${brokers.join(',')}`, source: `Kafka (${client})` }, 1, false)));
          }
          if (!rdKafkaAvailable()) console.log('librdkafka is not built (bash infra/setup.sh --kafka-native): the drain from Kafka through it is skipped');
        }
        for (const k of drained) {
          sinks.push(k);
          console.log(
            `${t} sink end to end from ${k.source === 'embedded log' ? 'the embedded log' : k.source}, ${k.path}${k.path === 'native transcoders' && k.source === 'embedded log' ? ` (drain ${k.run} of ${sinkRuns})` : ''}: ${k.records} records (${k.transcoded} transcoded; ${k.turns} turns, ${k.logMB} MB of Avro) → ${k.rows} rows in ${k.seconds} s = ${k.rowsPerSecond} rows/s, ${k.mbPerSecond} MB/s of log  [target ≥ 200000 rows/s]; ` +
              `process CPU ${k.cpuSeconds} s (${t === 'chdb' ? 'engine included' : "the server's own CPU not counted"}); load average ${os.loadavg()[0]!.toFixed(1)}`,
          );
          console.log(`  ${describeCpu(k.cpu)}`);
        }
        const s = summarize(drained.filter((k) => k.path === 'native transcoders' && k.source === 'embedded log'));
        console.log(`${t} sink end to end from the embedded log: median ${s.median} rows/s of ${sinkRuns} drain${sinkRuns === 1 ? '' : 's'} (${s.min}-${s.max})  [target ≥ 200000 rows/s]`);
      }
      if (engineTurns > 0) {
        const g = await benchEngine(spec, engineTurns, tokens, batchRows);
        engines.push(g);
        console.log(
          `${t} engine alone (binary rows built beforehand; the INSERTs timed, with their conversion to Native blocks): ${g.rows} rows, ${g.mb} MB in ${g.seconds} s = ${g.rowsPerSecond} rows/s, ${g.mbPerSecond} MB/s; ` +
            `process CPU ${g.cpuSeconds} s (${t === 'chdb' ? 'the engine' : "the server's own CPU not counted"}); the ceiling of any sink here; load average ${os.loadavg()[0]!.toFixed(1)}`,
        );
        console.log(`  ${describeCpu(g.cpu)}`);
      }
    }
    console.log(`note: ${os.cpus().length} cores, load average ${os.loadavg()[0]!.toFixed(1)}: timings on a shared machine are noisy.`);
  } finally {
    await dropServerDatabases();
    await deleteKafkaTopics(brokers);
    rmSync(dir, { recursive: true, force: true });
  }
  return { stores: reports, sinks, engines };
}

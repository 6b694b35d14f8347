// One trace sink drain in a process of its own, as the sink runs when deployed (not beside the benchmark's
// heap, its chDB instance and that instance's background work); bench/traces.ts starts it. Prints one JSON
// line: counts, seconds and CPU by role. It leaves its database in place: bench/traces.ts drops it at the end.
// The log is an embedded log's directory, or kafka://brokers (through kafkajs) or kafka+librdkafka://brokers
// with the prefix the run's topics were copied under (the distributed shape). A traces run deletes its copy when it
// ends; run it with RLSTREAM_BENCH_KEEP_TOPICS=1 to keep the copy for this script to drain again (bench/kafka-topics.ts).
// Usage: node --import tsx bench/traces-sink-process.ts <log dir | kafka://brokers | kafka+librdkafka://brokers> <store spec> <transcode: true|false> <database> [topic prefix]
import { openEmbeddedLog } from '../core/log/embedded/index.ts';
import { openLog } from '../core/log/open.ts';
import type { EventLog } from '../core/log/types.ts';
import { EmbeddedRegistry } from '../core/serde/embedded-registry.ts';
import { openRegistryFor } from '../core/serde/open.ts';
import { EventSerde } from '../core/serde/events.ts';
import { openTraceStore } from '../core/traces/open.ts';
import { TRACE_TOPICS, TraceSink } from '../consumers/traces/sink.ts';
import { cpuReport, sampleCpu } from './cpu.ts';

const [logSpec, spec, transcodeArg, database, prefix = ''] = process.argv.slice(2);
if (!logSpec || !spec || (transcodeArg !== 'true' && transcodeArg !== 'false') || !database) {
  console.error('usage: traces-sink-process.ts <log dir | kafka://brokers> <store spec> <true|false> <database> [topic prefix]');
  process.exit(2);
}
const transcode = transcodeArg === 'true';
const kafkaUrl = /^kafka(\+librdkafka)?:\/\/(.+)$/.exec(logSpec);
const kafka = kafkaUrl !== null;
const log: EventLog = kafkaUrl
  ? await openLog({ kind: 'kafka', brokers: kafkaUrl[2]!.split(','), client: kafkaUrl[1] ? 'librdkafka' : 'kafkajs' })
  : openEmbeddedLog({ dir: logSpec, fsync: 'none' });
// The registry of each shape: the embedded log's own _schemas topic; for Kafka, the registry at SCHEMA_REGISTRY_URL
// (where the copy into Kafka registered the schemas).
const registry = kafka ? await openRegistryFor(log) : await EmbeddedRegistry.open(log);
const serde = await new EventSerde(registry).init();
const store = await openTraceStore(spec, { database });
try {
  // The sink as deployed: its default batch sizes and poll size. A group of its own: the log is drained once per
  // target and path, each from the start. The copy's topics in Kafka carry its prefix, and a copy makes only the
  // topics that had records (the embedded log has them all).
  const existing = kafka ? new Set((await log.listTopics()).map((t) => t.name)) : null;
  const topics = TRACE_TOPICS.map((t) => prefix + t).filter((t) => existing?.has(t) ?? true);
  const sink = new TraceSink({ log, store, serde, groupId: `bench-sink-${database}`, transcode, topics });
  const c0 = process.cpuUsage();
  const s0 = sampleCpu();
  const t0 = performance.now();
  await sink.drain();
  const seconds = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(c0);
  const byRole = cpuReport(s0, sampleCpu(), sink.stats.rows);
  await sink.stop();
  const { records, transcoded, rows } = sink.stats;
  console.log(JSON.stringify({ records, transcoded, rows, seconds, cpuSeconds: (cpu.user + cpu.system) / 1e6, cpu: byRole }));
} finally {
  await store.close();
  await registry.close();
  await log.close();
}

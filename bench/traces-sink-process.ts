// One trace sink drain in a process of its own, as the sink runs when deployed (not beside the benchmark's
// heap, its chDB instance and that instance's background work); bench/traces.ts starts it. Prints one JSON
// line: counts, seconds and CPU by role. It leaves its database in place: bench/traces.ts drops it at the end.
// Usage: node --import tsx bench/traces-sink-process.ts <log dir> <store spec> <transcode: true|false> <database>
import { openEmbeddedLog } from '../core/log/embedded/index.ts';
import { EmbeddedRegistry } from '../core/serde/embedded-registry.ts';
import { EventSerde } from '../core/serde/events.ts';
import { openTraceStore } from '../core/traces/open.ts';
import { TraceSink } from '../consumers/traces/sink.ts';
import { cpuReport, sampleCpu } from './cpu.ts';

const [logDir, spec, transcodeArg, database] = process.argv.slice(2);
if (!logDir || !spec || (transcodeArg !== 'true' && transcodeArg !== 'false') || !database) {
  console.error('usage: traces-sink-process.ts <log dir> <store spec> <true|false> <database>');
  process.exit(2);
}
const transcode = transcodeArg === 'true';
const log = openEmbeddedLog({ dir: logDir, fsync: 'none' });
const registry = await EmbeddedRegistry.open(log);
const serde = await new EventSerde(registry).init();
const store = await openTraceStore(spec, { database });
try {
  // The sink as deployed: its default batch sizes and poll size. A group of its own: the log is drained once per
  // target and path, each from the start.
  const sink = new TraceSink({ log, store, serde, groupId: `bench-sink-${database}`, transcode });
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

// Benchmark dispatcher: `npm run bench -- <name> [args]` (default: pipeline) imports bench/<name>.ts, runs its
// exported main(args), prints what it prints, and writes the report main() returns, with the git revision, the
// machine's description and a speed probe at start and end, to bench/out/<name>-<timestamp>.json (bench/harness.ts).
// A bad flag (bench/flags.ts) prints one line naming it and exits 2.
// With KAFKA_BROKERS set, the Kafka topics it made (those carrying this process's run tag) are deleted when it
// ends, even when it fails; RLSTREAM_BENCH_KEEP_TOPICS=1 keeps them (bench/kafka-topics.ts).
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { FlagError } from './flags.ts';
import { probe, writeReport } from './harness.ts';
import { deleteRunTopics } from './kafka-topics.ts';

const here = dirname(fileURLToPath(import.meta.url));
// No name: the whole-pipeline report.
const name = process.argv[2] ?? 'pipeline';
if (!name || !/^[a-z0-9_-]+$/i.test(name) || name === 'main' || name === 'harness' || !existsSync(join(here, `${name}.ts`))) {
  console.error(`usage: npm run bench -- <name>   (a file bench/<name>.ts exporting main())`);
  process.exit(2);
}
const mod = (await import(pathToFileURL(join(here, `${name}.ts`)).href)) as { main?: (args: string[]) => Promise<unknown> };
if (typeof mod.main !== 'function') {
  console.error(`bench/${name}.ts does not export main()`);
  process.exit(2);
}
const args = process.argv.slice(3);
const start = probe();
try {
  const report = await mod.main(args);
  console.log(`report: ${writeReport(name, args, start, report)}`);
} catch (err) {
  // A bad command line is the user's to fix: one line naming the flag, exit 2, no stack trace.
  if (!(err instanceof FlagError)) throw err;
  console.error(`bench ${name}: ${err.message}`);
  process.exitCode = 2;
} finally {
  // Topics a benchmark makes on Kafka go when it ends (bench/kafka-topics.ts).
  await deleteRunTopics(process.env['KAFKA_BROKERS']?.split(',').filter((b) => b !== '') ?? []);
}

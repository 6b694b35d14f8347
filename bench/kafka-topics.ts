// Kafka topics the benchmarks make, deleted when a benchmark ends. Every pass of a stream-processor benchmark
// writes fresh topics (a consumers run of 5,000 groups on both clients leaves about 8 GB), and a broker's
// retention would keep them for a day: repeated runs filled this machine's disk. The EventLog contract has no
// topic deletion (no role needs one), so this goes through kafkajs's admin client.
//
// Each benchmark process names its topics with a tag of its own (RUN_TAG, through runTopic), and only topics
// carrying it are deleted, so that a benchmark running on the same cluster at the same time keeps its topics.
// Stateful processors name their state topic `_state.<processor id>` (core/processor.ts), so a benchmark's
// processor ids go through runTopic too.
//
// RLSTREAM_BENCH_KEEP_TOPICS=1 keeps them (the names are printed): a run's Kafka copy can then be drained again,
// e.g. with bench/traces-sink-process.ts. Topics kept, or left by a process that was killed, are for manual
// cleanup: BENCH_TOPIC matches every benchmark's.
import { randomBytes } from 'node:crypto';

/** Names the benchmarks give their topics (and the state topics of their stateful processors), of any run. */
export const BENCH_TOPIC = /^(_state\.)?(bench|pipe)-/;

/** This process's tag, in the name of every topic its benchmarks make. */
const RUN_TAG = randomBytes(4).toString('hex');
/** Whether this process named any topic: a benchmark that named none has none to delete (no admin connection). */
let named = false;

const FAMILIES = ['bench', 'pipe'] as const;
const tagged = (family: (typeof FAMILIES)[number]) => `${family}-${RUN_TAG}-`;

/** The topics (or processor ids) of this process's run: `<family>-<RUN_TAG>-<name>`. */
export function runTopic(family: (typeof FAMILIES)[number], name: string): string {
  named = true;
  return tagged(family) + name;
}

/** The env var that keeps a benchmark's topics instead of deleting them. */
export const KEEP_TOPICS_ENV = 'RLSTREAM_BENCH_KEEP_TOPICS';

const DELETE_TIMEOUT_MS = 25_000;

const keepTopics = () => (process.env[KEEP_TOPICS_ENV] ?? '') !== '' && process.env[KEEP_TOPICS_ENV] !== '0';

async function withAdmin<T>(brokers: string[], fn: (admin: import('kafkajs').Admin) => Promise<T>): Promise<T> {
  const { Kafka, logLevel } = await import('kafkajs');
  const admin = new Kafka({ brokers, logLevel: logLevel.NOTHING }).admin();
  await admin.connect();
  try {
    return await fn(admin);
  } finally {
    await admin.disconnect();
  }
}

/**
 * Deletes this run's topics, state topics included, over one admin connection: all of them, or with `prefix`
 * (a runTopic name) those under it. Several calls are harmless: a later one finds nothing left and deletes
 * nothing. With RLSTREAM_BENCH_KEEP_TOPICS set (not 0) they are listed and kept. A failure to delete is printed,
 * not thrown: the figures stand.
 */
export async function deleteRunTopics(brokers: string[], prefix?: string): Promise<void> {
  if (brokers.length === 0 || !named) return;
  const ours = (t: string) => {
    const name = t.startsWith('_state.') ? t.slice('_state.'.length) : t;
    return FAMILIES.some((f) => name.startsWith(tagged(f))) && name.startsWith(prefix ?? '');
  };
  const keep = keepTopics();
  try {
    const made = await withAdmin(brokers, async (admin) => {
      const topics = (await admin.listTopics()).filter(ours);
      // kafkajs gives up, without a retry, when the controller has not answered within the timeout (5 s by
      // default), which a loaded machine exceeds; the deletion itself is cheap, so wait for it (within kafkajs's
      // request timeout of 30 s, after which the client gives up whatever the broker does).
      if (topics.length > 0 && !keep) await admin.deleteTopics({ topics, timeout: DELETE_TIMEOUT_MS });
      return topics;
    });
    if (keep && made.length > 0) console.log(`${KEEP_TOPICS_ENV} is set: kept the benchmark's Kafka topics ${made.join(', ')}`);
  } catch (e) {
    console.error(`could not ${keep ? 'list' : 'delete'} the benchmark's Kafka topics: ${String(e)}`);
  }
}

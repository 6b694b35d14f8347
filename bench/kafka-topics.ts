// Kafka topics the benchmarks make, deleted when a benchmark ends. Every pass of a stream-processor benchmark
// writes fresh topics (a consumers run of 5,000 groups on both clients leaves about 8 GB), and a broker's
// retention would keep them for a day: repeated runs filled this machine's disk. The EventLog contract has no
// topic deletion (no role needs one), so this goes through kafkajs's admin client.

/** Names the benchmarks give their topics (and the state topics of their stateful processors). */
export const BENCH_TOPIC = /^(_state\.)?(bench|pipe)-/;

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

/** The benchmark-named topics on the cluster now. */
export function benchTopics(brokers: string[]): Promise<Set<string>> {
  return withAdmin(brokers, async (admin) => new Set((await admin.listTopics()).filter((t) => BENCH_TOPIC.test(t))));
}

/**
 * Deletes the benchmark-named topics that were not there before (`before`, from benchTopics): those this run
 * made, whatever it left behind when it failed. A failure to delete is printed, not thrown: the figures stand.
 */
export async function deleteNewBenchTopics(brokers: string[], before: Set<string>): Promise<void> {
  try {
    const made = [...(await benchTopics(brokers))].filter((t) => !before.has(t));
    if (made.length > 0) await withAdmin(brokers, (admin) => admin.deleteTopics({ topics: made }));
  } catch (e) {
    console.error(`could not delete the benchmark's Kafka topics: ${String(e)}`);
  }
}

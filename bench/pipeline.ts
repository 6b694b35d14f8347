// Whole-pipeline benchmark: synthetic rollouts (1,000-token trajectories, groups of 8) through
// reward → advantage → a trainer that only consumes, all three running at once, on the embedded log and on
// Kafka, in trajectories/s and MB/s next to Kafka's own ProducerPerformance / ConsumerPerformance on the same
// payload; p50/p99 latency from a TrajectoryCompleted being produced to its AdvantagedTrajectory reaching the
// trainer; and the resident memory of each role as its own process (the distributed shape, tiny model).
// `npm run bench -- pipeline [groups] [--no-memory]`. Shared 2-core machine: figures are noisy.
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { newId } from '../core/ids.ts';
import { openLog, type LogConfig } from '../core/log/open.ts';
import { StreamProcessor } from '../core/processor.ts';
import type { EventSerde } from '../core/serde/events.ts';
import { RewardHandler } from '../consumers/reward/consumer.ts';
import { AdvantageHandler } from '../consumers/advantage/consumer.ts';
import { completed, newSerde, trajectory } from '../testkit/events.ts';
import { PrivateBroker } from '../testkit/kafka-broker.ts';
import { newRun, openRunLog, progress, ROLES, rssMiB, Supervisor } from '../testkit/harness.ts';
import { dropDatabase } from '../testkit/audit.ts';

const TOKENS = 1000;
const GROUP = 8;

interface PipelineRow {
  log: string;
  trajectories: number;
  seconds: number;
  trajPerSec: number;
  MBPerSec: number;
  latencyP50Ms: number;
  latencyP99Ms: number;
}

const quantile = (xs: number[], q: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? NaN;
};

/** Producer → reward → advantage → consuming trainer, concurrently, on private topics of `config`'s log. */
async function pipeline(kind: string, config: LogConfig, groups: number, serde: EventSerde): Promise<PipelineRow> {
  const log = await openLog(config);
  const s = newId().slice(0, 8);
  const topics = { in: `pipe-in-${s}`, rewarded: `pipe-rw-${s}`, advantaged: `pipe-adv-${s}`, dlq: `pipe-dlq-${s}` };
  for (const t of Object.values(topics)) await log.createTopic({ name: t, partitions: 4 });
  const total = groups * GROUP;
  const payloads = Array.from({ length: groups }, (_, g) =>
    Array.from({ length: GROUP }, (_, i) => {
      const t = trajectory({ groupId: `g${g}`, index: i, tokens: TOKENS, groupSize: GROUP });
      return { id: t.trajectory_id, key: t.group_id, value: serde.encode('TrajectoryCompleted', completed(t)) };
    }),
  );
  const bytes = payloads.flat().reduce((n, p) => n + p.value.length, 0);
  const reward = new StreamProcessor({ id: `pipe-reward-${s}`, log, serde, inputTopics: [topics.in], accepts: ['TrajectoryCompleted'], handler: new RewardHandler('reward', { outputTopic: topics.rewarded }), deadLetterTopic: topics.dlq });
  const adv = new StreamProcessor({ id: `pipe-adv-${s}`, log, serde, inputTopics: [topics.rewarded], accepts: ['RewardedTrajectory'], handler: new AdvantageHandler('advantage', { outputTopic: topics.advantaged }), deadLetterTopic: topics.dlq });
  const trainer = await log.consumer({ groupId: `pipe-trainer-${s}`, topics: [topics.advantaged], readCommitted: true });
  const running = [reward.run(), adv.run()];
  const sentAt = new Map<string, number>();
  const latencies: number[] = [];
  const t0 = performance.now();
  const produce = (async () => {
    const p = await log.producer();
    // One send per group, as a rollout worker publishes a group's completions close together.
    for (const group of payloads) {
      const now = performance.now();
      for (const x of group) sentAt.set(x.id, now);
      await p.send(topics.in, group.map((x) => ({ key: x.key, value: x.value })));
    }
    await p.close();
  })();
  // The trainer that only consumes: decode (as the real one does before batching) and time arrival.
  while (latencies.length < total) {
    for (const r of await trainer.poll({ maxRecords: 512, timeoutMs: 200 })) {
      const d = await serde.decode(r.value);
      if (d.name !== 'AdvantagedTrajectory') continue;
      const at = sentAt.get(d.value.trajectory.trajectory_id);
      if (at !== undefined) latencies.push(performance.now() - at);
    }
  }
  const seconds = (performance.now() - t0) / 1000;
  await produce;
  await trainer.close();
  await reward.stop();
  await adv.stop();
  await Promise.all(running);
  await log.close();
  return { log: kind, trajectories: total, seconds, trajPerSec: total / seconds, MBPerSec: bytes / 1e6 / seconds, latencyP50Ms: quantile(latencies, 0.5), latencyP99Ms: quantile(latencies, 0.99) };
}

const run = promisify(execFile);

/** Kafka's ProducerPerformance and ConsumerPerformance with records of the pipeline's payload size. */
async function kafkaTools(brokers: string, records: number, recordBytes: number): Promise<{ produceRecPerSec: number; consumeRecPerSec: number }> {
  const libs = PrivateBroker.libs();
  if (!libs) throw new Error('Kafka jars are not installed');
  const java = async (cls: string, args: string[]) => (await run('java', ['-Xmx512m', '-cp', `${libs}/*`, cls, ...args], { maxBuffer: 1 << 26, timeout: 300_000 })).stdout;
  const topic = `pipe-tools-${newId().slice(0, 8)}`;
  const log = await openLog({ kind: 'kafka', brokers: [brokers] });
  await log.createTopic({ name: topic, partitions: 4 });
  await log.close();
  const prod = await java('org.apache.kafka.tools.ProducerPerformance', ['--topic', topic, '--num-records', String(records), '--record-size', String(recordBytes), '--throughput', '-1', '--producer-props', `bootstrap.servers=${brokers}`, 'acks=all', 'batch.size=1048576', 'linger.ms=5']);
  const m = /([\d.]+) records\/sec/.exec(prod.trim().split('\n').filter((l) => l.includes('records sent')).pop() ?? '');
  const cons = await java('org.apache.kafka.tools.ConsumerPerformance', ['--bootstrap-server', brokers, '--topic', topic, '--messages', String(records), '--group', `pipe-tools-${newId().slice(0, 8)}`, '--timeout', '60000']);
  const row = cons.trim().split('\n').pop()!.split(',').map((x) => x.trim());
  return { produceRecPerSec: Number(m?.[1] ?? NaN), consumeRecPerSec: Number(row[9]) };
}

/** RSS of each role as its own `rlstream worker` process at steady state (a private broker, the fault-test config). */
async function roleMemory(): Promise<Record<string, number | null> | null> {
  const registry = process.env['SCHEMA_REGISTRY_URL'];
  const clickhouseUrl = process.env['CLICKHOUSE_URL'];
  if (!registry || !clickhouseUrl || !PrivateBroker.libs()) return null;
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-bench-mem-'));
  const broker = await PrivateBroker.start(dir);
  const log = await openRunLog(broker.brokers);
  const r = await newRun('benchmem', broker.brokers, { 'task.train_rows': 200 });
  const sup = new Supervisor(r);
  const peak: Record<string, number[]> = {};
  try {
    sup.start();
    const by = Date.now() + 90_000;
    while (Date.now() < by && ((await progress(log, r.runId).catch(() => null))?.rolloutEvents ?? 0) < 200) await sleep(1000);
    // Steady state: sample every second for 15 s once events flow.
    for (let i = 0; i < 15; i++) {
      for (const role of ROLES) (peak[role] ??= []).push(rssMiB(sup.procs.get(role)?.child.pid) ?? NaN);
      await sleep(1000);
    }
  } finally {
    await sup.stopAll(3000);
    await log.close();
    await broker.halt('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
    rmSync(r.dir, { recursive: true, force: true });
    await dropDatabase(clickhouseUrl, r.database).catch(() => {});
  }
  return Object.fromEntries(ROLES.map((role) => [role, Math.round(quantile(peak[role]!.filter(Number.isFinite), 0.5))]));
}

export async function main(args: string[]): Promise<unknown> {
  const groups = Number(args.find((a) => /^\d+$/.test(a)) ?? 100);
  const serde = await newSerde();
  const rows: PipelineRow[] = [];
  const embeddedDir = mkdtempSync(join(tmpdir(), 'rlstream-bench-pipe-'));
  rows.push(await pipeline('embedded', { kind: 'embedded', dir: embeddedDir } as LogConfig, groups, serde));
  rmSync(embeddedDir, { recursive: true, force: true });
  const brokers = process.env['KAFKA_BROKERS'];
  let tools: Awaited<ReturnType<typeof kafkaTools>> | null = null;
  const sample = serde.encode('TrajectoryCompleted', completed(trajectory({ groupId: 'g', index: 0, tokens: TOKENS, groupSize: GROUP })));
  if (brokers) {
    rows.push(await pipeline('kafka', { kind: 'kafka', brokers: brokers.split(',') }, groups, serde));
    tools = await kafkaTools(brokers.split(',')[0]!, groups * GROUP, sample.length);
  } else console.log('KAFKA_BROKERS is not set: Kafka rows skipped');
  console.log(`\n(a) pipeline throughput: ${groups} groups × ${GROUP} trajectories of ${TOKENS} tokens (${sample.length} bytes each), reward → advantage → consuming trainer`);
  console.log('log        trajectories  seconds  traj/s    MB/s   p50 ms   p99 ms');
  for (const r of rows) console.log(`${r.log.padEnd(10)} ${String(r.trajectories).padStart(12)} ${r.seconds.toFixed(2).padStart(8)} ${r.trajPerSec.toFixed(0).padStart(7)} ${r.MBPerSec.toFixed(2).padStart(7)} ${r.latencyP50Ms.toFixed(0).padStart(8)} ${r.latencyP99Ms.toFixed(0).padStart(8)}`);
  let ratio: number | null = null;
  if (tools) {
    const k = rows.find((r) => r.log === 'kafka')!;
    const floor = Math.min(tools.produceRecPerSec, tools.consumeRecPerSec);
    ratio = k.trajPerSec / floor;
    console.log(`Kafka tools, same payload: ProducerPerformance ${tools.produceRecPerSec.toFixed(0)} rec/s (${((tools.produceRecPerSec * sample.length) / 1e6).toFixed(1)} MB/s), ConsumerPerformance ${tools.consumeRecPerSec.toFixed(0)} rec/s`);
    console.log(`ratio: pipeline on Kafka / min(tool produce, tool consume) = ${ratio.toFixed(3)} (three stages, each consuming, transforming and producing transactionally)`);
  }
  let memory: Record<string, number | null> | null = null;
  if (!args.includes('--no-memory')) {
    memory = await roleMemory();
    if (memory) {
      console.log('\n(c) resident memory of each role (own process, distributed shape, tiny model), MiB at steady state:');
      console.log(ROLES.map((r) => `${r} ${memory![r]}`).join('   '));
    } else console.log('(c) memory skipped: needs SCHEMA_REGISTRY_URL, CLICKHOUSE_URL and the Kafka jars');
  }
  console.log('\n(b) asynchronous speed-up (sync vs staleness 1/2/4 with a heavy-tailed tool): its own benchmark, `npm run bench -- async` (~12 min)');
  return { groups, tokens: TOKENS, groupSize: GROUP, payloadBytes: sample.length, rows, kafkaTools: tools, ratio, memoryMiB: memory, asyncSpeedup: 'npm run bench -- async', note: 'shared 2-core machine: timings are noisy' };
}

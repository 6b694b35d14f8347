// Whole-pipeline benchmark: synthetic rollouts (1,000-token trajectories, groups of 8) through
// reward → advantage → a trainer that only consumes, all three running at once, on the embedded log and on
// Kafka through each client (kafkajs, and librdkafka once infra/setup.sh has built it), in trajectories/s and MB/s next to Kafka's own ProducerPerformance / ConsumerPerformance on the same
// payload and the same record count; and the resident memory of each role as its own process (the distributed
// shape, tiny model).
// Two separate latency figures, since they answer different questions:
// - backlog: in the throughput pass the producer sends every group as fast as it can, so a trajectory's time
//   from send to the trainer is mostly the queue in front of it; it says how long a burst takes to drain;
// - per-event latency: a second pass sends one group at a time at half the throughput just measured (no queue
//   builds), and times each trajectory from the moment it is handed to the producer (created, as a rollout
//   worker publishes it) to the moment the trainer has decoded it (available to train on): p50/p99.
// The logs and the tools run in interleaved rounds with a machine-speed probe before each (bench/harness.ts);
// figures are the median [min–max] over rounds. The tools get a warm-up: ProducerPerformance's own
// --warmup-records (its steady-state line is the figure), and one discarded run of both tools per round.
// `npm run bench -- pipeline [groups] [--rounds 3] [--no-memory] [--quick]`; groups default 2,500 (20,000
// trajectories). --quick: 25 groups, 2 rounds, no memory part: proves it runs, the figures mean nothing.
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { newId } from '../core/ids.ts';
import { openLog, type LogConfig } from '../core/log/open.ts';
import { rdKafkaAvailable } from '../core/log/kafka/librdkafka/binding.ts';
import { StreamProcessor } from '../core/processor.ts';
import type { EventSerde } from '../core/serde/events.ts';
import { RewardHandler } from '../consumers/reward/consumer.ts';
import { AdvantageHandler } from '../consumers/advantage/consumer.ts';
import { completed, newSerde, trajectory } from '../testkit/events.ts';
import { PrivateBroker } from '../testkit/kafka-broker.ts';
import { newRun, openRunLog, progress, ROLES, rssMiB, Supervisor } from '../testkit/harness.ts';
import { dropDatabase } from '../testkit/audit.ts';
import { bool, int, parseFlags, ROUND_FLAGS } from './flags.ts';
import { fmtStats, interleaved, probeSummary, stats, summarize, type Stats } from './harness.ts';
import { runTopic } from './kafka-topics.ts';

const TOKENS = 1000;
const GROUP = 8;

interface PipelineRow {
  log: string;
  trajectories: number;
  seconds: number;
  trajPerSec: number;
  MBPerSec: number;
  /** Send → trainer while the producer floods: the queue's drain time, not a per-event latency. */
  backlogP50Ms: number;
  backlogP99Ms: number;
}

interface LatencyRow {
  log: string;
  trajectories: number;
  /** Groups sent per second (one group at a time). */
  groupsPerSec: number;
  /** Created (handed to the producer) → decoded by the trainer, with no queue in front. */
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
}

const quantile = (xs: number[], q: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? NaN;
};

/**
 * Producer → reward → advantage → consuming trainer, concurrently, on private topics of `config`'s log. With
 * `paceMs` null the producer sends as fast as it can (throughput, backlog); otherwise one group every `paceMs`.
 */
async function pipeline(kind: string, config: LogConfig, groups: number, serde: EventSerde, paceMs: number | null = null): Promise<{ row: PipelineRow; latencies: number[] }> {
  const log = await openLog(config);
  const s = newId().slice(0, 8);
  const topics = { in: runTopic('pipe', `in-${s}`), rewarded: runTopic('pipe', `rw-${s}`), advantaged: runTopic('pipe', `adv-${s}`), dlq: runTopic('pipe', `dlq-${s}`) };
  for (const t of Object.values(topics)) await log.createTopic({ name: t, partitions: 4 });
  const total = groups * GROUP;
  const payloads = Array.from({ length: groups }, (_, g) =>
    Array.from({ length: GROUP }, (_, i) => {
      const t = trajectory({ groupId: `g${g}`, index: i, tokens: TOKENS, groupSize: GROUP });
      return { id: t.trajectory_id, key: t.group_id, value: serde.encode('TrajectoryCompleted', completed(t)) };
    }),
  );
  const bytes = payloads.flat().reduce((n, p) => n + p.value.length, 0);
  const reward = new StreamProcessor({ id: runTopic('pipe', `reward-${s}`), log, serde, inputTopics: [topics.in], accepts: ['TrajectoryCompleted'], handler: new RewardHandler('reward', { outputTopic: topics.rewarded }), deadLetterTopic: topics.dlq });
  const adv = new StreamProcessor({ id: runTopic('pipe', `adv-${s}`), log, serde, inputTopics: [topics.rewarded], accepts: ['RewardedTrajectory'], handler: new AdvantageHandler('advantage', { outputTopic: topics.advantaged }), deadLetterTopic: topics.dlq });
  const trainer = await log.consumer({ groupId: `pipe-trainer-${s}`, topics: [topics.advantaged], readCommitted: true });
  const running = [reward.run(), adv.run()];
  const sentAt = new Map<string, number>();
  const latencies: number[] = [];
  const t0 = performance.now();
  const produce = (async () => {
    const p = await log.producer();
    // One send per group, as a rollout worker publishes a group's completions close together.
    for (const [g, group] of payloads.entries()) {
      if (paceMs !== null) {
        const due = t0 + g * paceMs;
        if (performance.now() < due) await sleep(due - performance.now());
      }
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
  return { row: { log: kind, trajectories: total, seconds, trajPerSec: total / seconds, MBPerSec: bytes / 1e6 / seconds, backlogP50Ms: quantile(latencies, 0.5), backlogP99Ms: quantile(latencies, 0.99) }, latencies };
}

/** Throughput pass, then a paced pass at half its rate for the per-event latency. */
async function pipelineRound(kind: string, config: () => LogConfig, groups: number, latencyGroups: number, serde: EventSerde): Promise<{ throughput: PipelineRow; latency: LatencyRow }> {
  const { row } = await pipeline(kind, config(), groups, serde);
  const paceMs = (GROUP / (row.trajPerSec / 2)) * 1000;
  const { latencies } = await pipeline(kind, config(), latencyGroups, serde, paceMs);
  return { throughput: row, latency: { log: kind, trajectories: latencies.length, groupsPerSec: 1000 / paceMs, p50Ms: quantile(latencies, 0.5), p99Ms: quantile(latencies, 0.99), maxMs: Math.max(...latencies) } };
}

const run = promisify(execFile);

interface ToolFigures {
  records: number;
  warmupRecords: number;
  /** ProducerPerformance's steady-state line (after its --warmup-records). */
  produceRecPerSec: number;
  /** Its whole-run line, warm-up included, for comparison. */
  produceRecPerSecAll: number;
  /** ConsumerPerformance's fetch.nMsg.sec: records over the fetch time, the group join left out. */
  consumeRecPerSec: number;
}

/**
 * Kafka's ProducerPerformance and ConsumerPerformance with records of the pipeline's payload size, as many
 * as the pipeline sends. The producer treats its first `warmup` records as warm-up (the JVM's JIT, the
 * connections); the consumer has no such option and reads them all, its rate taken over the fetch time.
 */
async function kafkaTools(brokers: string, records: number, warmup: number, recordBytes: number): Promise<ToolFigures> {
  const libs = PrivateBroker.libs();
  if (!libs) throw new Error('Kafka jars are not installed');
  const java = async (cls: string, args: string[]) => (await run('java', ['-Xmx512m', '-cp', `${libs}/*`, cls, ...args], { maxBuffer: 1 << 26, timeout: 300_000 })).stdout;
  const topic = runTopic('pipe', `tools-${newId().slice(0, 8)}`);
  const log = await openLog({ kind: 'kafka', brokers: [brokers] });
  await log.createTopic({ name: topic, partitions: 4 });
  await log.close();
  const total = records + warmup;
  const prod = await java('org.apache.kafka.tools.ProducerPerformance', ['--topic', topic, '--num-records', String(total), '--warmup-records', String(warmup), '--record-size', String(recordBytes), '--throughput', '-1', '--producer-props', `bootstrap.servers=${brokers}`, 'acks=all', 'batch.size=1048576', 'linger.ms=5']);
  const sent = prod.trim().split('\n').filter((l) => l.includes('records sent'));
  const rate = (line: string | undefined) => Number(/([\d.]+) records\/sec/.exec(line ?? '')?.[1] ?? NaN);
  const steady = sent.find((l) => l.includes('steady state'));
  const all = sent.filter((l) => !l.includes('steady state')).pop();
  const cons = await java('org.apache.kafka.tools.ConsumerPerformance', ['--bootstrap-server', brokers, '--topic', topic, '--messages', String(total), '--group', `pipe-tools-${newId().slice(0, 8)}`, '--timeout', '60000']);
  const row = cons.trim().split('\n').pop()!.split(',').map((x) => x.trim());
  return { records, warmupRecords: warmup, produceRecPerSec: rate(steady ?? all), produceRecPerSecAll: rate(all), consumeRecPerSec: Number(row[9]) };
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
  const { values: f, positional } = parseFlags(args, { ...ROUND_FLAGS, 'no-memory': bool }, { positionals: [['groups', int(1)]] });
  const quick = f.quick === true;
  const rounds = f.rounds ?? (quick ? 2 : 3);
  const groups = positional.groups ?? (quick ? 25 : 2500);
  const latencyGroups = quick ? 10 : 200;
  const serde = await newSerde();
  const sample = serde.encode('TrajectoryCompleted', completed(trajectory({ groupId: 'g', index: 0, tokens: TOKENS, groupSize: GROUP })));
  const records = groups * GROUP;
  const brokers = process.env['KAFKA_BROKERS'];
  type Result = { throughput: PipelineRow; latency: LatencyRow } | { tools: ToolFigures };
  const modes: { name: string; run: () => Promise<Result> }[] = [
    {
      name: 'embedded',
      run: async () => {
        const dirs: string[] = [];
        try {
          return await pipelineRound('embedded', () => ({ kind: 'embedded', dir: (dirs.push(mkdtempSync(join(tmpdir(), 'rlstream-bench-pipe-'))), dirs.at(-1)!) }) as LogConfig, groups, latencyGroups, serde);
        } finally {
          for (const d of dirs) rmSync(d, { recursive: true, force: true });
        }
      },
    },
  ];
  const kafkaModes: string[] = [];
  if (brokers) {
    const list = brokers.split(',');
    for (const client of rdKafkaAvailable() ? (['kafkajs', 'librdkafka'] as const) : (['kafkajs'] as const)) {
      const name = `kafka/${client}`;
      kafkaModes.push(name);
      modes.push({ name, run: () => pipelineRound(name, () => ({ kind: 'kafka', brokers: list, client }), groups, latencyGroups, serde) });
    }
    if (!rdKafkaAvailable()) console.log('librdkafka is not built (bash infra/setup.sh --kafka-native): its Kafka rows skipped');
    modes.push({
      name: 'kafka tools',
      run: async () => {
        // A discarded run first: the broker's and the page cache's state as warm as the pipeline's.
        await kafkaTools(list[0]!, Math.min(records, 2000), 0, sample.length);
        return { tools: await kafkaTools(list[0]!, records, Math.max(1000, Math.round(records / 4)), sample.length) };
      },
    });
  } else console.log('KAFKA_BROKERS is not set: Kafka rows skipped');
  console.log(`pipeline: ${groups} groups × ${GROUP} trajectories of ${TOKENS} tokens (${sample.length} bytes each) per pass; ${rounds} interleaved rounds of ${modes.map((m) => m.name).join(', ')}${quick ? ' (--quick: smoke size, figures mean nothing)' : ''}`);
  const recs = await interleaved<Result>(modes, rounds);
  for (const r of recs) if (r.error) console.log(`round ${r.round + 1} ${r.mode}: FAILED\n${r.error}`);
  const pipe = recs.filter((r) => r.result && 'throughput' in r.result) as (typeof recs[number] & { result: { throughput: PipelineRow; latency: LatencyRow } })[];
  const tools = recs.filter((r) => r.result && 'tools' in r.result).map((r) => (r.result as { tools: ToolFigures }).tools);
  const fig = (f: (x: { throughput: PipelineRow; latency: LatencyRow }) => number) => summarize(pipe, f);
  const summary = {
    trajPerSec: fig((x) => x.throughput.trajPerSec),
    MBPerSec: fig((x) => x.throughput.MBPerSec),
    backlogP50Ms: fig((x) => x.throughput.backlogP50Ms),
    backlogP99Ms: fig((x) => x.throughput.backlogP99Ms),
    latencyP50Ms: fig((x) => x.latency.p50Ms),
    latencyP99Ms: fig((x) => x.latency.p99Ms),
  };
  const logs = modes.filter((m) => m.name !== 'kafka tools').map((m) => m.name);
  console.log(`\n(a) pipeline, reward → advantage → consuming trainer; median [min–max] over ${rounds} rounds`);
  console.log('log               traj/s              MB/s              backlog p50 ms        backlog p99 ms        latency p50 ms     latency p99 ms');
  for (const l of logs) console.log([l.padEnd(17), fmtStats(summary.trajPerSec[l]!, 0).padEnd(19), fmtStats(summary.MBPerSec[l]!, 2).padEnd(17), fmtStats(summary.backlogP50Ms[l]!, 0).padEnd(21), fmtStats(summary.backlogP99Ms[l]!, 0).padEnd(21), fmtStats(summary.latencyP50Ms[l]!, 1).padEnd(18), fmtStats(summary.latencyP99Ms[l]!, 1)].join(' '));
  console.log(`(backlog: send → trainer while the producer floods ${records} trajectories, the queue's drain time; latency: created → decoded by the trainer, ${latencyGroups} groups sent one at a time at half the measured throughput)`);
  let toolsSummary: { produce: Stats; consume: Stats; ratio: Record<string, Stats> } | null = null;
  if (tools.length > 0) {
    const produce = tools.map((t) => t.produceRecPerSec);
    const consume = tools.map((t) => t.consumeRecPerSec);
    // The ratio round by round: the pipeline on Kafka (each client) against the slower tool of the same round.
    const ratioOf = (mode: string) =>
      recs
        .filter((r) => r.mode === 'kafka tools' && r.result)
        .map((r) => {
          const k = pipe.find((x) => x.round === r.round && x.mode === mode);
          const t = (r.result as { tools: ToolFigures }).tools;
          return k ? k.result.throughput.trajPerSec / Math.min(t.produceRecPerSec, t.consumeRecPerSec) : NaN;
        });
    toolsSummary = { produce: stats(produce), consume: stats(consume), ratio: Object.fromEntries(kafkaModes.map((m) => [m, stats(ratioOf(m))])) };
    console.log(`Kafka tools, same payload, ${records} records (ProducerPerformance after ${tools[0]!.warmupRecords} warm-up records): ProducerPerformance ${fmtStats(toolsSummary.produce, 0)} rec/s, ConsumerPerformance ${fmtStats(toolsSummary.consume, 0)} rec/s`);
    for (const m of kafkaModes) console.log(`ratio: pipeline on ${m} / min(tool produce, tool consume), same round = ${fmtStats(toolsSummary.ratio[m]!, 3)} (three stages, each consuming, transforming and producing transactionally)`);
  }
  const speed = probeSummary(recs);
  console.log(`machine speed before each mode: sgemm ${fmtStats(speed.sgemmGflops, 0)} GFLOP/s, JS loop ${fmtStats(speed.jsLoopMs, 0)} ms, load ${fmtStats(speed.load1m, 1)}`);
  let memory: Record<string, number | null> | null = null;
  if (f['no-memory'] !== true && !quick) {
    memory = await roleMemory();
    if (memory) {
      console.log('\n(c) resident memory of each role (own process, distributed shape, tiny model), MiB at steady state (one run):');
      console.log(ROLES.map((r) => `${r} ${memory![r]}`).join('   '));
    } else console.log('(c) memory skipped: needs SCHEMA_REGISTRY_URL, CLICKHOUSE_URL and the Kafka jars');
  }
  console.log('\n(b) asynchronous speed-up (sync vs staleness 1/2/4 with a heavy-tailed tool): its own benchmark, `npm run bench -- async`');
  if (recs.some((r) => r.error)) process.exitCode = 1;
  return {
    options: { groups, records, latencyGroups, rounds, quick },
    tokens: TOKENS,
    groupSize: GROUP,
    payloadBytes: sample.length,
    summary,
    kafkaTools: toolsSummary,
    machineSpeed: speed,
    rounds: recs,
    memoryMiB: memory,
    asyncSpeedup: 'npm run bench -- async',
  };
}

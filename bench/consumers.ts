// Throughput of the reward and advantage consumers: groups of 8 trajectories of 1,000 response tokens, on the
// embedded log and (when KAFKA_BROKERS is set) on Kafka through each client (kafkajs, and librdkafka once
// infra/setup.sh has built it); plus the serde cost per trajectory, since decoding
// and encoding the token arrays is the floor under any consumer.
//   npm run bench -- consumers [groups] [--rounds 3] [--quick]
// groups: per log, so that each timed stage lasts several seconds here: 6,000 on the embedded log (48,000
// trajectories, ~390 MB a topic in a directory removed after each round), 1,000 on Kafka (8,000); a number
// given applies to both. A stage shorter than 5 s is flagged, since its figure is then mostly start-up and noise. The logs run in interleaved rounds
// (embedded, Kafka, embedded, Kafka, …; bench/harness.ts), each round on fresh topics (and a fresh directory for
// the embedded log) with a machine-speed probe before it; figures are the median [min–max] over rounds.
// --quick: 20 groups, 2 rounds: proves it runs, the figures mean nothing.
//
// What is measured is the steady state of a running processor: each log first gets a warm-up pass (its own
// topics, WARMUP_GROUPS groups, the same processors' code) so that the timed pass is not mostly JIT
// compilation; the timed pass then covers every record from the first poll to the last commit. Besides
// wall-clock throughput, the CPU time of the process per trajectory is reported: on a shared machine wall
// time also counts other processes' load, CPU time much less so. The share of the stage the processor spent in
// its transactions (begin to commit, on Kafka the round trips to the broker) and the time of one are printed too:
// what the processors wait on the log rather than compute. Before each timed stage the embedded log is
// flushed (outside the timing): under fsync 'transaction' segments become durable at journal checkpoints, and
// the stage's first checkpoint would otherwise also write out what earlier phases left in the page cache (the
// produced input, the previous stage's output), charging their disk time to this stage (docs/benchmarks.md);
// each stage still pays for making its own output durable.
import { rmSync } from 'node:fs';
import { newId } from '../core/ids.ts';
import { openLog, type LogConfig } from '../core/log/open.ts';
import { rdKafkaAvailable } from '../core/log/kafka/librdkafka/binding.ts';
import type { EventLog } from '../core/log/types.ts';
import { StreamProcessor } from '../core/processor.ts';
import type { EventSerde } from '../core/serde/events.ts';
import { RewardHandler } from '../consumers/reward/consumer.ts';
import { AdvantageHandler } from '../consumers/advantage/consumer.ts';
import { completed, newSerde, rewarded, tempDir, trajectory } from '../testkit/events.ts';
import { int, parseFlags, ROUND_FLAGS } from './flags.ts';
import { fmtStats, interleaved, probeSummary, summarize, type Mode } from './harness.ts';
import { runTopic } from './kafka-topics.ts';

const TOKENS = 1000;
const GROUP = 8;
const WARMUP_GROUPS = 60;
/** A timed stage shorter than this is flagged in the output: too short to be more than start-up and noise. */
const MIN_STAGE_S = 5;
/** Records per transaction, as the consumers' own defaults (reward 256 without a model, advantage 500). */
const BATCH = { reward: 256, advantage: 500 };

interface Row {
  log: string;
  stage: string;
  trajectories: number;
  seconds: number;
  trajPerSec: number;
  tokensPerSec: number;
  /** CPU time of the whole process (every thread) per trajectory. */
  cpuUsPerTraj: number;
  transactions: number;
  /** Share of the stage's wall time the processor spent waiting in its transactions (begin to commit). */
  inTransactions: number;
  msPerTransaction: number;
}

interface Timed {
  seconds: number;
  cpuUs: number;
  transactions: number;
  transactionMs: number;
  recordsOut: number;
}

/** A stage that makes no progress for this long fails the benchmark instead of hanging it. */
const STALL_MS = 60_000;

async function timeProcessor(p: StreamProcessor, total: number): Promise<Timed> {
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const running = p.run();
  let failed: unknown = null;
  running.catch((err: unknown) => (failed = err));
  // Every trajectory gives one output, counted once its transaction committed: done when all are (checked every
  // 2 ms, which bounds what the check adds). Not the group's lag: on Kafka a transactional input topic ends
  // with commit markers, which take offsets a consumer never commits past, so its lag never reaches 0.
  let seen = 0;
  let progressAt = Date.now();
  while (p.metrics().recordsOut < total) {
    if (failed) throw failed;
    const out = p.metrics().recordsOut;
    if (out > seen) [seen, progressAt] = [out, Date.now()];
    if (Date.now() - progressAt > STALL_MS) throw new Error(`no progress for ${STALL_MS / 1000} s: ${JSON.stringify(p.metrics())}`);
    await new Promise((r) => setTimeout(r, 2));
  }
  const seconds = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  await p.stop();
  await running;
  const m = p.metrics();
  if (m.recordsOut !== total) throw new Error(`${m.recordsOut} outputs for ${total} trajectories (dead-lettered ${m.deadLettered})`);
  return { seconds, cpuUs: cpu.user + cpu.system, transactions: m.transactions, transactionMs: m.transactionMs, recordsOut: m.recordsOut };
}

/** One pass over fresh topics: produce the groups, then time the reward stage, then the advantage stage. */
async function pass(kind: string, log: EventLog, serde: EventSerde, groups: number): Promise<Row[]> {
  const s = newId().slice(0, 8);
  const topics = { in: runTopic('bench', `in-${s}`), rewarded: runTopic('bench', `rw-${s}`), advantaged: runTopic('bench', `adv-${s}`), dlq: runTopic('bench', `dlq-${s}`) };
  for (const t of Object.values(topics)) await log.createTopic({ name: t, partitions: 4 });
  const total = groups * GROUP;
  const p = await log.producer();
  for (let g = 0; g < groups; g += 50) {
    const batch = [];
    for (let k = g; k < Math.min(groups, g + 50); k++) for (let i = 0; i < GROUP; i++) {
      const t = trajectory({ groupId: `g${k}`, index: i, tokens: TOKENS, groupSize: GROUP });
      batch.push({ key: t.group_id, value: serde.encode('TrajectoryCompleted', completed(t)) });
    }
    await p.send(topics.in, batch);
  }
  await p.close();
  // EventLog has no flush (Kafka needs none); the embedded log's makes every segment durable.
  const settle = () => (log as { flush?: () => void }).flush?.();
  const row = (stage: string, t: Timed): Row => ({
    log: kind,
    stage,
    trajectories: total,
    seconds: t.seconds,
    trajPerSec: total / t.seconds,
    tokensPerSec: (total * TOKENS) / t.seconds,
    cpuUsPerTraj: t.cpuUs / total,
    transactions: t.transactions,
    inTransactions: t.transactionMs / 1000 / t.seconds,
    msPerTransaction: t.transactionMs / Math.max(1, t.transactions),
  });
  const reward = new StreamProcessor({ id: runTopic('bench', `reward-${s}`), log, serde, inputTopics: [topics.in], accepts: ['TrajectoryCompleted'], handler: new RewardHandler('reward', { outputTopic: topics.rewarded }), deadLetterTopic: topics.dlq, maxBatchRecords: BATCH.reward });
  settle();
  const rows = [row('reward', await timeProcessor(reward, total))];
  const adv = new StreamProcessor({ id: runTopic('bench', `adv-${s}`), log, serde, inputTopics: [topics.rewarded], accepts: ['RewardedTrajectory'], handler: new AdvantageHandler('advantage', { outputTopic: topics.advantaged }), deadLetterTopic: topics.dlq, maxBatchRecords: BATCH.advantage });
  settle();
  rows.push(row('advantage (grpo)', await timeProcessor(adv, total)));
  return rows;
}

/** One pass on a log opened for it (a fresh directory for the embedded log, removed after). */
async function onFreshLog(kind: string, config: () => { config: LogConfig; cleanup(): void }, serde: EventSerde, groups: number): Promise<Row[]> {
  const c = config();
  const log = await openLog(c.config);
  try {
    return await pass(kind, log, serde, groups);
  } finally {
    await log.close();
    c.cleanup();
  }
}

/** Microseconds per call: the best of several rounds after a warm-up (the steady state of the JIT-compiled code). */
function bestOf(f: () => void, perRound = 300, rounds = 10): number {
  for (let i = 0; i < perRound; i++) f();
  let best = Infinity;
  for (let r = 0; r < rounds; r++) {
    const t0 = performance.now();
    for (let i = 0; i < perRound; i++) f();
    best = Math.min(best, ((performance.now() - t0) * 1000) / perRound);
  }
  return best;
}

async function serdeCost(): Promise<Record<string, number>> {
  const serde = await newSerde();
  const t = trajectory({ groupId: 'g', index: 0, tokens: TOKENS });
  const tc = serde.encode('TrajectoryCompleted', completed(t));
  const rw = rewarded(t, 1);
  const adv = { ...rw, estimator: 'grpo', advantages: new Array<number>(TOKENS).fill(0.5), returns: new Array<number>(TOKENS).fill(0.5), group: { group_members: 8, expected_size: 8, reward_mean: 0, reward_std: 1, partial: false } };
  return {
    decodeTrajectoryCompletedUs: bestOf(() => serde.tryDecodeSync(tc)),
    encodeRewardedUs: bestOf(() => serde.encode('RewardedTrajectory', rw)),
    encodeAdvantagedUs: bestOf(() => serde.encode('AdvantagedTrajectory', adv)),
    bytesPerTrajectory: tc.length,
  };
}

export async function main(args: string[]): Promise<unknown> {
  const { values: f, positional } = parseFlags(args, ROUND_FLAGS, { positionals: [['groups', int(1)]] });
  const quick = f.quick === true;
  const rounds = f.rounds ?? (quick ? 2 : 3);
  const given = positional.groups ?? null;
  const kafkaGroups = given ?? (quick ? 20 : 1000);
  const groupsOf: Record<string, number> = { embedded: given ?? (quick ? 20 : 6000), 'kafka/kafkajs': kafkaGroups, 'kafka/librdkafka': kafkaGroups };
  const warmupGroups = quick ? 10 : WARMUP_GROUPS;
  const serde = await serdeCost();
  console.log(`serde per trajectory (${TOKENS} tokens, ${serde.bytesPerTrajectory} bytes; best of 10 rounds after warm-up): decode ${serde.decodeTrajectoryCompletedUs!.toFixed(1)} µs, encode Rewarded ${serde.encodeRewardedUs!.toFixed(1)} µs, encode Advantaged ${serde.encodeAdvantagedUs!.toFixed(1)} µs`);
  console.log(`→ serde alone caps the reward consumer near ${Math.round(1e6 / (serde.decodeTrajectoryCompletedUs! + serde.encodeRewardedUs!))} traj/s on one core`);
  const eventSerde = await newSerde();
  const embedded = () => {
    const dir = tempDir('bench');
    return { config: { kind: 'embedded', dir, fsync: 'transaction' } as LogConfig, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
  };
  const logs: [string, () => { config: LogConfig; cleanup(): void }][] = [['embedded', embedded]];
  const brokers = process.env['KAFKA_BROKERS'];
  if (brokers) {
    for (const client of rdKafkaAvailable() ? (['kafkajs', 'librdkafka'] as const) : (['kafkajs'] as const)) {
      logs.push([`kafka/${client}`, () => ({ config: { kind: 'kafka', brokers: brokers.split(','), client }, cleanup: () => {} })]);
    }
    if (!rdKafkaAvailable()) console.log('librdkafka is not built (bash infra/setup.sh --kafka-native): its Kafka rows skipped');
  } else console.log('KAFKA_BROKERS is not set: Kafka rows skipped');
  // Warm-up: one pass of each log, untimed, so that the rounds measure JIT-compiled code.
  for (const [kind, config] of logs) await onFreshLog(kind, config, eventSerde, warmupGroups);
  const modes: Mode<Row[]>[] = logs.map(([kind, config]) => ({ name: kind, run: () => onFreshLog(kind, config, eventSerde, groupsOf[kind]!) }));
  console.log(`${rounds} interleaved rounds of ${logs.map(([k]) => `${k} (${groupsOf[k]} groups, ${groupsOf[k]! * GROUP} trajectories a stage)`).join(', ')}, after a warm-up pass of ${warmupGroups} groups on each${quick ? ' (--quick: smoke size, figures mean nothing)' : ''}`);
  const recs = await interleaved(modes, rounds);
  for (const r of recs) if (r.error) console.log(`round ${r.round + 1} ${r.mode}: FAILED\n${r.error}`);
  // One record per (log, stage) and round, for the summaries.
  const stageRecs = recs.flatMap((r) => (r.result ?? []).map((row) => ({ ...r, mode: `${row.log}|${row.stage}`, result: row })));
  const trajPerSec = summarize(stageRecs, (x) => x.trajPerSec);
  const cpuUsPerTraj = summarize(stageRecs, (x) => x.cpuUsPerTraj);
  const seconds = summarize(stageRecs, (x) => x.seconds);
  const inTransactions = summarize(stageRecs, (x) => x.inTransactions * 100);
  const msPerTransaction = summarize(stageRecs, (x) => x.msPerTransaction);
  console.log(`\ntransactions of up to ${BATCH.reward} (reward) / ${BATCH.advantage} (advantage) records; median [min–max] over ${rounds} rounds`);
  console.log('log               stage              trajectories  seconds             traj/s              tokens/s (M)       cpu µs/traj         in txns %          ms/txn');
  const short: string[] = [];
  for (const key of Object.keys(trajPerSec)) {
    const [log, stage] = key.split('|') as [string, string];
    const tps = trajPerSec[key]!;
    if (seconds[key]!.min < MIN_STAGE_S) short.push(`${log} ${stage} (shortest ${seconds[key]!.min.toFixed(1)} s)`);
    const tok = { ...tps, median: (tps.median * TOKENS) / 1e6, min: (tps.min * TOKENS) / 1e6, max: (tps.max * TOKENS) / 1e6 };
    console.log(`${log.padEnd(17)} ${stage.padEnd(18)} ${String(groupsOf[log]! * GROUP).padStart(12)}  ${fmtStats(seconds[key]!, 2).padEnd(19)} ${fmtStats(tps, 0).padEnd(19)} ${fmtStats(tok, 2).padEnd(18)} ${fmtStats(cpuUsPerTraj[key]!, 0).padEnd(19)} ${fmtStats(inTransactions[key]!, 0).padEnd(18)} ${fmtStats(msPerTransaction[key]!, 0)}`);
  }
  if (short.length > 0) console.log(`short stages (< ${MIN_STAGE_S} s; raise groups for a figure to quote): ${short.join(', ')}`);
  const speed = probeSummary(recs);
  console.log(`machine speed before each round: sgemm ${fmtStats(speed.sgemmGflops, 0)} GFLOP/s, JS loop ${fmtStats(speed.jsLoopMs, 0)} ms, load ${fmtStats(speed.load1m, 1)}`);
  if (recs.some((r) => r.error)) process.exitCode = 1;
  return {
    options: { groups: groupsOf, rounds, warmupGroups, quick },
    serde,
    summary: { trajPerSec, cpuUsPerTraj, seconds, inTransactions, msPerTransaction },
    shortStages: short,
    machineSpeed: speed,
    rounds: recs,
    batch: BATCH,
    note: 'cpu µs/traj counts every thread of the process',
  };
}

// Throughput of the reward and advantage consumers: groups of 8 trajectories of 1,000 response tokens, on the
// embedded log and (when KAFKA_BROKERS is set) on Kafka; plus the serde cost per trajectory, since decoding
// and encoding the token arrays is the floor under any consumer. `npm run bench -- consumers [groups]`.
//
// What is measured is the steady state of a running processor: each log first gets a warm-up pass (its own
// topics, WARMUP_GROUPS groups, the same processors' code) so that the timed pass is not mostly JIT
// compilation; the timed pass then covers every record from the first poll to the last commit. Besides
// wall-clock throughput, the CPU time of the process per trajectory is reported: on a shared machine wall
// time also counts other processes' load, CPU time much less so. Before each timed stage the embedded log is
// flushed (outside the timing): under fsync 'transaction' segments become durable at journal checkpoints, and
// the stage's first checkpoint would otherwise also write out what earlier phases left in the page cache (the
// produced input, the previous stage's output), charging their disk time to this stage (docs/benchmarks.md);
// each stage still pays for making its own output durable.
import { rmSync } from 'node:fs';
import { newId } from '../core/ids.ts';
import { openLog, type LogConfig } from '../core/log/open.ts';
import type { EventLog } from '../core/log/types.ts';
import { StreamProcessor } from '../core/processor.ts';
import type { EventSerde } from '../core/serde/events.ts';
import { RewardHandler } from '../consumers/reward/consumer.ts';
import { AdvantageHandler } from '../consumers/advantage/consumer.ts';
import { completed, newSerde, rewarded, tempDir, trajectory } from '../testkit/events.ts';

const TOKENS = 1000;
const GROUP = 8;
const WARMUP_GROUPS = 60;
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
}

interface Timed {
  seconds: number;
  cpuUs: number;
  transactions: number;
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
  return { seconds, cpuUs: cpu.user + cpu.system, transactions: m.transactions, recordsOut: m.recordsOut };
}

/** One pass over fresh topics: produce the groups, then time the reward stage, then the advantage stage. */
async function pass(kind: string, log: EventLog, serde: EventSerde, groups: number): Promise<Row[]> {
  const s = newId().slice(0, 8);
  const topics = { in: `bench-in-${s}`, rewarded: `bench-rw-${s}`, advantaged: `bench-adv-${s}`, dlq: `bench-dlq-${s}` };
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
  });
  const reward = new StreamProcessor({ id: `bench-reward-${s}`, log, serde, inputTopics: [topics.in], accepts: ['TrajectoryCompleted'], handler: new RewardHandler('reward', { outputTopic: topics.rewarded }), deadLetterTopic: topics.dlq, maxBatchRecords: BATCH.reward });
  settle();
  const rows = [row('reward', await timeProcessor(reward, total))];
  const adv = new StreamProcessor({ id: `bench-adv-${s}`, log, serde, inputTopics: [topics.rewarded], accepts: ['RewardedTrajectory'], handler: new AdvantageHandler('advantage', { outputTopic: topics.advantaged }), deadLetterTopic: topics.dlq, maxBatchRecords: BATCH.advantage });
  settle();
  rows.push(row('advantage (grpo)', await timeProcessor(adv, total)));
  return rows;
}

async function benchLog(kind: string, config: LogConfig, groups: number): Promise<Row[]> {
  const serde = await newSerde();
  const log = await openLog(config);
  try {
    await pass(kind, log, serde, Math.min(groups, WARMUP_GROUPS));
    return await pass(kind, log, serde, groups);
  } finally {
    await log.close();
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
  const adv = { ...rw, estimator: 'grpo', advantages: new Array<number>(TOKENS).fill(0.5), returns: new Array<number>(TOKENS).fill(0.5), group: { group_size: 8, expected_size: 8, reward_mean: 0, reward_std: 1, partial: false } };
  return {
    decodeTrajectoryCompletedUs: bestOf(() => serde.tryDecodeSync(tc)),
    encodeRewardedUs: bestOf(() => serde.encode('RewardedTrajectory', rw)),
    encodeAdvantagedUs: bestOf(() => serde.encode('AdvantagedTrajectory', adv)),
    bytesPerTrajectory: tc.length,
  };
}

export async function main(args: string[]): Promise<unknown> {
  const groups = Number(args[0] ?? 1000);
  if (!Number.isInteger(groups) || groups < 1) throw new Error(`groups must be a positive integer, got ${args[0]}`);
  const serde = await serdeCost();
  console.log(`serde per trajectory (${TOKENS} tokens, ${serde.bytesPerTrajectory} bytes; best of 10 rounds after warm-up): decode ${serde.decodeTrajectoryCompletedUs!.toFixed(1)} µs, encode Rewarded ${serde.encodeRewardedUs!.toFixed(1)} µs, encode Advantaged ${serde.encodeAdvantagedUs!.toFixed(1)} µs`);
  console.log(`→ serde alone caps the reward consumer near ${Math.round(1e6 / (serde.decodeTrajectoryCompletedUs! + serde.encodeRewardedUs!))} traj/s on one core`);
  const dir = tempDir('bench');
  // Two passes write ~350 MB: the directory goes once measured.
  const rows = await benchLog('embedded', { kind: 'embedded', dir, fsync: 'transaction' }, groups).finally(() => rmSync(dir, { recursive: true, force: true }));
  const brokers = process.env['KAFKA_BROKERS'];
  if (brokers) rows.push(...(await benchLog('kafka', { kind: 'kafka', brokers: brokers.split(',') }, Math.min(groups, 125))));
  else console.log('KAFKA_BROKERS is not set: Kafka rows skipped');
  console.log(`\nafter a warm-up pass of ${WARMUP_GROUPS} groups; transactions of up to ${BATCH.reward} (reward) / ${BATCH.advantage} (advantage) records`);
  console.log('log       stage              trajectories  seconds  traj/s   tokens/s  cpu µs/traj  transactions');
  for (const r of rows) console.log(`${r.log.padEnd(9)} ${r.stage.padEnd(18)} ${String(r.trajectories).padStart(12)} ${r.seconds.toFixed(2).padStart(8)} ${Math.round(r.trajPerSec).toString().padStart(7)} ${(r.tokensPerSec / 1e6).toFixed(2).padStart(8)}M ${r.cpuUsPerTraj.toFixed(0).padStart(12)} ${String(r.transactions).padStart(13)}`);
  return { serde, rows, warmupGroups: WARMUP_GROUPS, batch: BATCH, note: 'shared 2-core machine: timings are noisy; cpu µs/traj counts every thread of the process' };
}

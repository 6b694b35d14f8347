// Throughput of the reward and advantage consumers: groups of 8 trajectories of 1,000 response tokens, on the
// embedded log and (when KAFKA_BROKERS is set) on Kafka; plus the serde cost per trajectory, since decoding
// and encoding the token arrays is the floor under any consumer. `npm run bench -- consumers [groups]`.
import { newId } from '../core/ids.ts';
import { openLog, type LogConfig } from '../core/log/open.ts';
import { StreamProcessor } from '../core/processor.ts';
import { RewardHandler } from '../consumers/reward/consumer.ts';
import { AdvantageHandler } from '../consumers/advantage/consumer.ts';
import { completed, newSerde, rewarded, tempDir, trajectory } from '../test/consumers/processor-fixtures.ts';

const TOKENS = 1000;
const GROUP = 8;

interface Row {
  log: string;
  stage: string;
  trajectories: number;
  seconds: number;
  trajPerSec: number;
  tokensPerSec: number;
}

async function timeProcessor(p: StreamProcessor, total: number): Promise<number> {
  const t0 = performance.now();
  const running = p.run();
  while ((p.metrics().recordsIn < total || (await p.lag()) > 0)) await new Promise((r) => setTimeout(r, 5));
  const seconds = (performance.now() - t0) / 1000;
  await p.stop();
  await running;
  return seconds;
}

async function benchLog(kind: string, config: LogConfig, groups: number): Promise<Row[]> {
  const serde = await newSerde();
  const log = await openLog(config);
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
  const rows: Row[] = [];
  const reward = new StreamProcessor({ id: `bench-reward-${s}`, log, serde, inputTopics: [topics.in], accepts: ['TrajectoryCompleted'], handler: new RewardHandler('reward', { outputTopic: topics.rewarded }), deadLetterTopic: topics.dlq, maxBatchRecords: 500 });
  const rs = await timeProcessor(reward, total);
  rows.push({ log: kind, stage: 'reward', trajectories: total, seconds: rs, trajPerSec: total / rs, tokensPerSec: (total * TOKENS) / rs });
  const adv = new StreamProcessor({ id: `bench-adv-${s}`, log, serde, inputTopics: [topics.rewarded], accepts: ['RewardedTrajectory'], handler: new AdvantageHandler('advantage', { outputTopic: topics.advantaged }), deadLetterTopic: topics.dlq, maxBatchRecords: 500 });
  const as = await timeProcessor(adv, total);
  rows.push({ log: kind, stage: 'advantage (grpo)', trajectories: total, seconds: as, trajPerSec: total / as, tokensPerSec: (total * TOKENS) / as });
  await log.close();
  return rows;
}

async function serdeCost(): Promise<Record<string, number>> {
  const serde = await newSerde();
  const t = trajectory({ groupId: 'g', index: 0, tokens: TOKENS });
  const n = 3000;
  const tc = serde.encode('TrajectoryCompleted', completed(t));
  const rw = rewarded(t, 1);
  const adv = { ...rw, estimator: 'grpo', advantages: new Array<number>(TOKENS).fill(0.5), returns: new Array<number>(TOKENS).fill(0.5), group: { group_size: 8, expected_size: 8, reward_mean: 0, reward_std: 1, partial: false } };
  const time = (f: () => void) => {
    const t0 = performance.now();
    for (let i = 0; i < n; i++) f();
    return ((performance.now() - t0) * 1000) / n;
  };
  return {
    decodeTrajectoryCompletedUs: time(() => serde.tryDecodeSync(tc)),
    encodeRewardedUs: time(() => serde.encode('RewardedTrajectory', rw)),
    encodeAdvantagedUs: time(() => serde.encode('AdvantagedTrajectory', adv)),
    bytesPerTrajectory: tc.length,
  };
}

export async function main(args: string[]): Promise<unknown> {
  const groups = Number(args[0] ?? 250);
  const serde = await serdeCost();
  console.log(`serde per trajectory (${TOKENS} tokens, ${serde.bytesPerTrajectory} bytes): decode ${serde.decodeTrajectoryCompletedUs!.toFixed(1)} µs, encode Rewarded ${serde.encodeRewardedUs!.toFixed(1)} µs, encode Advantaged ${serde.encodeAdvantagedUs!.toFixed(1)} µs`);
  console.log(`→ serde alone caps the reward consumer near ${Math.round(1e6 / (serde.decodeTrajectoryCompletedUs! + serde.encodeRewardedUs!))} traj/s on one core`);
  const rows = await benchLog('embedded', { kind: 'embedded', dir: tempDir('bench'), fsync: 'transaction' }, groups);
  const brokers = process.env['KAFKA_BROKERS'];
  if (brokers) rows.push(...(await benchLog('kafka', { kind: 'kafka', brokers: brokers.split(',') }, Math.min(groups, 125))));
  else console.log('KAFKA_BROKERS is not set: Kafka rows skipped');
  console.log('\nlog       stage              trajectories  seconds  traj/s   tokens/s');
  for (const r of rows) console.log(`${r.log.padEnd(9)} ${r.stage.padEnd(18)} ${String(r.trajectories).padStart(12)} ${r.seconds.toFixed(2).padStart(8)} ${Math.round(r.trajPerSec).toString().padStart(7)} ${(r.tokensPerSec / 1e6).toFixed(2).padStart(7)}M`);
  return { serde, rows, note: 'shared 2-core machine: timings are noisy' };
}

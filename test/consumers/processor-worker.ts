// Child process of the kill/restart tests (and usable by hand): runs one consumer on a log until it is killed,
// or, with "untilIdle", until its input is consumed and nothing is held, then stops cleanly.
// argv[2]: JSON {role: 'reward'|'advantage', log: LogConfig, topics: {input, output, deadLetter}, untilIdle?,
// batch?, groupTimeoutMs?, partialGroups?}
import { appendFileSync } from 'node:fs';
import { openLog, type LogConfig } from '../../core/log/open.ts';
import { StreamProcessor, type ProcessorHandler } from '../../core/processor.ts';
import { AdvantageHandler } from '../../consumers/advantage/consumer.ts';
import { RewardHandler } from '../../consumers/reward/consumer.ts';
import { RewardRegistry } from '../../consumers/reward/registry.ts';
import { gsm8kReward } from '../../core/tasks/gsm8k.ts';
import { jsonLogger, silentLogger } from '../../core/telemetry.ts';
import { newSerde } from '../../testkit/events.ts';

interface WorkerConfig {
  role: 'reward' | 'advantage';
  id: string;
  log: LogConfig;
  topics: { input: string; output: string; deadLetter: string };
  untilIdle?: boolean;
  batch?: number;
  groupTimeoutMs?: number;
  partialGroups?: 'drop' | 'emit';
}

const cfg = JSON.parse(process.argv[2]!) as WorkerConfig;
const log = await openLog(cfg.log);
const serde = await newSerde();
let handler: ProcessorHandler;
let advantage: AdvantageHandler | undefined;
if (cfg.role === 'reward') {
  const registry = new RewardRegistry().register('gsm8k', gsm8kReward()).register('throws', () => {
    throw new Error('reward exploded');
  });
  handler = new RewardHandler(cfg.id, { registry, outputTopic: cfg.topics.output });
} else {
  advantage = new AdvantageHandler(cfg.id, { outputTopic: cfg.topics.output, groupTimeoutMs: cfg.groupTimeoutMs ?? 60_000, partialGroups: cfg.partialGroups });
  handler = advantage;
}
const processor = new StreamProcessor({
  id: cfg.id,
  log,
  serde,
  inputTopics: [cfg.topics.input],
  accepts: [cfg.role === 'reward' ? 'TrajectoryCompleted' : 'RewardedTrajectory'],
  handler,
  deadLetterTopic: cfg.topics.deadLetter,
  maxBatchRecords: cfg.batch ?? 50,
  logger: process.env['RLSTREAM_WORKER_LOG'] ? jsonLogger({ level: 'info', write: (l) => appendFileSync(process.env['RLSTREAM_WORKER_LOG']!, l + '\n') }) : silentLogger,
});
const running = processor.run();
process.send?.('started');
if (cfg.untilIdle) {
  let idleSince = 0;
  for (;;) {
    await new Promise((r) => setTimeout(r, 100));
    const idle = (await processor.lag()) === 0 && (advantage?.openGroups ?? 0) === 0;
    if (!idle) idleSince = 0;
    else if (!idleSince) idleSince = Date.now();
    else if (Date.now() - idleSince > 300) break;
  }
  await processor.stop();
  await running;
  await log.close();
  process.stdout.write(JSON.stringify(processor.metrics()) + '\n');
} else {
  await running;
}

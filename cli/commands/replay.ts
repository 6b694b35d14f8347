// `rlstream replay`: re-derive from the log. --log is an embedded log directory or Kafka brokers
// (kafka://host:port[,host:port]); --into traces | topic:<name> | jsonl:<file> | log:<dir> | kafka://brokers.
import type { Command } from 'commander';
import { SingleBar, Presets } from 'cli-progress';
import { loadRunConfig } from '../../core/config.ts';
import { RlstreamError } from '../../core/errors.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { openTraceStore } from '../../core/traces/open.ts';
import { estimatorOptions } from '../../consumers/advantage/estimators.ts';
import { ReplayJob } from '../../consumers/replay/job.ts';
import { parsePosition } from '../../consumers/replay/range.ts';
import { openSource } from '../log-source.ts';
import { JsonlTarget, LogCopyTarget, TopicTarget, TracesTarget, type ReplayTarget } from '../../consumers/replay/targets.ts';
import { defaultRewards, loadRewardModule } from '../../consumers/reward/registry.ts';
import { resolvePlugins } from '../run/plugins.ts';
import type { RewardFn } from '../../consumers/reward/types.ts';

/**
 * `path/to/module.ts#export` loads a user's function; otherwise a function registered by data source: the
 * built-ins, and with --config the run's task's own (the calculator's reward is its task's, not a built-in).
 */
async function rewardFn(spec: string, configPath: string | undefined): Promise<{ fn: RewardFn; name: string }> {
  if (spec.includes('#') || /\.(ts|js|mjs)$/.test(spec)) {
    const [path, name] = spec.split('#');
    return { fn: await loadRewardModule(path!, name ?? 'default'), name: spec };
  }
  const rewards = configPath ? (await resolvePlugins(loadRunConfig(configPath))).rewards : defaultRewards;
  const fn = rewards.get(spec);
  if (!fn) throw new RlstreamError('CONFIG_INVALID', `--reward ${spec}: no reward function for that data source (known: ${rewards.names().join(', ')})${configPath ? '' : "; a task's own rewards need the run's config: --config <config.yaml>"}`);
  return { fn, name: spec };
}

export function register(program: Command): void {
  program
    .command('replay')
    .description('re-derive traces, rewards, advantages, SFT data or a copy of the log by replaying it')
    .requiredOption('--log <dir|kafka://brokers>', 'source log: a run directory, its log/ directory, or Kafka brokers')
    .option('--from <offset|ISO time>', 'start (default: the beginning)')
    .option('--to <offset|ISO time>', 'end, exclusive (default: the end when the replay starts)')
    .requiredOption('--into <target>', 'traces | topic:<name> | jsonl:<file> | log:<dir> | kafka://brokers')
    .option('--topics <list>', 'comma-separated topics (default: all but _schemas)')
    .option('--store <target>', 'trace store for --into traces', process.env['RLSTREAM_TRACES'] ?? process.env['CLICKHOUSE_URL'] ?? 'chdb:.rlstream/traces')
    .option('--fresh', 'with --into traces: empty the trace tables first (rebuild from scratch)')
    .option('--reward <fn>', 'recompute rewards with a registered function (by data source name) or module.ts#export')
    .option('--estimator <name>', 'recompute advantages with this estimator (grpo, rloo, …)')
    .option('--config <file>', "the run's config: advantages are recomputed with its advantage estimator and options (--estimator overrides the name), and its task's reward functions may be named in --reward")
    .action(async (o: { log: string; from?: string; to?: string; into: string; topics?: string; store: string; fresh?: boolean; reward?: string; estimator?: string; config?: string }) => {
      const source = await openSource(o.log, !o.into.startsWith('topic:'));
      const closers: (() => Promise<void>)[] = [];
      try {
        const serde = new EventSerde(source.registry);
        await serde.init();
        let target: ReplayTarget;
        if (o.into === 'traces') {
          const store = await openTraceStore(o.store);
          closers.push(() => store.close());
          if (o.fresh) for (const t of (await import('../../core/traces/store.ts')).TRACE_TABLES) await store.exec(`TRUNCATE TABLE IF EXISTS ${t}`);
          target = new TracesTarget(store, serde);
        } else if (o.into.startsWith('topic:')) {
          const advantage = o.config ? loadRunConfig(o.config).advantage : null;
          const estimator = o.estimator ?? advantage?.estimator;
          const derive = {
            ...(o.reward ? { reward: await rewardFn(o.reward, o.config) } : {}),
            ...(estimator ? { estimator } : {}),
            ...(advantage ? { estimatorOptions: estimatorOptions(advantage) } : {}),
          };
          target = await TopicTarget.open(source.log, o.into.slice(6), serde, derive);
        } else if (o.into.startsWith('jsonl:')) {
          target = new JsonlTarget(o.into.slice(6));
        } else if (o.into.startsWith('log:') || o.into.startsWith('kafka://')) {
          const dest = await openSource(o.into.startsWith('log:') ? o.into.slice(4) : o.into, false, false);
          closers.push(() => dest.close());
          target = new LogCopyTarget(source, { ...dest, describe: o.into });
        } else {
          throw new RlstreamError('INPUT_INVALID', `--into must be traces, topic:<name>, jsonl:<file>, log:<dir> or kafka://brokers, got ${o.into}`);
        }
        const job = ReplayJob.start({
          log: source.log,
          serde,
          target,
          ...(o.topics ? { topics: o.topics.split(',') } : {}),
          ...(o.from ? { from: parsePosition(o.from, '--from')! } : {}),
          ...(o.to ? { to: parsePosition(o.to, '--to')! } : {}),
        });
        process.once('SIGINT', () => job.cancel());
        const bar = process.stderr.isTTY ? new SingleBar({ format: 'replay [{bar}] {percentage}% {value}/{total} records | {written} written | {eta}s left' }, Presets.shades_classic) : null;
        bar?.start(1, 0, { written: 0 });
        const timer = setInterval(() => {
          const p = job.progress();
          bar?.setTotal(Math.max(1, p.total));
          bar?.update(p.read, { written: p.written });
        }, 200);
        const end = await job.done;
        clearInterval(timer);
        bar?.update(end.read, { written: end.written });
        bar?.stop();
        // The SFT export says which successful trajectories it left out, and why (see JsonlTarget).
        process.stdout.write(JSON.stringify(target instanceof JsonlTarget ? { ...end, skipped: target.skipped } : end) + '\n');
        if (end.state === 'failed') process.exitCode = 1;
      } finally {
        for (const c of closers.reverse()) await c();
        await source.close();
      }
    });
}

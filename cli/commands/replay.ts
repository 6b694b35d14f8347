// `rlstream replay`: re-derive from the log. --log is an embedded log directory or Kafka brokers
// (kafka://host:port[,host:port]); --into traces | topic:<name> | jsonl:<file> | log:<dir> | kafka://brokers.
import { existsSync, readdirSync, statSync } from 'node:fs';
import type { Command } from 'commander';
import { SingleBar, Presets } from 'cli-progress';
import { loadRunConfig } from '../config/run-config.ts';
import { RlstreamError } from '../../core/errors.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { openTraceStore } from '../../core/traces/open.ts';
import { advantageStage } from '../../consumers/advantage/stage.ts';
import { ReplayJob } from '../../consumers/replay/job.ts';
import { parsePosition } from '../../consumers/replay/range.ts';
import { openSource, type Opened } from '../log-source.ts';
import { resolveEmbeddedLog } from '../run-dir.ts';
import { checkOutputPath, insideDir, samePath } from '../output-path.ts';
import { logOwnership } from '../../consumers/replay/ownership.ts';
import { JsonlTarget, LogCopyTarget, TopicTarget, TracesTarget, type DeriveOptions, type ReplayTarget, type SftSplit } from '../../consumers/replay/targets.ts';
import { rewardStageFor } from '../reward-stage.ts';
import { runAdvantageStage } from '../run/plugins.ts';

interface ReplayOpts {
  log: string;
  from?: string;
  to?: string;
  into: string;
  topics?: string;
  store: string;
  fresh?: boolean;
  reward?: string;
  estimator?: string;
  config?: string;
  split?: string;
  force?: boolean;
  append?: boolean;
  otherRun?: boolean;
}

/** Each flag belongs to some targets: one given for another is refused rather than ignored. */
function checkFlags(o: ReplayOpts): void {
  const kind = o.into === 'traces' ? 'traces' : o.into.startsWith('topic:') ? 'topic' : o.into.startsWith('jsonl:') ? 'jsonl' : o.into.startsWith('log:') || o.into.startsWith('kafka://') ? 'log' : null;
  if (kind === null) throw new RlstreamError('INPUT_INVALID', `--into must be traces, topic:<name>, jsonl:<file>, log:<dir> or kafka://brokers, got ${o.into}`);
  const only: [keyof ReplayOpts, string, string[]][] = [
    ['fresh', '--fresh', ['traces']],
    ['reward', '--reward', ['topic']],
    ['estimator', '--estimator', ['topic']],
    ['config', '--config', ['topic']],
    ['split', '--split', ['jsonl']],
    ['force', '--force', ['jsonl']],
    ['append', '--append', ['topic', 'log']],
    ['otherRun', '--other-run', ['log']],
  ];
  for (const [key, flag, kinds] of only) {
    if (o[key] !== undefined && !kinds.includes(kind)) throw new RlstreamError('INPUT_INVALID', `${flag} applies to --into ${kinds.map((k) => (k === 'log' ? 'log:/kafka://' : k === 'traces' ? 'traces' : `${k}:`)).join(' or ')}, not ${o.into}`);
  }
  if (o.split !== undefined && !['train', 'heldout', 'all'].includes(o.split)) throw new RlstreamError('INPUT_INVALID', `--split must be train, heldout or all, got "${o.split}"`);
  if (o.otherRun && !o.append) throw new RlstreamError('INPUT_INVALID', '--other-run goes with --append (it allows adding to another run\'s log)');
}

/** An embedded destination: a run directory stands for its log/, and a directory that is neither (nor empty) is refused. */
function destinationLog(spec: string, sourceSpec: string): string {
  let dir = spec;
  if (existsSync(spec) && !(statSync(spec).isDirectory() && readdirSync(spec).length === 0)) dir = resolveEmbeddedLog(spec, undefined, '--into log:').log;
  const source = sourceSpec.startsWith('kafka://') ? null : resolveEmbeddedLog(sourceSpec, undefined).log;
  if (source !== null && samePath(dir, source)) throw new RlstreamError('INPUT_INVALID', `--into log:${spec} is the source log (--log ${sourceSpec}): a copy into itself would double every record`);
  if (source !== null && (insideDir(dir, source) || insideDir(source, dir))) throw new RlstreamError('INPUT_INVALID', `--into log:${spec} and the source log (--log ${sourceSpec}) lie one inside the other: choose a directory outside it`);
  return dir;
}

/** A destination that holds records takes the copy only with --append, and another run's only with --other-run too. */
async function checkDestination(o: ReplayOpts, source: Opened, serde: EventSerde, dest: Opened): Promise<void> {
  const there = await logOwnership(dest.log, new EventSerde(dest.registry));
  if (there.records === 0) return;
  const runs = there.runIds.length > 0 ? ` of run ${there.runIds.join(', ')}` : '';
  if (!o.append) throw new RlstreamError('INPUT_INVALID', `--into ${o.into} already holds ${there.records} records${runs}; --append adds the copy to them (or copy into a new log)`);
  const from = await logOwnership(source.log, serde);
  const foreign = from.runIds.filter((id) => !there.runIds.includes(id));
  if (foreign.length > 0 && !o.otherRun) {
    throw new RlstreamError('INPUT_INVALID', `--into ${o.into} belongs to run ${there.runIds.join(', ') || '(none named)'}, the source (--log ${o.log}) to run ${from.runIds.join(', ')}: adding it would mix two runs in one log; --other-run (with --append) adds it anyway`);
  }
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
    .option('--reward <fn>', "recompute rewards: run (the run's own reward stage, with --config), a registered function (by data source name) or module.ts#export")
    .option('--estimator <name>', 'recompute advantages with this estimator (grpo, rloo, …)')
    .option('--config <file>', "the run's config: advantages are recomputed as its advantage stage computes them (estimator, options, dynamic sampling, partial groups; --estimator overrides the name), rewards with its shaping, and its task's reward functions may be named in --reward")
    .option('--split <split>', 'with --into jsonl: the problems whose trajectories are exported: train (default), heldout or all')
    .option('--force', 'with --into jsonl: replace the file if it exists')
    .option('--append', 'with --into topic: or log:/kafka://: add to a target that already holds records (of the same run)')
    .option('--other-run', "with --append: add to a log whose records belong to another run than the source's")
    .action(async (o: ReplayOpts) => {
      checkFlags(o);
      // The stages are resolved before the log is opened: a bad --reward or --config fails without touching it.
      const reward = o.reward ? await rewardStageFor(o.reward, o.config) : undefined;
      if (o.into.startsWith('jsonl:')) {
        const file = o.into.slice(6);
        const sourceDir = o.log.startsWith('kafka://') ? null : resolveEmbeddedLog(o.log, undefined).log;
        if (sourceDir !== null && insideDir(file, sourceDir)) throw new RlstreamError('INPUT_INVALID', `--into jsonl:${file} lies inside the source log (--log ${o.log}): writing it would damage the log; choose a file outside it`);
        checkOutputPath(file, { option: '--into jsonl:', forceFlag: '--force', force: o.force === true });
      }
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
          const derive: DeriveOptions = {
            label: [o.reward ?? '', estimator ?? ''].join('/'),
            ...(reward ? { reward } : {}),
            ...(estimator ? { advantage: advantage ? runAdvantageStage(advantage, estimator) : advantageStage({ estimator }) } : {}),
            ...(advantage ? { partialGroups: advantage.partialGroups } : {}),
          };
          const topic = o.into.slice(6);
          const held = (await source.log.listTopics()).some((t) => t.name === topic) ? (await source.log.offsets(topic)).reduce((a, p) => a + p.high - p.low, 0) : 0;
          if (held > 0 && !o.append) throw new RlstreamError('INPUT_INVALID', `--into topic:${topic} already holds ${held} records; --append adds to them (or name a new topic)`);
          target = await TopicTarget.open(source.log, topic, serde, derive);
        } else if (o.into.startsWith('jsonl:')) {
          target = new JsonlTarget(o.into.slice(6), { split: (o.split ?? 'train') as SftSplit, force: o.force === true });
        } else if (o.into.startsWith('log:') || o.into.startsWith('kafka://')) {
          const destSpec = o.into.startsWith('log:') ? destinationLog(o.into.slice(4), o.log) : o.into;
          const dest = await openSource(destSpec, false, false);
          closers.push(() => dest.close());
          await checkDestination(o, source, serde, dest);
          target = new LogCopyTarget(source, { ...dest, describe: o.into });
        } else throw new RlstreamError('INTERNAL', `--into ${o.into} passed checkFlags`);
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
        // A re-derivation says what the stages left out, as the run's consumers count it.
        const extra =
          target instanceof JsonlTarget
            ? { split: target.split, skipped: target.skipped, skipped_splits: target.skippedSplits }
            : target instanceof TopicTarget
              ? { refused: target.refused, first_refusal: target.firstRefusal, filtered_groups: target.filteredGroups, skipped_not_train: target.skippedNotTrain, dropped_partial_groups: target.droppedPartialGroups }
              : {};
        process.stdout.write(JSON.stringify({ ...end, ...extra }) + '\n');
        if (target instanceof JsonlTarget && target.skipped.other_split > 0) {
          const which = Object.entries(target.skippedSplits).map(([s, n]) => `${n} of split ${s}`).join(', ');
          process.stderr.write(`rlstream replay: left out ${which}: the export takes --split ${target.split} only (--split all takes every split)\n`);
        }
        if (end.state === 'failed') process.exitCode = 1;
      } finally {
        for (const c of closers.reverse()) await c();
        await source.close();
      }
    });
}

// `rlstream worker <role> <config>`: one role of the distributed shape in its own process (Kafka, the HTTP
// registry, ClickHouse server), built exactly as the main job builds it. Runs until SIGTERM / SIGINT, or until
// the trainer reaches trainer.max_steps; a killed process resumes from the log on restart.
import type { Command } from 'commander';
import { loadRunConfig } from '../config/run-config.ts';
import { RlstreamError, describeError } from '../../core/errors.ts';
import { exitNow } from '../../core/stuck-calls.ts';
import { jsonLogger, type Logger } from '../../core/telemetry.ts';
import { openRunContext, openRunTraces } from '../run/context.ts';
import { evaluatePeriodically } from '../run/evaluation.ts';
import { createAdvantage, createBackend, createReward, createTraceSink, createTrainer, createWorker, loadTokenizer, modelFiles, trainRows } from '../run/roles.ts';
import { collectSet } from '../set-option.ts';
import { readResumePoint } from '../../producers/resume.ts';

export const ROLES = ['rollout', 'reward', 'advantage', 'trainer', 'traces'] as const;
type Role = (typeof ROLES)[number];

/**
 * SIGTERM / SIGINT end the role cleanly: its stop() runs once, and the role's code awaits it (settled()) before
 * closing what it may still use (the final commit needs the log and the store). A signal during start-up is
 * kept and applied once the role is built; a second signal exits at once. A failing stop is logged and ends
 * the process with 1 (runRole rethrows it).
 */
class Shutdown {
  requested = false;
  error: unknown = null;
  private stop: (() => Promise<void> | void) | null = null;
  private stopping: Promise<void> | null = null;

  constructor(private readonly logger: Logger) {
    const handler = (signal: NodeJS.Signals) => {
      if (this.requested) {
        logger.warn('second signal: exiting without a clean stop', { signal });
        exitNow(1);
      }
      this.requested = true;
      logger.info('stopping on signal', { signal });
      if (this.stop) this.begin();
    };
    process.on('SIGTERM', handler);
    process.on('SIGINT', handler);
  }

  /** The role's stop, set right before its run() is called (a pending signal applies it on the next turn, once run() has begun). */
  set(stop: () => Promise<void> | void): void {
    this.stop = stop;
    if (this.requested) setImmediate(() => this.begin());
  }

  private begin(): void {
    const stop = this.stop!;
    this.stopping ??= (async () => {
      try {
        await stop();
      } catch (err) {
        this.error = err;
        this.logger.error('stop failed', { error: describeError(err) });
      }
    })();
  }

  /** Wait for a stop a signal began (never throws: see `error`). */
  async settled(): Promise<void> {
    await this.stopping;
  }
}

async function runRole(role: Role, configPath: string, overrides: Record<string, unknown>): Promise<void> {
  const logger = jsonLogger({ fields: { role, pid: process.pid } });
  const shutdown = new Shutdown(logger);
  logger.info('role starting');
  const config = loadRunConfig(configPath, overrides);
  // The roles of the distributed shape meet on Kafka. An embedded log belongs to the one process that opened it: a
  // worker on it would wait, silently, for records no other role can write there.
  if (config.log.kind === 'embedded') {
    throw new RlstreamError('CONFIG_INVALID', `log.kind: embedded in ${configPath}: rlstream worker runs one role of the distributed shape, whose roles meet on Kafka: set log.kind: kafka (README "Distributed shape"), or run every role in one process with rlstream run ${configPath}`);
  }
  const ctx = await openRunContext(config, logger);
  // The log, the registry (the contract's schemas registered) and the topics are there.
  logger.info('role ready');
  const runId = config.run.id;
  try {
    switch (role) {
      case 'reward':
      case 'advantage': {
        const p = role === 'reward' ? await createReward(ctx) : createAdvantage(ctx);
        shutdown.set(() => p.stop());
        await p.run();
        break;
      }
      case 'traces': {
        const store = await openRunTraces(config);
        if (!store) throw new RlstreamError('CONFIG_INVALID', 'traces.kind is "none": the traces role has nothing to write to');
        const sink = createTraceSink(ctx, store);
        shutdown.set(() => sink.stop());
        try {
          // Resolves after the sink's final flush and commit.
          await sink.run();
        } finally {
          await shutdown.settled();
          await store.close();
        }
        break;
      }
      case 'trainer': {
        const trainer = createTrainer(ctx, runId, config.run.dataDir, (s) => logger.info('train step', { step: s.step, version: s.produced_version, reward: s.reward_mean }));
        await trainer.start();
        shutdown.set(() => trainer.stop());
        try {
          await trainer.run();
        } finally {
          await shutdown.settled();
          await trainer.close();
        }
        break;
      }
      case 'rollout': {
        const tokenizer = loadTokenizer(modelFiles(ctx));
        const backend = await createBackend(ctx);
        // A restarted worker walks the same rows: what already completed in the log is not run again, and what
        // runs again gets new trajectory ids.
        const resume = await readResumePoint(ctx.log, ctx.serde, runId);
        if (resume.life !== null) logger.info('resuming: samples already completed', { completed: resume.completed.size });
        const worker = await createWorker(ctx, runId, backend, tokenizer, { resume });
        // eval.every_versions: held-out evaluation of every k-th policy version this worker serves.
        const every = config.eval.everyVersions;
        const stopEval = every !== null ? await evaluatePeriodically(ctx, runId, backend, tokenizer, worker, every, (e) => logger.info('held-out evaluation', { version: e.policy_version, problem_set: e.problem_set, solved: e.solved, n: e.n, mean_reward: e.mean_reward })) : null;
        shutdown.set(async () => {
          await stopEval?.();
          await worker.stop({ abort: true });
        });
        try {
          // task.train_rows caps the task's rows (a finite dataset, so a run has a defined end).
          await worker.run(trainRows(ctx));
          if (!shutdown.requested) {
            await stopEval?.();
            await worker.stop();
          }
        } finally {
          await shutdown.settled();
          await backend.close();
        }
        break;
      }
    }
  } finally {
    await shutdown.settled();
    await ctx.close();
  }
  if (shutdown.error) throw shutdown.error;
}

export function register(program: Command): void {
  program
    .command('worker')
    .description(`run one role of the distributed shape in this process (${ROLES.join(', ')})`)
    .argument('<role>', ROLES.join(' | '))
    .argument('<config>', 'run configuration (YAML) with log.kind: kafka')
    .option('--set <key=value>', 'override a config field (repeatable)', collectSet, {})
    .action(async (role: string, configPath: string, opts: { set: Record<string, unknown> }) => {
      if (!(ROLES as readonly string[]).includes(role)) throw new RlstreamError('CONFIG_INVALID', `unknown role "${role}" (roles: ${ROLES.join(', ')})`);
      try {
        await runRole(role as Role, configPath, opts.set);
      } catch (err) {
        // A role process ends with its role: client connections or timers left behind by a failed start must
        // not keep a dead role alive, where a supervisor would not restart it.
        process.stderr.write(`rlstream: ${describeError(err)}\n`);
        exitNow(1);
      }
      exitNow(0);
    });
}

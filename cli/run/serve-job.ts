// `rlstream serve` assembled from the compiled run config: the configured LLM backend and the model's tokenizer
// behind the OpenAI-compatible endpoint (producers/serve/), its events published to the run's log, new policy
// versions followed and handed to the backend, and, with `train`, the reward, advantage and trainer roles in
// the same process (the embedded log belongs to one process, so an outside agent's run trains beside it).
import { randomBytes } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import type { FastifyInstance } from 'fastify';
import { loadRunConfig } from '../../core/config.ts';
import { describeError } from '../../core/errors.ts';
import type { Consumer } from '../../core/log/types.ts';
import type { StreamProcessor } from '../../core/processor.ts';
import type { Logger } from '../../core/telemetry.ts';
import { TOPICS } from '../../core/topics.ts';
import { parseTokenList, TokenStore, type TokenSpec } from '../../admin/auth.ts';
import { takeFromEnvironment } from '../../admin/environ.ts';
import type { Trainer } from '../../consumers/trainer/trainer.ts';
import type { LlmBackend } from '../../producers/backends/types.ts';
import { compileRolloutOptions } from '../../producers/options.ts';
import { verifyPolicyVersion } from '../../producers/policy-sync.ts';
import { EventPublisher } from '../../producers/publisher.ts';
import { buildServeServer } from '../../producers/serve/server.ts';
import { ServeService, type ServeLimits } from '../../producers/serve/service.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import type { PolicyVersion } from '../../schemas/generated/types.ts';
import { openRunContext, type RunContext } from './context.ts';
import { createAdvantage, createBackend, createReward, createTrainer, modelFiles, rolloutOptions } from './roles.ts';

export const TOKENS_VARIABLE = 'RLSTREAM_SERVE_TOKENS';

export interface ServeJobOptions {
  configPath: string;
  overrides?: Record<string, unknown>;
  host?: string;
  /** 0 picks a free port. */
  port?: number;
  /** The model id served (default: the run id). */
  model?: string;
  /** Also run reward, advantage and trainer in this process. */
  train?: boolean;
  limits?: Partial<ServeLimits>;
  bodyLimitBytes?: number;
  /** Recorded as data_source when a call names none (default: the task's dataset name). */
  dataSource?: string;
  /** Tokens besides RLSTREAM_SERVE_TOKENS (tests); without any, one is generated. */
  tokens?: TokenSpec[];
  /** Wrap the backend (benchmarks and tests observe what it generates). */
  wrapBackend?: (backend: LlmBackend) => LlmBackend;
  logger: Logger;
}

export interface ServeJob {
  url: string;
  /** The token generated when none was configured (shown once by the command, never logged). */
  generatedToken: string | null;
  ctx: RunContext;
  service: ServeService;
  app: FastifyInstance;
  backend: LlmBackend;
  trainer: Trainer | null;
  /** The trainer's run() (resolves at trainer.max_steps), when training. */
  training: Promise<void> | null;
  close(): Promise<void>;
}

function serveTokens(extra: TokenSpec[]): { store: TokenStore; generated: string | null } {
  // Read and removed from the environment, as the admin server's tokens are.
  const specs = [...extra, ...parseTokenList(takeFromEnvironment(TOKENS_VARIABLE) ?? '')];
  if (specs.length > 0) return { store: new TokenStore(specs), generated: null };
  const generated = randomBytes(24).toString('base64url');
  return { store: new TokenStore([{ token: generated, role: 'read', name: 'generated' }]), generated };
}

/** Hand every new PolicyVersion of the run (checksum verified) to the backend, as the rollout worker does. */
function followPolicy(ctx: RunContext, backend: LlmBackend, logger: Logger): () => Promise<void> {
  let stopped = false;
  let consumer: Consumer | null = null;
  const loop = (async () => {
    while (!stopped) {
      try {
        consumer ??= await ctx.log.consumer({ groupId: `serve-${ctx.config.run.id}-${process.pid}-${Date.now()}`, topics: [TOPICS.policyVersions], fromBeginning: true });
        let newest: PolicyVersion | null = null;
        for (const rec of await consumer.poll({ timeoutMs: 200, maxRecords: 100 })) {
          const ev = await ctx.serde.decode(rec.value);
          if (ev.name === 'PolicyVersion' && ev.value.run_id === ctx.config.run.id && (!newest || ev.value.version > newest.version)) newest = ev.value;
        }
        if (newest && newest.version > backend.currentPolicyVersion()) {
          await backend.updatePolicy?.(await verifyPolicyVersion(newest));
          logger.info('policy version applied', { version: newest.version });
        }
      } catch (err) {
        if (stopped) break;
        logger.warn('following policy versions failed; retrying', { error: describeError(err) });
        await new Promise((r) => setTimeout(r, 500));
      }
    }
  })();
  return async () => {
    stopped = true;
    await loop;
    await consumer?.close().catch(() => {});
  };
}

export async function startServeJob(o: ServeJobOptions): Promise<ServeJob> {
  const config = loadRunConfig(o.configPath, o.overrides ?? {});
  const logger = o.logger;
  const ctx = await openRunContext(config, logger);
  const closers: (() => Promise<void>)[] = [];
  try {
    const tokenizer = ChatTokenizer.load(modelFiles(ctx).tokenizerDir);
    const inner = await createBackend(ctx);
    closers.push(() => inner.close());
    const backend = o.wrapBackend ? o.wrapBackend(inner) : inner;
    const producer = await ctx.log.producer();
    closers.push(() => producer.close());
    const publisher = new EventPublisher(producer, ctx.serde, TOPICS.rolloutEvents, logger.child({ component: 'serve' }));
    const service = new ServeService({
      runId: config.run.id,
      backend,
      tokenizer,
      publisher,
      rollout: compileRolloutOptions(rolloutOptions(ctx, tokenizer)),
      limits: { maxSessions: o.limits?.maxSessions ?? 1024, idleTimeoutMs: o.limits?.idleTimeoutMs ?? 600_000 },
      dataSource: o.dataSource ?? ctx.plugins.task.datasetName,
      datasetName: ctx.plugins.task.datasetName,
      logger: logger.child({ role: 'serve' }),
    });
    closers.push(() => service.close());
    const { store, generated } = serveTokens(o.tokens ?? []);
    const app = await buildServeServer({ service, tokenizer, tokens: store, model: o.model ?? config.run.id, logger, ...(o.bodyLimitBytes ? { bodyLimitBytes: o.bodyLimitBytes } : {}) });
    await app.listen({ host: o.host ?? '127.0.0.1', port: o.port ?? 8000 });
    closers.push(() => app.close());
    const stopFollow = followPolicy(ctx, backend, logger.child({ role: 'serve' }));
    closers.push(stopFollow);

    let trainer: Trainer | null = null;
    let training: Promise<void> | null = null;
    if (o.train) {
      const processors: StreamProcessor[] = [await createReward(ctx), createAdvantage(ctx)];
      const runs = processors.map((p) => p.run());
      closers.push(async () => {
        for (const p of processors) await p.stop();
        await Promise.allSettled(runs);
      });
      const t = createTrainer(ctx, config.run.id, config.run.dataDir, (s) => logger.info('train step', { step: s.step, version: s.produced_version, reward: s.reward_mean }));
      await t.start();
      trainer = t;
      training = t.run();
      closers.push(async () => {
        t.stop();
        await training!.catch(() => {});
        await t.close();
      });
    }
    const addr = app.server.address() as AddressInfo;
    const url = `http://${addr.address.includes(':') ? `[${addr.address}]` : addr.address}:${addr.port}`;
    logger.info('serving', { url, model: o.model ?? config.run.id, train: o.train === true });
    return {
      url,
      generatedToken: generated,
      ctx,
      service,
      app,
      backend,
      trainer,
      training,
      close: async () => {
        // Newest first: the server stops taking calls, open trajectories complete, then the roles and the log.
        for (const c of closers.reverse()) await c().catch((err: unknown) => logger.warn('serve shutdown step failed', { error: describeError(err) }));
        await ctx.close();
      },
    };
  } catch (err) {
    for (const c of closers.reverse()) await c().catch(() => {});
    await ctx.close();
    throw err;
  }
}

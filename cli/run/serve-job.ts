// `rlstream serve` assembled from the compiled run config: the configured LLM backend and the model's tokenizer
// behind the OpenAI-compatible endpoint (producers/serve/), its events published to the run's log, new policy
// versions followed and handed to the backend, and, with `train`, the reward, advantage and trainer roles in
// the same process (the embedded log belongs to one process, so an outside agent's run trains beside it).
import type { FastifyInstance } from 'fastify';
import { loadRunConfig, type ServeConfig } from '../config/run-config.ts';
import { describeError } from '../../core/errors.ts';
import { follow } from '../../core/log/follow.ts';
import type { StreamProcessor } from '../../core/processor.ts';
import type { Logger } from '../../core/telemetry.ts';
import { TOPICS } from '../../core/topics.ts';
import type { TokenSpec } from '../../core/auth/tokens.ts';
import type { Trainer } from '../../consumers/trainer/trainer.ts';
import type { LlmBackend } from '../../producers/backends/types.ts';
import { verifyPolicyVersion } from '../../producers/policy-sync.ts';
import type { ServeLimits, ServeService } from '../../producers/serve/service.ts';
import type { PolicyVersion } from '../../schemas/generated/types.ts';
import { openRunContext, type RunContext } from './context.ts';
import { createAdvantage, createBackend, createReward, createTrainer, loadTokenizer, modelFiles } from './roles.ts';
import { openServeEndpoint } from './serve-endpoint.ts';

export { TOKENS_VARIABLE } from './serve-endpoint.ts';

/** Each setting left out takes the config's serve section (cli/config/sections.ts). */
export interface ServeJobOptions {
  configPath: string;
  overrides?: Record<string, unknown>;
  host?: string;
  /** 0 picks a free port (default: serve.port when not 0, else 8000). */
  port?: number;
  /** The model id served (default: serve.model, else the run id). */
  model?: string;
  /** Also run reward, advantage and trainer in this process. */
  train?: boolean;
  limits?: Partial<ServeLimits>;
  bodyLimitBytes?: number;
  requestReadTimeoutMs?: number;
  /** Recorded as data_source when a call names none (default: serve.data_source, else the task's one reward source, else its dataset name). */
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

/** Hand every new PolicyVersion of the run (checksum verified) to the backend, as the rollout worker does. */
function followPolicy(ctx: RunContext, backend: LlmBackend, logger: Logger): () => Promise<void> {
  const follower = follow(
    ctx.log,
    async (records) => {
      let newest: PolicyVersion | null = null;
      for (const rec of records) {
        const ev = await ctx.serde.decode(rec.value);
        if (ev.name === 'PolicyVersion' && ev.value.run_id === ctx.config.run.id && (!newest || ev.value.policy_version > newest.policy_version)) newest = ev.value;
      }
      if (newest && newest.policy_version > backend.currentPolicyVersion()) {
        await backend.updatePolicy?.(await verifyPolicyVersion(newest));
        logger.info('policy version applied', { version: newest.policy_version });
      }
    },
    {
      consumer: () => ({ groupId: `serve-${ctx.config.run.id}-${process.pid}-${Date.now()}`, topics: [TOPICS.policyVersions], fromBeginning: true }),
      poll: { timeoutMs: 200, maxRecords: 100 },
      onError: (err) => logger.warn('following policy versions failed; retrying', { error: describeError(err) }),
    },
  );
  return () => follower.close();
}

export async function startServeJob(o: ServeJobOptions): Promise<ServeJob> {
  const config = loadRunConfig(o.configPath, o.overrides ?? {});
  const logger = o.logger;
  const ctx = await openRunContext(config, logger);
  const closers: (() => Promise<void>)[] = [];
  try {
    const tokenizer = loadTokenizer(modelFiles(ctx));
    const inner = await createBackend(ctx);
    closers.push(() => inner.close());
    const backend = o.wrapBackend ? o.wrapBackend(inner) : inner;
    const c = config.serve;
    const settings: ServeConfig = {
      ...c,
      host: o.host ?? c.host,
      // A standalone endpoint keeps a known port by default, where clients are configured to find it.
      port: o.port ?? (c.port || 8000),
      model: o.model ?? c.model,
      maxSessions: o.limits?.maxSessions ?? c.maxSessions,
      idleTimeoutMs: o.limits?.idleTimeoutMs ?? c.idleTimeoutMs,
      maxSessionsPerToken: o.limits?.maxSessionsPerToken ?? c.maxSessionsPerToken,
      maxCallsPerToken: o.limits?.maxCallsPerToken ?? c.maxCallsPerToken,
      maxPromptTokens: o.limits?.maxPromptTokens ?? c.maxPromptTokens,
      bodyLimitBytes: o.bodyLimitBytes ?? c.bodyLimitBytes,
      requestReadTimeoutMs: o.requestReadTimeoutMs ?? c.requestReadTimeoutMs,
      dataSource: o.dataSource ?? c.dataSource,
    };
    const endpoint = await openServeEndpoint(ctx, { backend, tokenizer, settings, ...(o.tokens ? { tokens: o.tokens } : {}), logger });
    closers.push(() => endpoint.close());
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
    return {
      url: endpoint.url,
      generatedToken: endpoint.generatedToken,
      ctx,
      service: endpoint.service,
      app: endpoint.app,
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

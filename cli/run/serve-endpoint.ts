// The OpenAI-compatible endpoint (producers/serve/) on an open run context and a backend someone else owns:
// `rlstream serve` (cli/run/serve-job.ts) opens it on a backend of its own, the main job (main-job.ts) on the
// backend its rollout worker shares, so both are this one assembly. Its calls are published to the run's
// rollout events as the agent loops' own trajectories are.
import { randomBytes } from 'node:crypto';
import { rmSync, writeFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import type { FastifyInstance } from 'fastify';
import type { ServeConfig } from '../config/run-config.ts';
import { describeError } from '../../core/errors.ts';
import type { Logger } from '../../core/telemetry.ts';
import { TOPICS } from '../../core/topics.ts';
import { parseTokenList, readTokenFile, TokenStore, type TokenSpec } from '../../core/auth/tokens.ts';
import { takeFromEnvironment } from '../../core/auth/environ.ts';
import type { LlmBackend } from '../../producers/backends/types.ts';
import { EventPublisher } from '../../producers/publisher.ts';
import { buildServeServer } from '../../producers/serve/server.ts';
import { TokenizeOffload } from '../../producers/serve/offload.ts';
import { ServeService } from '../../producers/serve/service.ts';
import type { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import type { Task } from '../../producers/tasks.ts';
import type { RunContext } from './context.ts';
import { modelFiles, rolloutOptions } from './roles.ts';

export const TOKENS_VARIABLE = 'RLSTREAM_SERVE_TOKENS';
/** The file of serve tokens (one `token` or `read:token` a line, 0600), the preferred way. */
export const TOKENS_FILE_VARIABLE = 'RLSTREAM_SERVE_TOKENS_FILE';

export interface ServeEndpoint {
  /** http://host:port (the OpenAI base URL is `${url}/v1`). */
  url: string;
  /** The token generated when none was configured (shown once, never logged). */
  generatedToken: string | null;
  service: ServeService;
  app: FastifyInstance;
  /** Stops taking calls, completes open trajectories as aborted, flushes their events. Idempotent. */
  close(): Promise<void>;
}

function serveTokens(extra: TokenSpec[]): { store: TokenStore; generated: string | null } {
  // Read and removed from the environment, as the admin server's tokens are.
  const file = takeFromEnvironment(TOKENS_FILE_VARIABLE);
  const specs = [...extra, ...parseTokenList(takeFromEnvironment(TOKENS_VARIABLE) ?? '', TOKENS_VARIABLE), ...(file ? readTokenFile(file, TOKENS_FILE_VARIABLE) : [])];
  if (specs.length > 0) return { store: new TokenStore(specs), generated: null };
  const generated = randomBytes(24).toString('base64url');
  return { store: new TokenStore([{ token: generated, role: 'read', name: 'generated' }]), generated };
}

/**
 * data_source for calls that name none: serve.data_source, else the source of the task's one reward function (the
 * reward consumer scores by it; the dataset name would have no reward and dead-letter), else the dataset name.
 */
function defaultDataSource(configured: string | null | undefined, task: Pick<Task, 'rewards' | 'datasetName'>): string {
  if (configured !== null && configured !== undefined) return configured;
  const sources = Object.keys(task.rewards ?? {});
  return sources.length === 1 ? sources[0]! : task.datasetName;
}

/** Listen with the serve section's settings (host, port, limits) on `backend`; `tokens` besides RLSTREAM_SERVE_TOKENS (tests). */
export async function openServeEndpoint(ctx: RunContext, o: { backend: LlmBackend; tokenizer: ChatTokenizer; settings: ServeConfig; tokens?: TokenSpec[]; logger: Logger }): Promise<ServeEndpoint> {
  const files = modelFiles(ctx);
  const contextTokens = files.config.max_position_embeddings;
  const { settings: s, logger } = o;
  const closers: (() => Promise<unknown>)[] = [];
  const closeAll = async () => {
    // Newest first: the server stops taking calls, open trajectories complete, then their producer flushes.
    for (const c of closers.splice(0).reverse()) await c().catch((err: unknown) => logger.warn('serve shutdown step failed', { error: describeError(err) }));
  };
  try {
    const producer = await ctx.log.producer();
    closers.push(() => producer.close());
    const publisher = new EventPublisher(producer, ctx.serde, TOPICS.rolloutEvents, logger.child({ component: 'serve' }));
    const { store, generated } = serveTokens(o.tokens ?? []);
    const rollout = rolloutOptions(ctx, o.tokenizer);
    const service = new ServeService({
      runId: ctx.config.run.id,
      backend: o.backend,
      tokenizer: o.tokenizer,
      publisher,
      rollout,
      limits: {
        maxSessions: s.maxSessions,
        idleTimeoutMs: s.idleTimeoutMs,
        // Each token's fair share of the sessions unless configured; one token may take them all.
        maxSessionsPerToken: s.maxSessionsPerToken ?? Math.ceil(s.maxSessions / Math.max(1, store.size)),
        maxCallsPerToken: s.maxCallsPerToken,
        // The whole trajectory (prompt and response budget) must fit the model's context.
        maxPromptTokens: s.maxPromptTokens ?? Math.max(1, contextTokens - rollout.responseLength),
      },
      dataSource: defaultDataSource(s.dataSource, ctx.plugins.task),
      datasetName: ctx.plugins.task.datasetName,
      offload: new TokenizeOffload({ dir: files.tokenizerDir, chatTemplate: files.chatTemplate }),
      logger: logger.child({ role: 'serve' }),
    });
    closers.push(() => service.close());
    const model = s.model ?? ctx.config.run.id;
    const app = await buildServeServer({ service, tokenizer: o.tokenizer, tokens: store, model, logger, bodyLimitBytes: s.bodyLimitBytes, requestReadTimeoutMs: s.requestReadTimeoutMs });
    closers.push(() => app.close());
    await app.listen({ host: s.host, port: s.port });
    const addr = app.server.address() as AddressInfo;
    const url = `http://${addr.address.includes(':') ? `[${addr.address}]` : addr.address}:${addr.port}`;
    logger.info('serving', { url, model });
    return { url, generatedToken: generated, service, app, close: closeAll };
  } catch (err) {
    await closeAll();
    throw err;
  }
}

/**
 * `<dir>/serve-url`, mode 0600: the base URL and, when one was generated, the token, as the OpenAI SDKs read
 * them from the environment (`set -a; . serve-url` in a shell). The token never goes to the terminal or the log.
 */
export function writeServeUrl(dir: string, endpoint: ServeEndpoint): string {
  const file = `${dir}/serve-url`;
  // Removed first: a file left by an earlier start keeps its mode when rewritten; only a new file gets 0600.
  rmSync(file, { force: true });
  writeFileSync(file, `OPENAI_BASE_URL=${endpoint.url}/v1\n${endpoint.generatedToken ? `OPENAI_API_KEY=${endpoint.generatedToken}\n` : ''}`, { mode: 0o600 });
  return file;
}

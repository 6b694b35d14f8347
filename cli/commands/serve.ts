// `rlstream serve <config>`: the OpenAI-compatible endpoint that records every call as trajectory events in the
// run's log (see docs/serve.md). Runs until SIGTERM / SIGINT; open trajectories then complete as aborted.
import type { Command } from 'commander';
import { readTokenFile } from '../../core/auth/tokens.ts';
import { exitNow } from '../../core/stuck-calls.ts';
import { RlstreamError } from '../../core/errors.ts';
import { jsonLogger } from '../../core/telemetry.ts';
import { startServeJob, TOKENS_VARIABLE } from '../run/serve-job.ts';
import { collectSet } from '../set-option.ts';

function positiveInt(value: string, what: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0 || n > 2 ** 31) throw new RlstreamError('CONFIG_INVALID', `${what} must be a non-negative integer, got ${JSON.stringify(value)}`);
  return n;
}

export function register(program: Command): void {
  program
    .command('serve')
    .description('serve the configured backend as an OpenAI-compatible endpoint that records every call as trajectories')
    .argument('<config>', 'run configuration (YAML), e.g. examples/calculator/config.yaml')
    // Left out, each setting takes the config's serve section (docs/configuration.md).
    .option('--port <n>', 'port to listen on (0: any free port; default: serve.port when not 0, else 8000)')
    .option('--host <address>', 'address to listen on (default: serve.host, 127.0.0.1)')
    .option('--model <id>', 'model id clients name (default: serve.model, else the run id)')
    .option('--train', 'also run the reward, advantage and trainer roles in this process (the embedded log is one process)')
    .option('--max-sessions <n>', 'trajectories open at once (default: serve.max_sessions, 1024)')
    .option('--idle-timeout-ms <n>', 'a trajectory idle this long completes as aborted (default: serve.idle_timeout_ms, 600000)')
    .option('--body-limit-bytes <n>', 'largest request body (default: serve.body_limit_bytes, 4 MiB)')
    .option('--data-source <name>', "data_source recorded when a call names none (the reward consumer scores by it)")
    .option('--token-file <path>', 'tokens clients authenticate with, one a line (mode 0600); also RLSTREAM_SERVE_TOKENS_FILE')
    .option('--set <key=value>', 'override a config field (repeatable)', collectSet, {})
    .action(async (configPath: string, opts: { tokenFile?: string; port?: string; host?: string; model?: string; train?: boolean; maxSessions?: string; idleTimeoutMs?: string; bodyLimitBytes?: string; dataSource?: string; set: Record<string, unknown> }) => {
      const logger = jsonLogger({ fields: { role: 'serve', pid: process.pid } });
      const limits = {
        ...(opts.maxSessions !== undefined ? { maxSessions: Math.max(1, positiveInt(opts.maxSessions, '--max-sessions')) } : {}),
        ...(opts.idleTimeoutMs !== undefined ? { idleTimeoutMs: Math.max(1, positiveInt(opts.idleTimeoutMs, '--idle-timeout-ms')) } : {}),
      };
      const job = await startServeJob({
        configPath,
        overrides: opts.set,
        ...(opts.host !== undefined ? { host: opts.host } : {}),
        ...(opts.port !== undefined ? { port: positiveInt(opts.port, '--port') } : {}),
        ...(opts.model ? { model: opts.model } : {}),
        train: opts.train === true,
        limits,
        ...(opts.bodyLimitBytes !== undefined ? { bodyLimitBytes: Math.max(1024, positiveInt(opts.bodyLimitBytes, '--body-limit-bytes')) } : {}),
        ...(opts.dataSource ? { dataSource: opts.dataSource } : {}),
        ...(opts.tokenFile ? { tokens: readTokenFile(opts.tokenFile) } : {}),
        logger,
      });
      // The generated token goes to the terminal once, never to the log.
      if (job.generatedToken) process.stderr.write(`rlstream serve: no ${TOKENS_VARIABLE} set; clients authenticate with this token (this process only):\n  ${job.generatedToken}\n`);
      process.stderr.write(`rlstream serve: ${job.url}/v1 (OpenAPI at ${job.url}/openapi.json)\n`);
      await new Promise<void>((resolve) => {
        process.once('SIGTERM', resolve);
        process.once('SIGINT', resolve);
      });
      await job.close();
      exitNow(0);
    });
}

// `rlstream run <config>`: the main job on one machine (see cli/run/main-job.ts); prints one JSON line.
import type { Command } from 'commander';
import { parse } from 'yaml';
import { runMainJob } from '../run/main-job.ts';

export function collectSet(value: string, previous: Record<string, unknown>): Record<string, unknown> {
  const eq = value.indexOf('=');
  if (eq <= 0) throw new Error(`--set expects key.path=value, got ${JSON.stringify(value)}`);
  return { ...previous, [value.slice(0, eq)]: parse(value.slice(eq + 1)) as unknown };
}

export function register(program: Command): void {
  program
    .command('run')
    .description('run the main job on the embedded default: SFT warm start, asynchronous GRPO, held-out accuracy before/after')
    .argument('<config>', 'run configuration (YAML), e.g. examples/calculator/config.yaml')
    .option('--set <key=value>', 'override a config field (repeatable), e.g. --set trainer.max_steps=5', collectSet, {})
    .option('--no-admin', 'do not start the admin server')
    .option('--no-progress', 'plain progress lines instead of bars')
    .action(async (configPath: string, opts: { set: Record<string, unknown>; admin: boolean; progress: boolean }) => {
      const summary = await runMainJob({ configPath, overrides: opts.set, admin: opts.admin, progress: opts.progress && process.stderr.isTTY === true });
      console.log(JSON.stringify(summary));
    });
}

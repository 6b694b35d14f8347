// `rlstream config check <file>` and `rlstream config print <file>`: the run config compiled exactly as a run
// compiles it at start-up (with the same --set overrides), its plug-ins resolved and what start-up opens checked
// (cli/run/preflight.ts). check lists every problem, each with its path and fix, and exits 1; print writes the
// effective config, every default filled in, secrets masked.
import type { Command } from 'commander';
import { stringify } from 'yaml';
import { ConfigError, loadRunConfig, maskSecrets, type RunConfig } from '../../core/config.ts';
import { describeError, isRlstreamError } from '../../core/errors.ts';
import { resolvePlugins } from '../run/plugins.ts';
import { pathProblems, startupProblems } from '../run/preflight.ts';
import { collectSet } from '../set-option.ts';

/** Compile the config and resolve its plug-ins (user modules included); the problems, or none. */
export async function checkConfig(path: string, overrides: Record<string, unknown>): Promise<{ config: RunConfig | null; problems: string[] }> {
  let config: RunConfig;
  try {
    config = loadRunConfig(path, overrides);
  } catch (err) {
    if (err instanceof ConfigError) return { config: null, problems: err.issues.map((i) => `${i.path}: ${i.message}`) };
    return { config: null, problems: [isRlstreamError(err) ? err.message : describeError(err)] };
  }
  const problems = pathProblems(config);
  let plugins;
  try {
    plugins = await resolvePlugins(config);
  } catch (err) {
    problems.push(isRlstreamError(err) ? err.message : describeError(err));
  }
  if (plugins) problems.push(...(await startupProblems(config, plugins)));
  return { config, problems };
}

export function register(program: Command): void {
  const config = program.command('config').description('check or print a run configuration');
  config
    .command('check')
    .description('compile a run configuration as a run would; list every problem (exit 1) or print "ok"')
    .argument('<file>', 'run configuration (YAML)')
    .option('--set <key=value>', 'override a config field (repeatable)', collectSet, {})
    .action(async (file: string, opts: { set: Record<string, unknown> }) => {
      const { problems } = await checkConfig(file, opts.set);
      if (problems.length > 0) {
        process.stderr.write(`${file}: ${problems.length} problem(s)\n${problems.map((p) => `  ${p}`).join('\n')}\n`);
        process.exitCode = 1;
        return;
      }
      console.log(`${file}: ok`);
    });
  config
    .command('print')
    .description('print the effective run configuration (defaults filled in, secrets masked)')
    .argument('<file>', 'run configuration (YAML)')
    .option('--set <key=value>', 'override a config field (repeatable)', collectSet, {})
    .action(async (file: string, opts: { set: Record<string, unknown> }) => {
      const { config: compiled, problems } = await checkConfig(file, opts.set);
      if (problems.length > 0 || compiled === null) {
        process.stderr.write(`${file}: ${problems.length} problem(s)\n${problems.map((p) => `  ${p}`).join('\n')}\n`);
        process.exitCode = 1;
        return;
      }
      process.stdout.write(stringify(maskSecrets(compiled.effective)));
    });
}

// `rlstream config check <file>` and `rlstream config print <file>`: the run config compiled exactly as a run
// compiles it at start-up (with the same --set overrides), its plug-ins resolved and what start-up opens checked
// (cli/run/preflight.ts). check lists every problem, each with its path and fix, and exits 1; print writes the
// effective config, every default filled in, secrets masked.
import type { Command } from 'commander';
import { stringify } from 'yaml';
import { maskSecrets } from '../config/run-config.ts';
import { checkConfig, problemsReport } from '../run/preflight.ts';
import { collectSet, nprocOption } from '../set-option.ts';

export function register(program: Command): void {
  const config = program.command('config').description('check or print a run configuration');
  config
    .command('check')
    .description('compile a run configuration as a run would; list every problem (exit 1) or print "ok"')
    .argument('<file>', 'run configuration (YAML)')
    .option('--set <key=value>', 'override a config field (repeatable)', collectSet, {})
    .option('--nproc <n>', 'trainer GPUs (data-parallel ranks), as --set trainer.devices=<n>')
    .action(async (file: string, opts: { set: Record<string, unknown>; nproc?: string }) => {
      const { problems } = await checkConfig(file, nprocOption(opts.nproc, opts.set));
      if (problems.length > 0) {
        process.stderr.write(`${problemsReport(file, problems)}\n`);
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
        process.stderr.write(`${problemsReport(file, problems)}\n`);
        process.exitCode = 1;
        return;
      }
      process.stdout.write(stringify(maskSecrets(compiled.effective)));
    });
}

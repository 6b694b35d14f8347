// `rlstream run <config>`: the main job on one machine (see cli/run/main-job.ts); prints one JSON line. Started
// again after a crash, it resumes the newest unfinished run of the configuration (cli/run/resume.ts).
import type { Command } from 'commander';
import { RlstreamError } from '../../core/errors.ts';
import { runMainJob } from '../run/main-job.ts';
import { collectSet, nprocOption } from '../set-option.ts';
import type { RunChoice } from '../run/resume.ts';

export function register(program: Command): void {
  program
    .command('run')
    .description('run the main job on the embedded default: SFT warm start, asynchronous GRPO, held-out accuracy before/after')
    .argument('<config>', 'run configuration (YAML), e.g. examples/calculator/config.yaml')
    .option('--set <key=value>', 'override a config field (repeatable), e.g. --set trainer.max_steps=5', collectSet, {})
    .option('--nproc <n>', 'trainer GPUs (data-parallel ranks), as --set trainer.devices=<n>')
    .option('--no-admin', 'do not start the admin server')
    .option('--no-progress', 'plain progress lines instead of bars')
    .option('--new', 'start a new run even where an unfinished run of this configuration could be resumed')
    .option('--resume <run dir>', 'resume this unfinished run (default: the newest unfinished run of this configuration, else a new one)')
    .action(async (configPath: string, opts: { set: Record<string, unknown>; nproc?: string; admin: boolean; progress: boolean; new?: boolean; resume?: string }) => {
      if (opts.new && opts.resume !== undefined) throw new RlstreamError('CONFIG_INVALID', '--new and --resume exclude each other: give one');
      const run: RunChoice = opts.new ? { kind: 'new' } : opts.resume !== undefined ? { kind: 'dir', dir: opts.resume } : { kind: 'auto' };
      const summary = await runMainJob({ configPath, overrides: nprocOption(opts.nproc, opts.set), admin: opts.admin, progress: opts.progress && process.stderr.isTTY === true, run });
      console.log(JSON.stringify(summary));
    });
}

// `rlstream advantage`: JSON lines in ({trajectory_id, group_id, reward, response_mask}), the same lines out
// with per-token "advantages" added, computed by the advantage consumer's estimators: all lines one batch, or
// with --config each group as the run's advantage stage computes it. Each bad line is reported on stderr with its
// number, and the exit code is then 1.
import type { Command } from 'commander';
import { advantageBatch, advantageByStage, advantageInput, type AdvantageInput, type AdvantageLine } from '../../consumers/advantage/offline.ts';
import { estimatorNames, getEstimator, type EstimatorOptions } from '../../consumers/advantage/estimators.ts';
import { loadRunConfig } from '../config/run-config.ts';
import { RlstreamError } from '../../core/errors.ts';
import { BadLines, readJsonl } from '../../core/jsonl.ts';
import { numberOption } from '../options.ts';
import { runAdvantageStage } from '../run/plugins.ts';

interface Opts {
  estimator?: string;
  config?: string;
  gamma?: number;
  lambda?: number;
  epsilon?: number;
}

export function register(program: Command): void {
  program
    .command('advantage')
    .description('advantages for JSON lines from stdin ({trajectory_id, group_id, reward, response_mask}); all lines are one batch, or with --config each group as the run computes it')
    .option('--estimator <name>', `estimator: ${estimatorNames().join(', ')} (with --config: the config's advantage.estimator unless given)`)
    .option('--config <file>', "a run's config: its advantage stage (estimator, its advantage.<estimator> options, dynamic sampling), each group on its own as its consumer computes it; a flag given overrides its key")
    .option('--gamma <x>', 'discount (gae, reinforce_plus_plus); default 1', numberOption('--gamma'))
    .option('--lambda <x>', 'GAE lambda; default 1', numberOption('--lambda'))
    .option('--epsilon <x>', 'added to the group std (grpo); default 1e-6', numberOption('--epsilon'))
    .action(async (opts: Opts) => {
      if (opts.estimator === undefined && opts.config === undefined) throw new RlstreamError('CONFIG_INVALID', 'advantage needs --estimator <name> or --config <run config> (its advantage stage)');
      if (opts.estimator !== undefined) getEstimator(opts.estimator);
      const given: Partial<EstimatorOptions> = { ...(opts.gamma !== undefined ? { gamma: opts.gamma } : {}), ...(opts.lambda !== undefined ? { lam: opts.lambda } : {}), ...(opts.epsilon !== undefined ? { epsilon: opts.epsilon } : {}) };
      const bad = new BadLines('advantage');
      const inputs: AdvantageInput[] = [];
      for await (const item of readJsonl(process.stdin)) {
        bad.seen(item.line);
        const input = item.error ?? advantageInput(item.value);
        if (typeof input === 'string') bad.report(item.line, input);
        else inputs.push({ line: item.line, ...input });
      }
      let lines: AdvantageLine[];
      if (opts.config !== undefined) {
        const run = runAdvantageStage(loadRunConfig(opts.config).advantage, opts.estimator);
        lines = advantageByStage(inputs, { ...run, options: { ...run.options, ...given } });
      } else lines = advantageBatch(inputs, opts.estimator!, given);
      let filtered = 0;
      for (const r of lines) {
        if ('error' in r) bad.report(r.line, r.error);
        else if ('filtered' in r) {
          // Not a bad line: the run would not train on it either. Said once per line, on stderr.
          filtered++;
          process.stderr.write(`rlstream advantage: line ${r.line}: ${r.filtered}\n`);
        } else process.stdout.write(r.out + '\n');
      }
      if (filtered > 0) process.stderr.write(`rlstream advantage: ${filtered} line(s) left out by dynamic sampling\n`);
      bad.finish();
    });
}

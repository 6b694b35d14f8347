// `rlstream advantage`: JSON lines in ({trajectory_id, group_id, reward, response_mask}, all one batch), the
// same lines out with per-token "advantages" added, computed by the advantage consumer's estimators. The good
// lines are the batch; each bad one is reported on stderr with its number, and the exit code is then 1.
import type { Command } from 'commander';
import { advantageBatch, advantageInput, type AdvantageInput } from '../../consumers/advantage/offline.ts';
import { estimatorNames, getEstimator } from '../../consumers/advantage/estimators.ts';
import { BadLines, readJsonl } from '../../core/jsonl.ts';
import { numberOption } from '../options.ts';

export function register(program: Command): void {
  program
    .command('advantage')
    .description('advantages for JSON lines from stdin ({trajectory_id, group_id, reward, response_mask}); all lines are one batch')
    .requiredOption('--estimator <name>', `estimator: ${estimatorNames().join(', ')}`)
    .option('--gamma <x>', 'discount (gae, reinforce_plus_plus)', numberOption('--gamma'), 1)
    .option('--lambda <x>', 'GAE lambda', numberOption('--lambda'), 1)
    .option('--epsilon <x>', 'added to the group std (grpo)', numberOption('--epsilon'), 1e-6)
    .action(async (opts: { estimator: string; gamma: number; lambda: number; epsilon: number }) => {
      getEstimator(opts.estimator);
      const bad = new BadLines('advantage');
      const inputs: AdvantageInput[] = [];
      for await (const item of readJsonl(process.stdin)) {
        bad.seen(item.line);
        const input = item.error ?? advantageInput(item.value);
        if (typeof input === 'string') bad.report(item.line, input);
        else inputs.push({ line: item.line, ...input });
      }
      for (const r of advantageBatch(inputs, opts.estimator, { gamma: opts.gamma, lam: opts.lambda, epsilon: opts.epsilon })) {
        if ('error' in r) bad.report(r.line, r.error);
        else process.stdout.write(r.out + '\n');
      }
      bad.finish();
    });
}

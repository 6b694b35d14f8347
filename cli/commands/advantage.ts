// `rlstream advantage`: JSON lines in ({trajectory_id, group_id, reward, response_mask}, all one batch), the
// same lines out with per-token "advantages" added, computed by the advantage consumer's estimators.
import type { Command } from 'commander';
import { text } from 'node:stream/consumers';
import { advantageLines } from '../../consumers/advantage/offline.ts';
import { estimatorNames } from '../../consumers/advantage/estimators.ts';
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
      const out = advantageLines(await text(process.stdin), opts.estimator, { gamma: opts.gamma, lam: opts.lambda, epsilon: opts.epsilon });
      if (out.length > 0) process.stdout.write(out.join('\n') + '\n');
    });
}

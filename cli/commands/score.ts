// `rlstream score`: JSON lines in (solution_str, ground_truth), the same lines out with "score" added, using
// the reward consumer's functions (gsm8k with verl's semantics, math_numeric, anything registered).
import type { Command } from 'commander';
import { text } from 'node:stream/consumers';
import { scoreLines } from '../../consumers/reward/offline.ts';
import { RlstreamError } from '../../core/errors.ts';
import { numberOption } from '../options.ts';


export function register(program: Command): void {
  program
    .command('score')
    .description('score JSON lines from stdin ({solution_str, ground_truth}); prints each line with "score" added')
    .requiredOption('--reward <name>', 'reward function (gsm8k, math_numeric, or a registered data_source)')
    .option('--method <method>', 'gsm8k answer extraction: strict or flexible', 'strict')
    .option('--format-score <x>', 'score of a well-formed but wrong answer', numberOption('--format-score'), 0)
    .option('--score <y>', 'score of a correct answer', numberOption('--score'), 1)
    .action(async (opts: { reward: string; method: string; formatScore: number; score: number }) => {
      if (opts.method !== 'strict' && opts.method !== 'flexible') throw new RlstreamError('CONFIG_INVALID', `--method must be strict or flexible, got "${opts.method}"`);
      const out = await scoreLines(await text(process.stdin), { reward: opts.reward, method: opts.method, formatScore: opts.formatScore, score: opts.score });
      if (out.length > 0) process.stdout.write(out.join('\n') + '\n');
    });
}

// `rlstream score`: JSON lines in (solution_str, ground_truth), the same lines out with "score" added, using
// the reward consumer's functions (gsm8k with verl's semantics, math_numeric, anything registered). A bad
// line is reported on stderr with its number and the others are scored; the exit code is 1 if any was bad.
import type { Command } from 'commander';
import { offlineRewardFn, scoreInput, scoreRow } from '../../consumers/reward/offline.ts';
import { describeError, RlstreamError } from '../../core/errors.ts';
import { BadLines, readJsonl } from '../../core/jsonl.ts';
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
      const options = { reward: opts.reward, method: opts.method, formatScore: opts.formatScore, score: opts.score } as const;
      const fn = offlineRewardFn(options);
      const bad = new BadLines('score');
      for await (const item of readJsonl(process.stdin)) {
        bad.seen(item.line);
        const input = item.error ?? scoreInput(item.value);
        if (typeof input === 'string') {
          bad.report(item.line, input);
          continue;
        }
        try {
          process.stdout.write((await scoreRow(fn, options, input)) + '\n');
        } catch (err) {
          bad.report(item.line, describeError(err));
        }
      }
      bad.finish();
    });
}

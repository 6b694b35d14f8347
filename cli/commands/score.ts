// `rlstream score`: JSON lines in (solution_str, ground_truth), the same lines out with "score" added, using
// the reward stage the run's consumer uses (gsm8k with verl's semantics, math_numeric, anything registered, or
// with --config the run's own reward). A bad line is reported on stderr with its number and the others are
// scored; the exit code is 1 if any was bad.
import type { Command } from 'commander';
import { parameterizedReward, scoreInput, scoreRow } from '../../consumers/reward/offline.ts';
import { describeError, RlstreamError } from '../../core/errors.ts';
import { BadLines, readJsonl } from '../../core/jsonl.ts';
import { numberOption } from '../options.ts';
import { rewardStageFor } from '../reward-stage.ts';

export function register(program: Command): void {
  program
    .command('score')
    .description('score JSON lines from stdin ({solution_str, ground_truth, data_source?, extra_info?, external_reward?: an outside reward taken as the score}); prints each line with "score" added')
    .option('--reward <name>', "reward function: gsm8k, math_numeric, a registered data_source, module.ts#export, or run (the config's own; the default with --config)")
    .option('--config <file>', "a run's config: its reward (reward.name / reward.module, else its task's function for each row's data_source), and its task's functions may be named in --reward")
    .option('--method <method>', 'gsm8k answer extraction: strict or flexible', 'strict')
    .option('--format-score <x>', 'score of a well-formed but wrong answer (gsm8k, math_numeric)', numberOption('--format-score'), 0)
    .option('--score <y>', 'score of a correct answer (gsm8k, math_numeric)', numberOption('--score'), 1)
    .action(async (opts: { reward?: string; config?: string; method: string; formatScore: number; score: number }) => {
      if (opts.method !== 'strict' && opts.method !== 'flexible') throw new RlstreamError('CONFIG_INVALID', `--method must be strict or flexible, got "${opts.method}"`);
      if (opts.reward === undefined && opts.config === undefined) throw new RlstreamError('CONFIG_INVALID', 'score needs --reward <name> or --config <run config> (its reward)');
      const method = opts.method;
      const stage = await rewardStageFor(opts.reward, opts.config, (name) => parameterizedReward(name, { method, formatScore: opts.formatScore, score: opts.score }));
      const bad = new BadLines('score');
      for await (const item of readJsonl(process.stdin)) {
        bad.seen(item.line);
        const input = item.error ?? scoreInput(item.value, item.line, stage);
        if (typeof input === 'string') {
          bad.report(item.line, input);
          continue;
        }
        try {
          process.stdout.write((await scoreRow(stage, input)) + '\n');
        } catch (err) {
          bad.report(item.line, describeError(err));
        }
      }
      bad.finish();
    });
}

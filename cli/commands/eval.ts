// `rlstream eval <config> --weights <file>`: held-out accuracy of a checkpoint on the task, greedy, with the
// same tool agent, tokenizer and backend as the main job (events go to a throw-away embedded log).
import type { Command } from 'commander';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { loadRunConfig } from '../config/run-config.ts';
import { RlstreamError } from '../../core/errors.ts';
import { jsonLogger } from '../../core/telemetry.ts';
import { openRunContext } from '../run/context.ts';
import { accuracyOf, heldoutSet, outcomeOf, score, solvedRule } from '../run/evaluation.ts';
import { createBackend, createWorker, loadTokenizer, modelFiles } from '../run/roles.ts';
import { collectSet } from '../set-option.ts';
import { numberOption } from '../options.ts';

export function register(program: Command): void {
  program
    .command('eval')
    .description('held-out accuracy of a checkpoint on the calculator task (greedy, tool agent)')
    .argument('<config>', 'run configuration (YAML)')
    .option('--weights <file>', 'safetensors weights or a checkpoint directory, relative to the working directory (default: model.init of the config)')
    .option('--difficulty <name>', "calculator task: easy | medium | hard (default: the config's task.heldout, what the main job measures)")
    .option('--problems <n>', "held-out problems (default: the config's task.heldout_problems)", numberOption('--problems', { integer: true, min: 1 }))
    .option('--failures <n>', 'also print up to n failed problems with the response', numberOption('--failures', { integer: true, min: 0 }), 0)
    .option('--set <key=value>', 'override a config field (repeatable)', collectSet, {})
    .action(async (configPath: string, opts: { weights?: string; difficulty?: string; problems?: number; failures: number; set: Record<string, unknown> }) => {
      // The same held-out set as the main job unless asked otherwise; --weights is a path the user typed, so it
      // is relative to where they typed it (model.init in the config is relative to the config's folder).
      const overrides: Record<string, unknown> = { ...opts.set };
      if (opts.difficulty !== undefined) overrides['task.heldout'] = opts.difficulty;
      if (opts.weights !== undefined) {
        const weights = resolve(opts.weights);
        if (!existsSync(weights)) throw new RlstreamError('CONFIG_INVALID', `--weights ${opts.weights} does not exist (looked for ${weights})`);
        overrides['model.init'] = weights;
      }
      const dir = mkdtempSync(join(tmpdir(), 'rlstream-eval-'));
      const config = loadRunConfig(configPath, { ...overrides, 'log.kind': 'embedded', 'log.dir': join(dir, 'log') });
      const ctx = await openRunContext(config, jsonLogger({ level: 'warn' }));
      const backend = await createBackend(ctx);
      try {
        const worker = await createWorker(ctx, 'eval', backend, loadTokenizer(modelFiles(ctx)), { followPolicy: false });
        const set = await heldoutSet(ctx, opts.problems);
        const difficulty = config.task.options['heldout'] ?? null;
        const t0 = performance.now();
        const trajectories = await worker.evaluate(set.rows);
        await worker.stop();
        const toolCalls = trajectories.reduce((n, t) => n + t.num_tool_calls, 0);
        const threshold = config.eval.successThreshold;
        const { scored, outcomes } = await score(ctx.plugins, threshold, trajectories);
        const failed = trajectories.filter((_, i) => !outcomes[i]!.solved).slice(0, opts.failures);
        for (const t of failed) {
          const extra = JSON.parse(t.extra_info_json) as { expression?: string };
          const { reward } = await outcomeOf(ctx.plugins, threshold, t);
          console.log(JSON.stringify({ expected_expression: extra.expression, ground_truth: t.ground_truth, reward, response: t.response_text }));
        }
        // accuracy is the share solved; mean_reward (partial credit included) is reported beside it, by its own name.
        console.log(JSON.stringify({
          accuracy: accuracyOf(scored),
          solved: scored.solved,
          problems: scored.n,
          problem_set: set.name,
          solved_rule: solvedRule(ctx.plugins, threshold),
          mean_reward: scored.mean_reward,
          per_difficulty: scored.per_difficulty,
          difficulty,
          tool_calls_per_problem: toolCalls / Math.max(1, scored.n),
          seconds: (performance.now() - t0) / 1000,
          example: trajectories[0]?.response_text,
        }));
      } finally {
        await backend.close();
        await ctx.close();
        rmSync(dir, { recursive: true, force: true });
      }
    });
}

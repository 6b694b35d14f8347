// `rlstream sft <config>`: supervised warm-up on the task's demonstrations (cross-entropy on assistant
// tokens only); writes the weights the config's model.init names (or --out).
import type { Command } from 'commander';
import { loadRunConfig } from '../../core/config.ts';
import { jsonLogger } from '../../core/telemetry.ts';
import { openRunContext } from '../run/context.ts';
import { modelFiles } from '../run/roles.ts';
import { warmStart } from '../run/sft.ts';
import { collectSet } from './run.ts';

export function register(program: Command): void {
  program
    .command('sft')
    .description('supervised warm-up on demonstrations; regenerates the checkpoint directory model.init names')
    .argument('<config>', 'run configuration (YAML)')
    .option('--out <dir>', 'checkpoint directory to write (default: model.init of the config)')
    .option('--from <weights>', 'continue from these weights (safetensors) instead of random initialisation')
    .option('--set <key=value>', 'override a config field (repeatable)', collectSet, {})
    .action(async (configPath: string, opts: { out?: string; from?: string; set: Record<string, unknown> }) => {
      const config = loadRunConfig(configPath, { ...opts.set, 'log.kind': 'embedded', 'log.dir': `${process.env['TMPDIR'] ?? '/tmp'}/rlstream-sft-${process.pid}` });
      const ctx = await openRunContext(config, jsonLogger({ level: 'warn' }));
      try {
        const out = opts.out ?? modelFiles(ctx).initCheckpoint ?? modelFiles(ctx).initWeights;
        const res = await warmStart(ctx, out, (info, total) => {
          if (info.step % 10 === 0 || info.step === total) process.stderr.write(`sft step ${info.step}/${total} loss ${info.loss.toFixed(4)} lr ${info.lr.toExponential(2)}\n`);
        }, opts.from);
        const last = res.history[res.history.length - 1];
        console.log(JSON.stringify({ out, steps: res.history.length, final_loss: last?.loss ?? null, seconds: res.seconds }));
      } finally {
        await ctx.close();
      }
    });
}

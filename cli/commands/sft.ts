// `rlstream sft <config>`: supervised warm-up on the task's demonstrations (cross-entropy on assistant
// tokens only); writes a checkpoint under the run's data directory (or --out), never over the config's
// model.init: that may be the checkpoint shipped in the repository, and a run writes nothing there.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import type { Command } from 'commander';
import { loadRunConfig } from '../config/run-config.ts';
import { jsonLogger } from '../../core/telemetry.ts';
import { openRunContext } from '../run/context.ts';
import { warmStart } from '../run/sft.ts';
import { collectSet } from '../set-option.ts';

export function register(program: Command): void {
  program
    .command('sft')
    .description('supervised warm-up on demonstrations; writes a checkpoint directory under run.data_dir (or --out)')
    .argument('<config>', 'run configuration (YAML)')
    .option('--out <dir>', 'checkpoint directory to write, relative to the working directory (default: <run.data_dir>/sft-<seed>-<time>); --out examples/calculator/checkpoints/sft regenerates the shipped one')
    .option('--from <weights>', 'begin from these weights (safetensors) instead of model.base or random initialisation')
    .option('--set <key=value>', 'override a config field (repeatable)', collectSet, {})
    .action(async (configPath: string, opts: { out?: string; from?: string; set: Record<string, unknown> }) => {
      // SFT publishes nothing, but the run context opens a log: a throw-away one.
      const logDir = mkdtempSync(join(tmpdir(), 'rlstream-sft-'));
      const config = loadRunConfig(configPath, { ...opts.set, 'log.kind': 'embedded', 'log.dir': logDir });
      const ctx = await openRunContext(config, jsonLogger({ level: 'warn' }));
      try {
        const stamp = new Date().toISOString().replace(/[-:.TZ]/g, '').slice(0, 14);
        const out = opts.out !== undefined ? resolve(opts.out) : join(config.run.dataDir, `sft-${config.run.seed}-${stamp}`);
        process.stderr.write(`sft: writing ${out}\n`);
        const res = await warmStart(ctx, out, (info, total) => {
          if (info.step % 10 === 0 || info.step === total) process.stderr.write(`sft step ${info.step}/${total} loss ${info.loss.toFixed(4)} lr ${info.lr.toExponential(2)}\n`);
        }, opts.from);
        const last = res.history[res.history.length - 1];
        console.log(JSON.stringify({ out, steps: res.history.length, final_loss: last?.loss ?? null, seconds: res.seconds }));
        process.stderr.write(`sft: start a run from it with --set model.init=${out}\n`);
      } finally {
        await ctx.close();
        rmSync(logDir, { recursive: true, force: true });
      }
    });
}

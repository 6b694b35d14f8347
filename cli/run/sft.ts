// SFT warm-up of the main job: the task's demonstrations (its sftExamples hook), stage after stage of the
// compiled `sft` section, cross-entropy on the assistant tokens only, saved as the version-0 weights the RL
// run starts from.
import { mkdirSync, renameSync, rmSync } from 'node:fs';
import { dirname } from 'node:path';
import { RlstreamError } from '../../core/errors.ts';
import { checkDeviceRunsHere } from '../../consumers/trainer/device.ts';
import { runSft, type SftStepInfo } from '../../consumers/trainer/sft.ts';
import { Model } from '../../native/model.ts';
import type { RunContext } from './context.ts';
import { initFiles, loadTokenizer, modelFiles } from './roles.ts';

/**
 * Train on demonstrations (from `from`, else model.base, else random weights) and write a checkpoint directory `out`
 * (model.safetensors, optimizer state, config.json), atomically.
 */
export async function warmStart(ctx: RunContext, out: string, onStep?: (info: SftStepInfo, total: number) => void, from?: string): Promise<{ history: SftStepInfo[]; seconds: number }> {
  const t0 = performance.now();
  const files = modelFiles(ctx);
  const stages = ctx.config.sft.stages;
  const task = ctx.plugins.task;
  if (!task.sftExamples) throw new RlstreamError('CONFIG_INVALID', `model.init: ${out} does not exist and task ${ctx.config.task.name} has no SFT demonstrations to train it; point model.init at existing weights`);
  const total = stages.reduce((n, st) => n + st.steps, 0);
  const tok = loadTokenizer(files);
  // The warm start trains where the RL steps will (trainer.device): on a GPU machine SFT is most of a run's compute.
  const device = ctx.config.trainer.device;
  checkDeviceRunsHere(device);
  const base = from ?? (ctx.config.model.base === null ? undefined : initFiles(ctx.config.model.base).initWeights);
  const model = base ? Model.load(base, files.config, { device }) : Model.init(files.config, { seed: stages[0]!.seed, device });
  try {
    const history: SftStepInfo[] = [];
    for (const o of stages) {
      const examples = await task.sftExamples(tok, { problems: o.problems, seed: o.seed, options: o.options });
      const done = history.length;
      const h = await runSft(model, examples, o, (info) => onStep?.({ ...info, step: done + info.step }, total));
      history.push(...h.map((info) => ({ ...info, step: done + info.step })));
    }
    mkdirSync(dirname(out), { recursive: true });
    const tmp = `${out}.tmp-${process.pid}`;
    rmSync(tmp, { recursive: true, force: true });
    await model.saveCheckpoint(tmp, { optimizerDtype: 'BF16' });
    rmSync(out, { recursive: true, force: true });
    renameSync(tmp, out);
    return { history, seconds: (performance.now() - t0) / 1000 };
  } finally {
    model.dispose();
  }
}

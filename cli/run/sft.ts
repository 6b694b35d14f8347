// SFT warm-up of the main job: demonstrations of the calculator task on easy problems, cross-entropy on the
// assistant tokens only, saved as the version-0 weights the RL run starts from.
import { mkdirSync, renameSync, rmSync } from 'node:fs';
import { dirname } from 'node:path';
import { RlstreamError } from '../../core/errors.ts';
import { rng } from '../../core/random.ts';
import { runSft, type SftOptions, type SftStepInfo } from '../../consumers/trainer/sft.ts';
import { Model } from '../../native/index.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import { demonstrationExample } from '../../examples/calculator/demos.ts';
import { difficultyByName } from '../../examples/calculator/index.ts';
import { problems, take } from '../../examples/calculator/task.ts';
import type { RunContext } from './context.ts';
import { modelFiles, section } from './roles.ts';

export interface SftSection extends SftOptions {
  problems: number;
  difficulty: string;
  /** Fraction of demonstrations that answer without the tool (see examples/calculator/conversation.ts). */
  directFraction: number;
}

function num(s: Record<string, unknown>, k: string, dflt: number, integer = false): number {
  const v = s[k] ?? dflt;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0 || (integer && !Number.isInteger(v))) throw new RlstreamError('CONFIG_INVALID', `sft.${k} must be a ${integer ? 'non-negative integer' : 'non-negative number'}`);
  return v;
}

export function sftSection(ctx: RunContext): SftSection {
  const s = section(ctx, 'sft');
  const difficulty = typeof s['difficulty'] === 'string' ? s['difficulty'] : 'easy';
  difficultyByName(difficulty, 'sft.difficulty');
  return {
    problems: num(s, 'problems', 3000, true),
    difficulty,
    directFraction: num(s, 'direct_fraction', 0),
    steps: num(s, 'steps', 300, true),
    batchTokens: num(s, 'batch_tokens', 6144, true),
    microBatchTokens: num(s, 'micro_batch_tokens', 3072, true),
    learningRate: num(s, 'learning_rate', 3e-3),
    warmupSteps: num(s, 'warmup_steps', 20, true),
    weightDecay: num(s, 'weight_decay', 0),
    gradClip: num(s, 'grad_clip', 1),
    seed: num(s, 'seed', ctx.config.run.seed, true),
  };
}

/**
 * Train on demonstrations (from random weights, or from `from`) and write a checkpoint directory `out`
 * (model.safetensors, optimizer state, config.json), atomically.
 */
export async function warmStart(ctx: RunContext, out: string, onStep?: (info: SftStepInfo, total: number) => void, from?: string): Promise<{ history: SftStepInfo[]; seconds: number }> {
  const t0 = performance.now();
  const files = modelFiles(ctx);
  const o = sftSection(ctx);
  const tok = ChatTokenizer.load(files.tokenizerDir);
  if (o.directFraction > 1) throw new RlstreamError('CONFIG_INVALID', 'sft.direct_fraction must be between 0 and 1');
  const pick = rng(o.seed + 2000);
  const examples = take(problems(o.seed + 1000, 'train', difficultyByName(o.difficulty, 'sft.difficulty')), o.problems).map((p) => demonstrationExample(tok, p, pick() < o.directFraction));
  const model = from ? Model.load(from, files.config) : Model.init(files.config, { seed: o.seed });
  try {
    const history = await runSft(model, examples, o, (info) => onStep?.(info, o.steps));
    mkdirSync(dirname(out), { recursive: true });
    const tmp = `${out}.tmp-${process.pid}`;
    rmSync(tmp, { recursive: true, force: true });
    await model.saveCheckpoint(tmp);
    rmSync(out, { recursive: true, force: true });
    renameSync(tmp, out);
    return { history, seconds: (performance.now() - t0) / 1000 };
  } finally {
    model.dispose();
  }
}

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

function num(s: Record<string, unknown>, k: string, dflt: number, path: string, integer = false): number {
  const v = s[k] ?? dflt;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0 || (integer && !Number.isInteger(v))) throw new RlstreamError('CONFIG_INVALID', `${path}.${k} must be a ${integer ? 'non-negative integer' : 'non-negative number'}`);
  return v;
}

const STAGE_KEYS = ['problems', 'difficulty', 'direct_fraction', 'steps', 'batch_tokens', 'micro_batch_tokens', 'learning_rate', 'warmup_steps', 'weight_decay', 'grad_clip', 'seed'];

function compileStage(s: Record<string, unknown>, path: string, seed: number): SftSection {
  for (const k of Object.keys(s)) if (!STAGE_KEYS.includes(k) && k !== 'stages') throw new RlstreamError('CONFIG_INVALID', `${path}.${k} is not an SFT option (known: ${STAGE_KEYS.join(', ')}, stages)`);
  const difficulty = typeof s['difficulty'] === 'string' ? s['difficulty'] : 'easy';
  difficultyByName(difficulty, `${path}.difficulty`);
  const directFraction = num(s, 'direct_fraction', 0, path);
  if (directFraction > 1) throw new RlstreamError('CONFIG_INVALID', `${path}.direct_fraction must be between 0 and 1`);
  return {
    problems: num(s, 'problems', 3000, path, true),
    difficulty,
    directFraction,
    steps: num(s, 'steps', 300, path, true),
    batchTokens: num(s, 'batch_tokens', 2048, path, true),
    microBatchTokens: num(s, 'micro_batch_tokens', 2048, path, true),
    learningRate: num(s, 'learning_rate', 2e-3, path),
    warmupSteps: num(s, 'warmup_steps', 20, path, true),
    weightDecay: num(s, 'weight_decay', 0, path),
    gradClip: num(s, 'grad_clip', 1, path),
    seed: num(s, 'seed', seed, path, true),
  };
}

/**
 * The `sft` section as a list of stages run one after the other on the same model and optimizer: the section's
 * own fields, or `stages:` whose entries override them.
 */
export function sftStages(ctx: RunContext): SftSection[] {
  const s = section(ctx, 'sft');
  const stages = s['stages'];
  const { stages: _stages, ...base } = s;
  if (stages === undefined) return [compileStage(base, 'sft', ctx.config.run.seed)];
  if (!Array.isArray(stages) || stages.length === 0) throw new RlstreamError('CONFIG_INVALID', 'sft.stages must be a non-empty list');
  return stages.map((st, i) => {
    if (st === null || typeof st !== 'object' || Array.isArray(st)) throw new RlstreamError('CONFIG_INVALID', `sft.stages[${i}] must be a mapping`);
    return compileStage({ ...base, ...(st as Record<string, unknown>) }, `sft.stages[${i}]`, ctx.config.run.seed + i);
  });
}

/**
 * Train on demonstrations (from random weights, or from `from`) and write a checkpoint directory `out`
 * (model.safetensors, optimizer state, config.json), atomically.
 */
export async function warmStart(ctx: RunContext, out: string, onStep?: (info: SftStepInfo, total: number) => void, from?: string): Promise<{ history: SftStepInfo[]; seconds: number }> {
  const t0 = performance.now();
  const files = modelFiles(ctx);
  const stages = sftStages(ctx);
  const total = stages.reduce((n, st) => n + st.steps, 0);
  const tok = ChatTokenizer.load(files.tokenizerDir);
  const model = from ? Model.load(from, files.config) : Model.init(files.config, { seed: stages[0]!.seed });
  try {
    const history: SftStepInfo[] = [];
    for (const o of stages) {
      const pick = rng(o.seed + 2000);
      const examples = take(problems(o.seed + 1000, 'train', difficultyByName(o.difficulty, 'sft.difficulty')), o.problems).map((p) => demonstrationExample(tok, p, pick() < o.directFraction));
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

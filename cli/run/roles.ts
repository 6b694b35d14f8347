// Each role of rlstream built from the run config and a RunContext, so the main job (all roles in one
// process) and `rlstream worker <role>` (one role per process) assemble roles exactly the same way.
import { readFileSync } from 'node:fs';
import { isAbsolute, join, resolve } from 'node:path';
import { RlstreamError } from '../../core/errors.ts';
import type { StreamProcessor } from '../../core/processor.ts';
import type { TraceStore } from '../../core/traces/store.ts';
import { createAdvantageProcessor } from '../../consumers/advantage/consumer.ts';
import { createRewardProcessor } from '../../consumers/reward/consumer.ts';
import { TraceSink } from '../../consumers/traces/sink.ts';
import { compileTrainerOptions, type TrainerOptions } from '../../consumers/trainer/options.ts';
import { Trainer, type TrainerDeps } from '../../consumers/trainer/trainer.ts';
import { parseModelConfig, type ModelConfig } from '../../native/index.ts';
import { BuiltinPolicyBackend } from '../../producers/policy/backend.ts';
import type { LlmBackend } from '../../producers/backends/types.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import { RolloutWorker } from '../../producers/worker.ts';
import type { RolloutOptions } from '../../producers/options.ts';
import { loadToolConfig } from '../../producers/tools/config.ts';
import type { ToolSet } from '../../producers/tools/tool-set.ts';
import { calculatorTools, registerCalculatorReward } from '../../examples/calculator/index.ts';
import type { RunContext } from './context.ts';

type Section = Record<string, unknown>;

export function section(ctx: RunContext, name: string): Section {
  const s = ctx.config.sections[name];
  if (s === undefined || s === null) return {};
  if (typeof s !== 'object' || Array.isArray(s)) throw new RlstreamError('CONFIG_INVALID', `${name} must be a mapping`);
  return s as Section;
}

function path(ctx: RunContext, p: string): string {
  return isAbsolute(p) ? p : resolve(ctx.config.baseDir, p);
}

export interface ModelFiles {
  config: ModelConfig;
  configJson: string;
  tokenizerDir: string;
  /** Weights of version 0 (the warm start). */
  initWeights: string;
  /** The warm start as a checkpoint directory (weights + AdamW state, as `rlstream sft` writes), or null. */
  initCheckpoint: string | null;
}

/** `model.init` names a checkpoint directory (model.safetensors + optimizer state) or a safetensors file. */
export function initFiles(init: string): { initWeights: string; initCheckpoint: string | null } {
  const isFile = init.endsWith('.safetensors');
  return isFile ? { initWeights: init, initCheckpoint: null } : { initWeights: join(init, 'model.safetensors'), initCheckpoint: init };
}

export function modelFiles(ctx: RunContext): ModelFiles {
  const m = section(ctx, 'model');
  for (const k of ['config', 'tokenizer', 'init']) if (typeof m[k] !== 'string') throw new RlstreamError('CONFIG_INVALID', `model.${k} must be a path`);
  const configPath = path(ctx, m['config'] as string);
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(configPath, 'utf8'));
  } catch (err) {
    throw new RlstreamError('CONFIG_INVALID', `model.config ${configPath} cannot be read: ${(err as Error).message}`);
  }
  const config = parseModelConfig(raw);
  return { config, configJson: JSON.stringify(raw), tokenizerDir: path(ctx, m['tokenizer'] as string), ...initFiles(path(ctx, m['init'] as string)) };
}

/** The task's hooks: today the built-in calculator task is the one registered by name. */
export function setUpTask(ctx: RunContext): void {
  const task = section(ctx, 'task');
  const name = task['name'] ?? 'calculator';
  if (name !== 'calculator') throw new RlstreamError('CONFIG_INVALID', `task.name must be "calculator" (got ${JSON.stringify(name)})`);
  registerCalculatorReward();
}

export function trainerOptions(ctx: RunContext): TrainerOptions {
  return compileTrainerOptions(ctx.config.sections['trainer']);
}

export async function createReward(ctx: RunContext): Promise<StreamProcessor> {
  setUpTask(ctx);
  const r = section(ctx, 'reward');
  const shaping = (r['shaping'] ?? {}) as Section;
  return createRewardProcessor({
    log: ctx.log,
    serde: ctx.serde,
    id: `${ctx.config.run.id}.reward`,
    shaping: shaping as never,
    ...(typeof r['module'] === 'string' ? { module: { path: r['module'], ...(typeof r['export'] === 'string' ? { export: r['export'] } : {}), baseDir: ctx.config.baseDir } } : {}),
    logger: ctx.logger.child({ role: 'reward' }),
  });
}

export function createAdvantage(ctx: RunContext): StreamProcessor {
  const a = section(ctx, 'advantage');
  return createAdvantageProcessor({
    log: ctx.log,
    serde: ctx.serde,
    id: `${ctx.config.run.id}.advantage`,
    estimator: typeof a['estimator'] === 'string' ? a['estimator'] : 'grpo',
    ...(typeof a['group_timeout_ms'] === 'number' ? { groupTimeoutMs: a['group_timeout_ms'] } : {}),
    ...(a['partial_groups'] === 'drop' || a['partial_groups'] === 'emit' ? { partialGroups: a['partial_groups'] } : {}),
    ...(typeof a['dynamic_sampling'] === 'boolean' ? { dynamicSampling: a['dynamic_sampling'] } : {}),
    logger: ctx.logger.child({ role: 'advantage' }),
  });
}

export function createTraceSink(ctx: RunContext, store: TraceStore): TraceSink {
  const t = ctx.config.traces;
  const batch = t.kind === 'none' ? {} : t.batch;
  return new TraceSink({ log: ctx.log, serde: ctx.serde, store, groupId: `${ctx.config.run.id}.traces`, logger: ctx.logger.child({ role: 'traces' }), ...batch });
}

export function createTrainer(ctx: RunContext, runId: string, dataDir: string, onStep?: TrainerDeps['onStep'], extraMetrics?: TrainerDeps['extraMetrics']): Trainer {
  const files = modelFiles(ctx);
  return new Trainer({
    log: ctx.log,
    serde: ctx.serde,
    runId,
    dataDir,
    initialWeightsPath: files.initWeights,
    initialCheckpoint: files.initCheckpoint,
    modelConfig: files.config,
    options: trainerOptions(ctx),
    logger: ctx.logger,
    ...(onStep ? { onStep } : {}),
    ...(extraMetrics ? { extraMetrics } : {}),
  });
}

export async function createBackend(ctx: RunContext): Promise<LlmBackend> {
  const files = modelFiles(ctx);
  const p = section(ctx, 'policy');
  const count = (key: string, fallback: number): number => {
    const v = p[key] ?? fallback;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 1) throw new RlstreamError('CONFIG_INVALID', `policy.${key} must be a positive integer, got ${JSON.stringify(v)}`);
    return v;
  };
  const swap = p['swap_mode'] ?? 'next_turn';
  if (swap !== 'finish' && swap !== 'next_turn') throw new RlstreamError('CONFIG_INVALID', `policy.swap_mode must be 'finish' or 'next_turn', got ${JSON.stringify(swap)}`);
  return BuiltinPolicyBackend.create(
    { configJson: files.configJson, weightsPath: files.initWeights, version: 0 },
    {
      maxBatch: count('max_batch', 64),
      swapMode: swap,
      threads: count('threads', 1),
      workers: count('workers', 1),
      logger: ctx.logger.child({ role: 'policy' }),
    },
  );
}

/** Rollout options: the `rollout` section, with the gate's numbers taken from the trainer's section. */
export function rolloutOptions(ctx: RunContext, tokenizer: ChatTokenizer): RolloutOptions {
  const r = { ...section(ctx, 'rollout') } as Section;
  const t = trainerOptions(ctx);
  const sampling = { ...((r['sampling'] ?? {}) as Section) };
  if (sampling['stop_token_ids'] === undefined && tokenizer.eosTokenId !== null) sampling['stop_token_ids'] = [tokenizer.eosTokenId];
  return {
    ...(r as RolloutOptions),
    sampling: sampling as RolloutOptions['sampling'],
    groups_per_step: t.groupsPerStep,
    staleness_bound: t.stalenessBound,
    dataset_name: 'calculator',
  };
}

/** The run's tools: `tools.config` names a tool-config YAML (relative to the run config); default the task's own. */
export async function createTools(ctx: RunContext): Promise<ToolSet> {
  const t = section(ctx, 'tools');
  for (const k of Object.keys(t)) if (k !== 'config') throw new RlstreamError('CONFIG_INVALID', `tools.${k} is not a known field (known: config)`);
  if (t['config'] === undefined) return calculatorTools();
  if (typeof t['config'] !== 'string' || t['config'] === '') throw new RlstreamError('CONFIG_INVALID', 'tools.config must be the path of a tool-config YAML file');
  return loadToolConfig(path(ctx, t['config']), { defaultTimeoutMs: 5_000 });
}

export async function createWorker(ctx: RunContext, runId: string, backend: LlmBackend, tokenizer: ChatTokenizer, options: { followPolicy?: boolean; completed?: ReadonlySet<string> } = {}): Promise<RolloutWorker> {
  return new RolloutWorker(
    { runId, log: ctx.log, serde: ctx.serde, backend, tokenizer, tools: await createTools(ctx), logger: ctx.logger, followPolicy: options.followPolicy ?? true, ...(options.completed ? { completed: options.completed } : {}) },
    rolloutOptions(ctx, tokenizer),
  );
}

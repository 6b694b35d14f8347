// Each role of rlstream built from the compiled run config and a RunContext, so the main job (all roles in
// one process) and `rlstream worker <role>` (one role per process) assemble roles exactly the same way.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { RlstreamError } from '../../core/errors.ts';
import type { StreamProcessor } from '../../core/processor.ts';
import type { TraceStore } from '../../core/traces/store.ts';
import { createAdvantageProcessor } from '../../consumers/advantage/consumer.ts';
import { createRewardProcessor } from '../../consumers/reward/consumer.ts';
import { TraceSink } from '../../consumers/traces/sink.ts';
import { Trainer, type TrainerDeps } from '../../consumers/trainer/trainer.ts';
import { isModelDir, readGenerationDefaults } from '../../core/weights/hf-dir.ts';
import { parseModelConfig, type ModelConfig } from '../../core/weights/model-config.ts';
import { backends, type BackendEnv } from '../../producers/backends/registry.ts';
import type { LlmBackend } from '../../producers/backends/types.ts';
import type { RowSource } from '../../producers/dataset/types.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import { RolloutWorker } from '../../producers/worker.ts';
import { toolParserFor } from '../../producers/agent/tool-parser.ts';
import { completeRolloutOptions, type RolloutOptions } from '../../producers/options.ts';
import type { ResumePoint } from '../../producers/resume.ts';
import { loadToolConfig } from '../../producers/tools/config.ts';
import { ToolSet } from '../../producers/tools/tool-set.ts';
import type { RunContext } from './context.ts';
import { versionExporter } from './version-export.ts';
import { runAdvantageStage, runRewardStage } from './plugins.ts';

export interface ModelFiles {
  config: ModelConfig;
  configJson: string;
  tokenizerDir: string;
  /** model.chat_template: a Jinja file replacing the tokenizer directory's template, or null. */
  chatTemplate: string | null;
  /** Weights of version 0 (the warm start). */
  initWeights: string;
  /** The warm start as a checkpoint directory (weights + AdamW state, as `rlstream sft` writes), or null. */
  initCheckpoint: string | null;
}

/**
 * `model.init` names a checkpoint directory (model.safetensors + optimizer state, as `rlstream sft` writes), a Hugging
 * Face model directory (weights only, sharded or not: loaded as they are, the optimizer starting fresh) or a
 * safetensors file.
 */
export function initFiles(init: string): { initWeights: string; initCheckpoint: string | null } {
  if (init.endsWith('.safetensors')) return { initWeights: init, initCheckpoint: null };
  if (isModelDir(init) && !existsSync(join(init, 'optimizer.safetensors'))) return { initWeights: init, initCheckpoint: null };
  return { initWeights: join(init, 'model.safetensors'), initCheckpoint: init };
}

function required(value: string | null, field: string): string {
  if (value === null) throw new RlstreamError('CONFIG_INVALID', `${field}: not set; this role needs it (a path relative to the config file)`);
  return value;
}

export function modelFiles(ctx: RunContext): ModelFiles {
  const m = ctx.config.model;
  const configPath = required(m.config, 'model.config');
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(configPath, 'utf8'));
  } catch (err) {
    throw new RlstreamError('CONFIG_INVALID', `model.config: ${configPath} cannot be read: ${(err as Error).message}`);
  }
  const config = parseModelConfig(raw);
  return { config, configJson: JSON.stringify(raw), tokenizerDir: required(m.tokenizer, 'model.tokenizer'), chatTemplate: m.chatTemplate, ...initFiles(required(m.init, 'model.init')) };
}

/** The run's tokenizer: model.tokenizer's files with model.chat_template's template when one is set. */
export function loadTokenizer(files: Pick<ModelFiles, 'tokenizerDir' | 'chatTemplate'>): ChatTokenizer {
  return ChatTokenizer.load(files.tokenizerDir, files.chatTemplate);
}

export async function createReward(ctx: RunContext): Promise<StreamProcessor> {
  const stage = runRewardStage(ctx.config, ctx.plugins);
  return createRewardProcessor({
    log: ctx.log,
    serde: ctx.serde,
    id: `${ctx.config.run.id}.reward`,
    registry: stage.registry,
    ...(stage.fn ? { fn: stage.fn.fn, fnName: stage.fn.name } : {}),
    shaping: stage.shaping,
    logger: ctx.logger.child({ role: 'reward' }),
  });
}

export function createAdvantage(ctx: RunContext): StreamProcessor {
  const a = ctx.config.advantage;
  const stage = runAdvantageStage(a);
  return createAdvantageProcessor({
    log: ctx.log,
    serde: ctx.serde,
    id: `${ctx.config.run.id}.advantage`,
    estimator: stage.estimator,
    estimatorOptions: stage.options,
    dynamicSampling: stage.dynamicSampling,
    groupTimeoutMs: a.groupTimeoutMs,
    partialGroups: a.partialGroups,
    logger: ctx.logger.child({ role: 'advantage' }),
  });
}

export function createTraceSink(ctx: RunContext, store: TraceStore): TraceSink {
  const t = ctx.config.traces;
  const batch = t.kind === 'none' ? {} : t.batch;
  return new TraceSink({ log: ctx.log, serde: ctx.serde, store, groupId: `${ctx.config.run.id}.traces`, logger: ctx.logger.child({ role: 'traces' }), ...batch });
}

export function createTrainer(ctx: RunContext, runId: string, dataDir: string, onStep?: TrainerDeps['onStep'], extraMetrics?: TrainerDeps['extraMetrics'], onWeights?: TrainerDeps['onWeights']): Trainer {
  const files = modelFiles(ctx);
  // export.every_versions: every N-th version as a model directory, under the run's directory unless export.dir
  const onVersion = versionExporter(ctx.config.export, dataDir, { tokenizerDir: files.tokenizerDir, base: ctx.config.model.base }, ctx.logger.child({ component: 'export' }));
  return new Trainer({
    log: ctx.log,
    serde: ctx.serde,
    runId,
    dataDir,
    initialWeightsPath: files.initWeights,
    initialCheckpoint: files.initCheckpoint,
    modelConfig: files.config,
    modelConfigJson: files.configJson,
    options: ctx.config.trainer,
    logger: ctx.logger,
    ...(onStep ? { onStep } : {}),
    ...(extraMetrics ? { extraMetrics } : {}),
    ...(onWeights ? { onWeights } : {}),
    ...(onVersion ? { onVersion } : {}),
  });
}

/**
 * The LLM backend `backend.name` names, with its options from the same section. `colocatedTrainer`: where a trainer
 * in this process runs that will hand the backend each version (the main job), and whether it trains adapters.
 */
export async function createBackend(ctx: RunContext, colocatedTrainer?: BackendEnv['colocatedTrainer']): Promise<LlmBackend> {
  const b = ctx.config.backend;
  const files = b.name === 'builtin' ? modelFiles(ctx) : null;
  return backends.get(b.name, 'backend.name').create(b.options, {
    configJson: files?.configJson ?? '',
    initWeights: files?.initWeights ?? '',
    tokenizerDir: files?.tokenizerDir ?? ctx.config.model.tokenizer ?? '',
    chatTemplate: ctx.config.model.chatTemplate,
    baseDir: ctx.config.baseDir,
    interrupt: ctx.config.rollout.interrupt,
    ...(colocatedTrainer ? { colocatedTrainer } : {}),
    logger: ctx.logger,
  });
}

/**
 * The rollout worker's options: the compiled `rollout` section completed with the staleness gate's numbers from the
 * trainer's section (one bound for both ends), the dataset name from the task, and the model's defaults.
 */
export function rolloutOptions(ctx: RunContext, tokenizer: ChatTokenizer): RolloutOptions {
  // Defaults from the model directory (model.base's generation_config.json, else the tokenizer directory's): its
  // eos ids stop generation beside the tokenizer's end-of-sequence token, and its sampling values fill what the
  // config leaves null.
  const gen = readGenerationDefaults(ctx.config.model.base !== null && isModelDir(ctx.config.model.base) ? ctx.config.model.base : tokenizer.dir);
  // the tool-call format of the chat template in use (else the model family's), unless rollout.tool_parser names one
  const family = ctx.config.model.config !== null && existsSync(ctx.config.model.config) ? parseModelConfig(readFileSync(ctx.config.model.config, 'utf8')).model_type : null;
  return completeRolloutOptions(ctx.config.rollout, {
    groupsPerStep: ctx.config.trainer.groupsPerStep,
    stalenessBound: ctx.config.trainer.stalenessBound,
    datasetName: ctx.plugins.task.datasetName,
    model: {
      toolParser: toolParserFor(family, tokenizer.templateText),
      temperature: gen.temperature,
      topP: gen.topP,
      topK: gen.topK,
      stopTokenIds: [...new Set([...(tokenizer.eosTokenId !== null ? [tokenizer.eosTokenId] : []), ...gen.eosTokenIds])],
    },
  });
}

/** The run's tools: `tools.config` names a tool-config YAML; by default the task's own (or none). */
export async function createTools(ctx: RunContext): Promise<ToolSet> {
  const path = ctx.config.tools.config;
  if (path !== null) return loadToolConfig(path, { defaultTimeoutMs: 5_000 });
  const task = ctx.plugins.task;
  return task.tools ? task.tools() : new ToolSet();
}

export async function createWorker(ctx: RunContext, runId: string, backend: LlmBackend, tokenizer: ChatTokenizer, options: { followPolicy?: boolean; resume?: ResumePoint } = {}): Promise<RolloutWorker> {
  return new RolloutWorker(
    { runId, log: ctx.log, serde: ctx.serde, backend, tokenizer, tools: await createTools(ctx), agents: ctx.plugins.agents, interactions: ctx.plugins.interactions, logger: ctx.logger, followPolicy: options.followPolicy ?? true, ...(options.resume ? { resume: options.resume } : {}) },
    rolloutOptions(ctx, tokenizer),
  );
}

/** The task's training rows per epoch, capped at task.train_rows when set (a finite run). */
export function trainRows(ctx: RunContext): (epoch: number) => RowSource {
  const cap = ctx.config.task.trainRows;
  const task = ctx.plugins.task;
  return (epoch) => (cap === null ? task.trainRows(epoch) : firstN(task.trainRows(epoch), cap));
}

async function* firstN<T>(source: AsyncIterable<T> | Iterable<T>, n: number): AsyncGenerator<T> {
  let i = 0;
  for await (const x of source) {
    yield x;
    if (++i >= n) return;
  }
}

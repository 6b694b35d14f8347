// The run configuration: one YAML file for both shapes (embedded and distributed), compiled once at start-up
// into a frozen, fully specified RunConfig before any role starts. Every section has a schema (cli/config/
// sections.ts and the roles' option files); plug-in sections (log, registry, traces, backend, task) take the
// chosen plug-in's own options. Every problem is collected, each naming its path and the fix, and reported
// together (ConfigError), so `rlstream config check` lists them all. Keys are snake_case in YAML; the
// compiled objects are what the roles take, with no casts in between.
import { readFileSync } from 'node:fs';
import { dirname, isAbsolute, join, resolve } from 'node:path';
import { Type, type Static, type TObject, type TSchema } from '@sinclair/typebox';
import { parse } from 'yaml';
import { RlstreamError } from '../../core/errors.ts';
import { isModelDir } from '../../core/weights/hf-dir.ts';
import { check, ConfigError, type ConfigIssue } from '../../core/config/validate.ts';
import { didYouMean } from '../../core/config/suggest.ts';
import { AdminSection, AdvantageSection, DatasetSection, EvalSection, LOG_KINDS, ModelSection, TOPIC_RETENTION_DEFAULTS, REGISTRY_KINDS, RewardSection, RunSection, ServeSection, SftStageCommon, TaskCommon, ToolsSection, InteractionSection, TRACE_KINDS, ExportSection } from './sections.ts';
import { DEFAULT_KAFKA_CLIENT, parseClientDebug, type KafkaClient, type KafkaClientLogLevel } from '../../core/log/kafka/options.ts';
import { compileRolloutSection, RolloutSection, type RolloutConfig } from '../../producers/options.ts';
import { TrainerSection, compileTrainerOptions, type TrainerOptions } from '../../consumers/trainer/options.ts';
import { backends } from '../../producers/backends/registry.ts';
import { tasks, type DatasetFiles } from '../../producers/tasks.ts';
import { estimators, type EstimatorOptions } from '../../consumers/advantage/estimators.ts';
import type { ShapingOptions } from '../../consumers/reward/shaping.ts';
import type { SftOptions } from '../../consumers/trainer/sft.ts';
// The tasks shipped with rlstream register themselves here, so a config can name them.
import '../../examples/index.ts';

export { ConfigError, type ConfigIssue };

/** Retention of the record topics (log.retention_bytes, log.retention_ms); null: no limit. */
export interface TopicRetentionConfig {
  maxBytes: number | null;
  maxAgeMs: number | null;
}

export type LogConfig =
  | { kind: 'embedded'; dir: string; retention: TopicRetentionConfig }
  | {
      kind: 'kafka';
      brokers: string[];
      client: KafkaClient;
      clientId: string;
      clientLogLevel: KafkaClientLogLevel;
      /** librdkafka's debug contexts; null: none. */
      clientDebug: string | null;
      ssl: boolean;
      sasl: { mechanism: string; username: string; password: string } | null;
      retention: TopicRetentionConfig;
    };

/** The trace sink's batch (traces.batch_rows, traces.batch_bytes); unset fields take the store's default. */
export interface TraceBatchConfig {
  maxRows?: number;
  maxBytes?: number;
}

export type TracesConfig =
  | { kind: 'chdb'; dir: string; batch: TraceBatchConfig; ttlDays: number | null }
  /** username and password: '' when not set (the URL's user:password@, else the server's default user). */
  | { kind: 'clickhouse'; url: string; username: string; password: string; readerUsername: string; readerPassword: string; database: string; batch: TraceBatchConfig }
  | { kind: 'none' };

export type RegistryConfig = { kind: 'embedded' } | { kind: 'http'; url: string };

export interface RunSectionConfig {
  id: string;
  /** Everything a run writes: log (embedded), checkpoints, weights, traces (chDB), plots. */
  dataDir: string;
  seed: number;
}

export interface ModelConfigFiles {
  /** Absolute paths, or null where the config does not set them. */
  config: string | null;
  tokenizer: string | null;
  chatTemplate: string | null;
  init: string | null;
  base: string | null;
}

export interface TaskConfig {
  name: string;
  /** User code (absolute path) and export, when the task is not a registered one. */
  module: string | null;
  export: string | null;
  heldoutProblems: number;
  trainRows: number | null;
  /** The task plug-in's own keys, validated by its schema (for a module task: when it is loaded). */
  options: Readonly<Record<string, unknown>>;
}

export interface SftStage extends SftOptions {
  problems: number;
  /** The task's own stage keys (e.g. the calculator's difficulty, direct_fraction). */
  options: Readonly<Record<string, unknown>>;
}

export interface RewardConfig {
  name: string | null;
  module: string | null;
  export: string | null;
  shaping: Required<ShapingOptions>;
}

export interface AdvantageConfig {
  estimator: string;
  /** Every registered estimator's options (its advantage.<name> section, compiled), by name. */
  options: Readonly<Record<string, EstimatorOptions>>;
  groupTimeoutMs: number;
  partialGroups: 'drop' | 'emit';
  dynamicSampling: boolean;
}

/** export section: every N-th version as a model directory; dir null: <run dir>/export. */
export interface ExportConfig {
  everyVersions: number | null;
  dir: string | null;
  dtype: 'F32' | 'BF16';
  maxShardBytes: number;
}

export interface EvalConfig {
  everySteps: number;
  problems: number | null;
  everyVersions: number | null;
  successThreshold: number;
}

/** The OpenAI-compatible endpoint (serve section); null model / dataSource: the run id / the task's dataset name. */
export interface ServeConfig {
  enabled: boolean;
  host: string;
  port: number;
  model: string | null;
  maxSessions: number;
  idleTimeoutMs: number;
  bodyLimitBytes: number;
  requestReadTimeoutMs: number;
  maxPromptTokens: number | null;
  maxSessionsPerToken: number | null;
  maxCallsPerToken: number;
  dataSource: string | null;
}

export interface RunConfig {
  /** Directory of the config file: relative paths in it resolve from here. */
  baseDir: string;
  run: RunSectionConfig;
  log: LogConfig;
  registry: RegistryConfig;
  traces: TracesConfig;
  admin: { port: number };
  serve: ServeConfig;
  model: ModelConfigFiles;
  task: TaskConfig;
  dataset: DatasetFiles;
  sft: { stages: readonly SftStage[] };
  rollout: RolloutConfig;
  backend: { name: string; options: Readonly<Record<string, unknown>> };
  tools: { config: string | null };
  interaction: { config: string | null };
  reward: RewardConfig;
  advantage: AdvantageConfig;
  trainer: TrainerOptions;
  eval: EvalConfig;
  export: ExportConfig;
  /** The effective configuration in YAML's shape: every key with its value or default (secrets included). */
  effective: Readonly<Record<string, unknown>>;
}

const SECTIONS = ['run', 'log', 'registry', 'traces', 'admin', 'serve', 'model', 'task', 'dataset', 'sft', 'rollout', 'backend', 'tools', 'interaction', 'reward', 'advantage', 'trainer', 'eval', 'export'] as const;

/** The top level: the known sections, each a mapping (its keys are checked by its own schema). */
const TopLevel = Type.Object(Object.fromEntries(SECTIONS.map((s) => [s, Type.Optional(Type.Unsafe({ type: ['object', 'null'] }))])), { additionalProperties: false });

/** A plug-in section: `selector` picks the plug-in among `kinds`, whose schema (plus the selector) checks the rest. */
function pluginSection(raw: unknown, path: string, selector: string, fallback: string, kindWord: string, kinds: (name: string) => TObject | null, names: () => string[], issues: ConfigIssue[]): { name: string; value: Record<string, unknown> } | null {
  const m = raw === undefined || raw === null ? {} : (raw as Record<string, unknown>);
  const name = m[selector] ?? fallback;
  if (typeof name !== 'string' || name === '') {
    issues.push({ path: `${path}.${selector}`, message: `must be one of ${names().join(', ')} (got ${JSON.stringify(name)})` });
    return null;
  }
  const schema = kinds(name);
  if (!schema) {
    issues.push({ path: `${path}.${selector}`, message: `unknown ${kindWord} "${name}"${didYouMean(name, names())} (known: ${names().join(', ')})` });
    return null;
  }
  const full = Type.Object({ [selector]: Type.String(), ...schema.properties }, { additionalProperties: false });
  const value = check(full, { ...m, [selector]: name }, path, issues);
  return value === null ? null : { name, value };
}

/** `${VAR}` in any string value is replaced by the environment variable, so secrets stay out of files. */
function expandEnv(v: unknown, path: string, issues: ConfigIssue[]): unknown {
  if (typeof v === 'string') {
    return v.replace(/\$\{([A-Z0-9_]+)\}/g, (whole, name: string) => {
      const value = process.env[name];
      if (value === undefined) {
        issues.push({ path, message: `refers to environment variable ${name}, which is not set` });
        return whole;
      }
      return value;
    });
  }
  if (Array.isArray(v)) return v.map((x, i) => expandEnv(x, `${path}[${i}]`, issues));
  if (v !== null && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, expandEnv(x, path === '' ? k : `${path}.${k}`, issues)]));
  return v;
}

function nullablePath(p: string | null, abs: (p: string) => string): string | null {
  return p === null ? null : abs(p);
}

/** Compile a parsed config (after --set overrides). Throws ConfigError listing every issue. */
export function compileRunConfig(parsed: unknown, baseDir: string): RunConfig {
  const issues: ConfigIssue[] = [];
  if (parsed !== undefined && parsed !== null && (typeof parsed !== 'object' || Array.isArray(parsed))) throw new ConfigError([{ path: '(config)', message: 'must be a mapping of sections' }]);
  const raw = expandEnv(parsed ?? {}, '', issues) as Record<string, unknown>;
  check(TopLevel, raw, '', issues);
  const abs = (p: string) => (isAbsolute(p) ? p : resolve(baseDir, p));
  const effective: Record<string, unknown> = {};
  const section = <S extends TSchema>(name: (typeof SECTIONS)[number], schema: S): Static<S> | null => {
    const v = check(schema, raw[name], name, issues);
    if (v !== null) effective[name] = v;
    return v;
  };

  const runS = section('run', RunSection);
  const run: RunSectionConfig = { id: runS?.id ?? 'run', dataDir: abs(runS?.data_dir ?? '.rlstream/run'), seed: runS?.seed ?? 1 };

  const defaultRetention: TopicRetentionConfig = { maxBytes: TOPIC_RETENTION_DEFAULTS.bytes, maxAgeMs: TOPIC_RETENTION_DEFAULTS.ms };
  let log: LogConfig = { kind: 'embedded', dir: `${run.dataDir}/log`, retention: defaultRetention };
  const logS = pluginSection(raw['log'], 'log', 'kind', 'embedded', 'event log', (k) => LOG_KINDS[k] ?? null, () => Object.keys(LOG_KINDS), issues);
  if (logS) {
    effective['log'] = logS.value;
    const v = logS.value;
    const retention: TopicRetentionConfig = { maxBytes: (v['retention_bytes'] as number | null | undefined) ?? null, maxAgeMs: (v['retention_ms'] as number | null | undefined) ?? null };
    if (logS.name === 'kafka') {
      const brokers = v['brokers'];
      const list = typeof brokers === 'string' ? brokers.split(',').map((b) => b.trim()) : Array.isArray(brokers) ? brokers.map(String) : [];
      if (!list.every((b) => /^[^:\s]+:\d+$/.test(b))) issues.push({ path: 'log.brokers', message: `must be host:port entries (got ${JSON.stringify(brokers)})` });
      const sasl = v['sasl'] as { mechanism: string; username: string; password: string } | undefined;
      const client = (v['client'] as KafkaClient | undefined) ?? DEFAULT_KAFKA_CLIENT;
      const debug = parseClientDebug(v['client_debug'], client);
      if ('problem' in debug) issues.push({ path: 'log.client_debug', message: debug.problem });
      log = {
        kind: 'kafka',
        brokers: list,
        client,
        clientId: String(v['client_id']),
        clientLogLevel: (v['client_log_level'] as KafkaClientLogLevel | undefined) ?? 'warn',
        clientDebug: 'contexts' in debug ? debug.contexts : null,
        ssl: v['ssl'] === true,
        sasl: sasl ?? null,
        retention,
      };
    } else log = { kind: 'embedded', dir: typeof v['dir'] === 'string' ? abs(v['dir']) : `${run.dataDir}/log`, retention };
  }

  let registry: RegistryConfig = { kind: 'embedded' };
  const regS = pluginSection(raw['registry'], 'registry', 'kind', 'embedded', 'schema registry', (k) => REGISTRY_KINDS[k] ?? null, () => Object.keys(REGISTRY_KINDS), issues);
  if (regS) {
    effective['registry'] = regS.value;
    if (regS.name === 'http') registry = { kind: 'http', url: String(regS.value['url']) };
  }

  let traces: TracesConfig = { kind: 'chdb', dir: `${run.dataDir}/chdb`, batch: {}, ttlDays: null };
  const trS = pluginSection(raw['traces'], 'traces', 'kind', 'chdb', 'trace store', (k) => TRACE_KINDS[k] ?? null, () => Object.keys(TRACE_KINDS), issues);
  if (trS) {
    effective['traces'] = trS.value;
    const v = trS.value;
    const batch: TraceBatchConfig = { ...(typeof v['batch_rows'] === 'number' ? { maxRows: v['batch_rows'] } : {}), ...(typeof v['batch_bytes'] === 'number' ? { maxBytes: v['batch_bytes'] } : {}) };
    if (trS.name === 'clickhouse' && v['ttl_days'] !== null && v['ttl_days'] !== undefined) {
      issues.push({ path: 'traces.ttl_days', message: 'is not supported by the clickhouse trace store: ClickHouse server 18.16 has no table TTL (added in 19.6). Remove it (null), use kind: chdb, or drop old monthly partitions with ALTER TABLE … DROP PARTITION' });
    }
    if (trS.name === 'none') traces = { kind: 'none' };
    else if (trS.name === 'clickhouse') traces = { kind: 'clickhouse', url: String(v['url']), username: String(v['username']), password: String(v['password']), readerUsername: String(v['reader_username']), readerPassword: String(v['reader_password']), database: String(v['database']), batch };
    else traces = { kind: 'chdb', dir: typeof v['dir'] === 'string' ? abs(v['dir']) : `${run.dataDir}/chdb`, batch, ttlDays: typeof v['ttl_days'] === 'number' ? v['ttl_days'] : null };
  }

  const admin = section('admin', AdminSection) ?? { port: 0 };
  const serveS = section('serve', ServeSection);
  const modelS = section('model', ModelSection);
  const model: ModelConfigFiles = { config: nullablePath(modelS?.config ?? null, abs), tokenizer: nullablePath(modelS?.tokenizer ?? null, abs), chatTemplate: nullablePath(modelS?.chat_template ?? null, abs), init: nullablePath(modelS?.init ?? null, abs), base: nullablePath(modelS?.base ?? null, abs) };
  // model.base naming a Hugging Face model directory is all a model needs: its config.json, its tokenizer and chat
  // template, and its weights as the warm start, each where the config does not name another.
  if (model.base !== null && isModelDir(model.base)) {
    model.config ??= join(model.base, 'config.json');
    model.tokenizer ??= model.base;
    model.init ??= model.base;
  }

  // The task: its common keys, plus the registered plug-in's own (a module task checks its own when loaded).
  const taskRaw = (raw['task'] ?? {}) as Record<string, unknown>;
  const isModule = typeof taskRaw['module'] === 'string';
  const taskName = String(taskRaw['name'] ?? 'files');
  const taskPlugin = !isModule && tasks.has(taskName) ? tasks.get(taskName) : null;
  let task: TaskConfig = { name: 'files', module: null, export: null, heldoutProblems: 200, trainRows: null, options: {} };
  if (!isModule && taskPlugin === null) {
    issues.push({ path: 'task.name', message: `unknown task "${taskName}"${didYouMean(taskName, tasks.names())} (known: ${tasks.names().join(', ')}; or module: ./my_task.ts)` });
  } else {
    const own = taskPlugin?.options.properties ?? {};
    const schema = Type.Object({ ...TaskCommon, ...own }, { additionalProperties: isModule });
    const v = check(schema, taskRaw, 'task', issues);
    if (v) {
      effective['task'] = v;
      const { name, module, export: exp, heldout_problems, train_rows, ...options } = v as Record<string, unknown>;
      task = { name: String(name), module: typeof module === 'string' ? abs(module) : null, export: typeof exp === 'string' ? exp : null, heldoutProblems: Number(heldout_problems), trainRows: typeof train_rows === 'number' ? train_rows : null, options: Object.freeze(options) };
    }
  }

  const datasetS = section('dataset', DatasetSection);
  const dataset: DatasetFiles = { train: nullablePath(datasetS?.train ?? null, abs), heldout: nullablePath(datasetS?.heldout ?? null, abs), loader: datasetS?.loader ?? null };

  // SFT: the section's own keys are the defaults of every stage; `stages:` entries override them.
  const stageSchema = Type.Object({ ...SftStageCommon, ...(taskPlugin?.sftOptions?.properties ?? {}) }, { additionalProperties: false });
  const sftRaw = (raw['sft'] ?? {}) as Record<string, unknown>;
  const { stages: stagesRaw, ...sftBase } = sftRaw;
  const stages: SftStage[] = [];
  const stageList = stagesRaw === undefined ? [{}] : stagesRaw;
  if (!Array.isArray(stageList) || stageList.length === 0) issues.push({ path: 'sft.stages', message: 'must be a non-empty list of stages' });
  else {
    const effectiveStages: unknown[] = [];
    stageList.forEach((st, i) => {
      const path = stagesRaw === undefined ? 'sft' : `sft.stages[${i}]`;
      if (st === null || typeof st !== 'object' || Array.isArray(st)) return issues.push({ path, message: 'must be a mapping' });
      const v = check(stageSchema, { ...sftBase, ...st }, path, issues);
      if (!v) return;
      effectiveStages.push(v);
      const { problems, steps, batch_tokens, micro_batch_tokens, learning_rate, warmup_steps, weight_decay, grad_clip, seed, ...options } = v as Record<string, unknown>;
      stages.push({
        problems: Number(problems), steps: Number(steps), batchTokens: Number(batch_tokens), microBatchTokens: Number(micro_batch_tokens), learningRate: Number(learning_rate),
        warmupSteps: Number(warmup_steps), weightDecay: Number(weight_decay), gradClip: Number(grad_clip), seed: typeof seed === 'number' ? seed : run.seed + i, options: Object.freeze(options),
      });
    });
    effective['sft'] = stagesRaw === undefined ? effectiveStages[0] : { stages: effectiveStages };
  }

  const rollout = section('rollout', RolloutSection);

  let backend: RunConfig['backend'] = { name: 'builtin', options: {} };
  const beS = pluginSection(raw['backend'], 'backend', 'name', 'builtin', 'LLM backend', (n) => (backends.has(n) ? backends.get(n).options : null), () => backends.names(), issues);
  if (beS) {
    effective['backend'] = beS.value;
    const { name: _name, ...options } = beS.value;
    backend = { name: beS.name, options: Object.freeze(options) };
    const interrupts = backends.get(beS.name).interrupts ?? ['next_turn'];
    if (rollout && !interrupts.includes(rollout.interrupt))
      issues.push({
        path: 'rollout.interrupt',
        message: `backend ${beS.name} supports ${interrupts.join(', ')} (got ${JSON.stringify(rollout.interrupt)}); ${rollout.interrupt} needs backend.name: ${backends.names().filter((n) => backends.get(n).interrupts?.includes(rollout.interrupt)).join(' or ') || '(none registered)'}`,
      });
  }

  const toolsS = section('tools', ToolsSection);
  const interactionS = section('interaction', InteractionSection);
  const rewardS = section('reward', RewardSection);
  if (rewardS?.name && rewardS.module) issues.push({ path: 'reward.name', message: 'give reward.name or reward.module, not both' });
  if (rewardS && rollout && rewardS.shaping.overlong_buffer_len >= rollout.response_length)
    issues.push({ path: 'reward.shaping.overlong_buffer_len', message: `must be below rollout.response_length (${rollout.response_length}), got ${rewardS.shaping.overlong_buffer_len}` });
  const advS = section('advantage', AdvantageSection);
  const estimator = (raw['advantage'] as Record<string, unknown> | undefined)?.['estimator'];
  if (typeof estimator === 'string' && !estimators.has(estimator)) issues.push({ path: 'advantage.estimator', message: estimators.unknownMessage(estimator, '').replace(/^: /, '') });
  const trainerS = section('trainer', TrainerSection);
  const evalS = section('eval', EvalSection);
  const exportS = section('export', ExportSection);
  // Versions of a LoRA run are adapters: the onnx engine (builtin on the cpu) loads whole weights only.
  if (trainerS?.lora && beS?.name === 'builtin' && (beS.value as { device?: string }).device !== 'cuda')
    issues.push({ path: 'trainer.lora', message: "the builtin backend on the cpu (onnx) cannot apply adapters: set backend.device: cuda (the native engine folds them in), use backend.name sglang or vllm with weight_sync, or remove trainer.lora" });

  if (issues.length > 0) throw new ConfigError(issues);
  // Every section checked: what follows only renames keys.
  const r = rewardS!;
  const a = advS!;
  const e = evalS!;
  const sv = serveS!;
  const x = exportS!;
  return deepFreeze({
    baseDir,
    run,
    log,
    registry,
    traces,
    admin,
    serve: { enabled: sv.enabled, host: sv.host, port: sv.port, model: sv.model, maxSessions: sv.max_sessions, idleTimeoutMs: sv.idle_timeout_ms, bodyLimitBytes: sv.body_limit_bytes, requestReadTimeoutMs: sv.request_read_timeout_ms, maxPromptTokens: sv.max_prompt_tokens, maxSessionsPerToken: sv.max_sessions_per_token, maxCallsPerToken: sv.max_calls_per_token, dataSource: sv.data_source },
    model,
    task,
    dataset,
    sft: { stages },
    rollout: compileRolloutSection(rollout),
    backend,
    tools: { config: nullablePath(toolsS!.config, abs) },
    interaction: { config: nullablePath(interactionS!.config, abs) },
    reward: {
      name: r.name,
      module: r.module === null ? null : abs(r.module),
      export: r.export,
      shaping: {
        toolSuccessBonus: r.shaping.tool_success_bonus,
        invalidCallPenalty: r.shaping.invalid_call_penalty,
        maxTurnsPenalty: r.shaping.max_turns_penalty,
        overlongBufferLen: r.shaping.overlong_buffer_len,
        overlongPenaltyFactor: r.shaping.overlong_penalty_factor,
        maxResponseLength: rollout!.response_length,
        maskTruncated: r.shaping.mask_truncated,
      },
    },
    advantage: { estimator: a.estimator, options: Object.fromEntries(estimators.names().map((n) => [n, estimators.get(n).compile((a as Record<string, unknown>)[n], `advantage.${n}`)])), groupTimeoutMs: a.group_timeout_ms, partialGroups: a.partial_groups, dynamicSampling: a.dynamic_sampling },
    trainer: compileTrainerOptions(trainerS),
    eval: { everySteps: e.every_steps, problems: e.problems, everyVersions: e.every_versions, successThreshold: e.success_threshold },
    export: { everyVersions: x.every_versions, dir: nullablePath(x.dir, abs), dtype: x.dtype === 'bf16' ? 'BF16' : 'F32', maxShardBytes: x.max_shard_size },
    effective,
  });
}

function deepFreeze<T>(o: T): T {
  if (o !== null && typeof o === 'object' && !Object.isFrozen(o)) {
    Object.freeze(o);
    for (const v of Object.values(o)) deepFreeze(v);
  }
  return o;
}

/** Read and parse a config file; a YAML error names the file and line. */
function readConfigFile(path: string): unknown {
  try {
    return parse(readFileSync(path, 'utf8'));
  } catch (err) {
    throw new RlstreamError('CONFIG_INVALID', `cannot read config ${path}: ${(err as Error).message}`, { cause: err });
  }
}

export function loadRunConfig(path: string, overrides: Record<string, unknown> = {}): RunConfig {
  return compileRunConfig(applyOverrides(readConfigFile(path), overrides), dirname(resolve(path)));
}

/** Dotted overrides from the command line (`--set trainer.max_steps=3`), applied before validation. */
function applyOverrides(raw: unknown, overrides: Record<string, unknown>): unknown {
  if (raw !== undefined && raw !== null && (typeof raw !== 'object' || Array.isArray(raw))) throw new ConfigError([{ path: '(config)', message: 'must be a mapping of sections' }]);
  const root = structuredClone((raw ?? {}) as Record<string, unknown>);
  for (const [dotted, value] of Object.entries(overrides)) {
    const parts = dotted.split('.');
    let node: Record<string, unknown> = root;
    for (const p of parts.slice(0, -1)) {
      const child = node[p];
      if (child === undefined || child === null) node[p] = {};
      else if (typeof child !== 'object' || Array.isArray(child)) throw new ConfigError([{ path: dotted, message: `cannot be set: ${p} is not a mapping` }]);
      node = node[p] as Record<string, unknown>;
    }
    node[parts[parts.length - 1]!] = value;
  }
  return root;
}

// Key names whose values are secrets. `token` only as a whole word or suffix: max_tokens and tokenizer are not.
const SECRET = /password|passwd|secret|api_?key|access_?key|private_?key|credential|authorization|(^|_)token$/i;
const MASK = '********';

/**
 * Credentials inside URLs, wherever a string holds one (`http://user:pass@host`, `sasl_ssl://token@broker`): the
 * password is masked and the user kept, or, alone before the `@`, the user (often a token) is masked.
 */
export function maskUrlCredentials(text: string): string {
  // Greedy to the last @ of the authority: a password with an unencoded @ is masked whole.
  return text.replace(/\b([a-z][a-z0-9+._-]*:\/\/)([^\s/?#]+)@/gi, (_whole, scheme: string, userinfo: string) => {
    const colon = userinfo.indexOf(':');
    return colon < 0 ? `${scheme}${MASK}@` : `${scheme}${userinfo.slice(0, colon)}:${MASK}@`;
  });
}

/** The effective config with secrets masked, for printing and the admin API: secret keys' values, and credentials in any URL. */
export function maskSecrets(v: unknown, key = ''): unknown {
  // Whatever a secret key holds (a string, a number, a mapping of parts) is masked whole.
  if (SECRET.test(key) && v !== null && v !== undefined && v !== '') return MASK;
  if (typeof v === 'string') return maskUrlCredentials(v);
  if (Array.isArray(v)) return v.map((x) => maskSecrets(x));
  if (v !== null && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, maskSecrets(x, k)]));
  return v;
}

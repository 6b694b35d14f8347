// What a run opens at start-up, checked without starting it: the files and directories the config names (of
// the right kind), the model files (model.config parsed, the tokenizer and chat template loaded, the warm start's
// safetensors header read, or the warm start trainable by the task's SFT), the tools (tools.config's classes
// resolved, or the task's), and the datasets (the first training rows and every held-out row the run evaluates
// on, each validated as the run reads it). `rlstream config check` reports these, and `rlstream run` refuses to
// start on any of them before it writes anything, so check ok ⇔ the run starts.
// Not here: trainer.device, which depends on the machine that trains, not on the config
// (consumers/trainer/device.ts).
import { closeSync, existsSync, readFileSync, statSync } from 'node:fs';
import { loadRunConfig, type RunConfig } from '../config/run-config.ts';
import { checkDeviceRunsHere } from '../../consumers/trainer/device.ts';
import { devicesProblems } from '../../consumers/trainer/parallel/devices.ts';
import { engineDevicesProblems } from '../../native/gpus.ts';
import { ConfigError } from '../../core/config/validate.ts';
import { describeError, isRlstreamError } from '../../core/errors.ts';
import { parseModelConfig } from '../../core/weights/model-config.ts';
import { isModelDir, openWeights, readGenerationDefaults } from '../../core/weights/hf-dir.ts';
import { expectedTensors } from '../../producers/policy/tensors.ts';
import { openForRead, readHeader } from '../../core/weights/safetensors.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import { loadToolConfig } from '../../producers/tools/config.ts';
import { resolvePlugins, type RunPlugins } from './plugins.ts';
import { initFiles } from './roles.ts';

/** Training rows read (and validated) by the check: enough that a file in the wrong format fails, quick on any task. */
export const TRAIN_ROWS_CHECKED = 100;

function message(err: unknown): string {
  if (err instanceof ConfigError) return err.issues.map((i) => `${i.path}: ${i.message}`).join('; ');
  return isRlstreamError(err) ? err.message : describeError(err);
}

/** A path the config names must be a file, or a directory, as its role opens it. */
function pathProblem(field: string, p: string, kind: 'file' | 'directory'): string | null {
  if (!existsSync(p)) return `${field}: ${p} does not exist (paths are relative to the config file)`;
  const isDir = statSync(p).isDirectory();
  if (kind === 'file' && isDir) return `${field}: ${p} is a directory; name a file`;
  if (kind === 'directory' && !isDir) return `${field}: ${p} is a file; name a directory`;
  return null;
}

/** Problems with the files and directories the config names (no plug-in needed). */
export function pathProblems(config: RunConfig): string[] {
  const m = config.model;
  const expected: [string, string | null, 'file' | 'directory'][] = [
    ['model.config', m.config, 'file'],
    ['model.tokenizer', m.tokenizer, 'directory'],
    ['model.chat_template', m.chatTemplate, 'file'],
    ['tools.config', config.tools.config, 'file'],
    ['dataset.train', config.dataset.train, 'file'],
    ['dataset.heldout', config.dataset.heldout, 'file'],
  ];
  // model.base, like model.init, is a checkpoint directory or a .safetensors file.
  // (a checkpoint directory, a Hugging Face model directory, or a .safetensors file); checkModel reads its headers.
  if (m.base !== null) expected.push(['model.base', m.base, m.base.endsWith('.safetensors') ? 'file' : 'directory']);
  return expected.flatMap(([field, p, kind]) => (p === null ? [] : [pathProblem(field, p, kind)].filter((x): x is string => x !== null)));
}

/** Problems the run would meet at start-up once its plug-ins resolved: model files, device, tools, datasets. */
export async function startupProblems(config: RunConfig, plugins: RunPlugins): Promise<string[]> {
  const problems: string[] = [];
  const m = config.model;
  const need = (field: string, v: string | null): v is string => {
    if (v === null) problems.push(`${field}: not set; the trainer needs it (a path relative to the config file)`);
    return v !== null;
  };
  if (need('model.config', m.config) && existsSync(m.config) && statSync(m.config).isFile()) {
    try {
      parseModelConfig(JSON.parse(readFileSync(m.config, 'utf8')));
    } catch (err) {
      problems.push(`model.config: ${m.config} is not a model configuration: ${message(err)}`);
    }
  }
  if (need('model.tokenizer', m.tokenizer) && existsSync(m.tokenizer) && statSync(m.tokenizer).isDirectory()) {
    try {
      ChatTokenizer.load(m.tokenizer, m.chatTemplate);
    } catch (err) {
      problems.push(`model.tokenizer: ${m.tokenizer} cannot be loaded: ${message(err)}`);
    }
  }
  if (need('model.init', m.init)) {
    const { initWeights } = initFiles(m.init);
    if (!existsSync(initWeights)) {
      // The run trains a missing warm start by SFT, which needs the task's demonstrations.
      if (!plugins.task.sftExamples) problems.push(`model.init: ${m.init} does not exist and task ${config.task.name} has no SFT demonstrations to train it; point model.init at existing weights`);
    } else if (statSync(initWeights).isDirectory() && !isModelDir(initWeights)) problems.push(`model.init: ${initWeights} is a directory; name a checkpoint directory holding model.safetensors, a Hugging Face model directory, or a .safetensors file`);
    else if (!statSync(initWeights).isDirectory()) problems.push(...weightsProblem('model.init', initWeights));
  }
  if (m.base !== null) {
    const { initWeights } = initFiles(m.base);
    if (existsSync(initWeights) && statSync(initWeights).isFile()) problems.push(...weightsProblem('model.base', initWeights));
  }
  try {
    const tools = config.tools.config !== null ? (existsSync(config.tools.config) && statSync(config.tools.config).isFile() ? await loadToolConfig(config.tools.config) : null) : plugins.task.tools ? await plugins.task.tools() : null;
    await tools?.close();
  } catch (err) {
    problems.push(`${config.tools.config !== null ? `tools.config (${config.tools.config})` : 'task tools'}: ${message(err)}`);
  }
  problems.push(...(await datasetProblems(config, plugins)));
  return problems;
}

/** A weights file whose safetensors header cannot be read (the file the trainer and the backend load first). */
function weightsProblem(field: string, path: string): string[] {
  let fd: number | null = null;
  try {
    fd = openForRead(path);
    readHeader(fd, path);
    return [];
  } catch (err) {
    return [`${field}: ${path} is not a safetensors file: ${message(err)}`];
  } finally {
    if (fd !== null) closeSync(fd);
  }
}

/** The rows the run reads first, validated as it reads them: a file in the wrong format fails here. */
async function datasetProblems(config: RunConfig, plugins: RunPlugins): Promise<string[]> {
  const problems: string[] = [];
  const paths = [config.dataset.train, config.dataset.heldout];
  if (paths.some((p) => p !== null && (!existsSync(p) || statSync(p).isDirectory()))) return problems; // reported by pathProblems
  try {
    let n = 0;
    const cap = Math.min(TRAIN_ROWS_CHECKED, config.task.trainRows ?? Infinity);
    for await (const _row of plugins.task.trainRows(0)) if (++n >= cap) break;
    if (n === 0) problems.push(`dataset.train: task ${config.task.name} gives no training rows${config.dataset.train ? ` (${config.dataset.train} is empty)` : ''}`);
  } catch (err) {
    problems.push(message(err));
  }
  try {
    await plugins.task.heldoutRows(config.task.heldoutProblems);
  } catch (err) {
    problems.push(message(err));
  }
  return problems;
}

/** Compile the config and resolve its plug-ins (user modules included); the problems, or none. */
export async function checkConfig(path: string, overrides: Record<string, unknown>): Promise<{ config: RunConfig | null; problems: string[] }> {
  let config: RunConfig;
  try {
    config = loadRunConfig(path, overrides);
  } catch (err) {
    if (err instanceof ConfigError) return { config: null, problems: err.issues.map((i) => `${i.path}: ${i.message}`) };
    return { config: null, problems: [isRlstreamError(err) ? err.message : describeError(err)] };
  }
  const problems = pathProblems(config);
  let plugins;
  try {
    plugins = await resolvePlugins(config);
  } catch (err) {
    problems.push(isRlstreamError(err) ? err.message : describeError(err));
  }
  if (plugins) problems.push(...(await startupProblems(config, plugins)));
  problems.push(...checkModel(config));
  problems.push(...devicesProblems(config.trainer.dataParallel));
  const engines = config.backend.name === 'builtin' ? (config.backend.options['devices'] as number[] | undefined) : undefined;
  if (engines !== undefined) problems.push(...engineDevicesProblems(engines, config.backend.options['device'], { ranks: config.trainer.dataParallel.ranks, deviceIds: config.trainer.dataParallel.deviceIds, device: config.trainer.device }));
  problems.push(...deviceProblems(config));
  return { config, problems };
}

/**
 * trainer.device and the built-in backend's device against this machine, as trainer.devices is checked against its
 * GPU count: a 'cuda' that the roles would refuse at start is named here, so that a config check ok on this machine
 * means the run starts on it. (A config checked for another machine gets these two lines and nothing else.)
 */
function deviceProblems(config: RunConfig): string[] {
  const problems: string[] = [];
  const fields: [string, unknown][] = [['trainer.device', config.trainer.device]];
  if (config.backend.name === 'builtin') fields.push(['backend.device', config.backend.options['device']]);
  for (const [field, device] of fields) {
    if (device !== 'cuda') continue;
    try {
      checkDeviceRunsHere('cuda', field);
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      problems.push(...err.issues.map((i) => `${i.path}: ${i.message}`));
    }
  }
  return problems;
}

/**
 * The model as the roles will load it: config.json through the one parser (a key it does not support is named), the
 * weights' headers (model.init where it exists, model.base) against the tensors that config needs (names, shapes, a
 * sharded directory's index against its shards), and generation_config.json. Only headers are read.
 */
function checkModel(config: RunConfig): string[] {
  const m = config.model;
  if (m.config === null || !existsSync(m.config)) return [];
  let json: string;
  let expected: Map<string, number[]>;
  let tied: boolean;
  try {
    json = readFileSync(m.config, 'utf8');
    const pc = parseModelConfig(json);
    expected = expectedTensors(pc);
    tied = pc.tie_word_embeddings;
  } catch {
    // startupProblems (cli/run/preflight.ts) already names a model.config that does not parse.
    return [];
  }
  const problems: string[] = [];
  const seen = new Set<string>();
  for (const [field, p] of [['model.init', m.init], ['model.base', m.base]] as const) {
    if (p === null) continue;
    const weights = initFiles(p).initWeights;
    if (!existsSync(weights) || seen.has(weights)) continue;
    seen.add(weights);
    try {
      const w = openWeights(weights);
      try {
        for (const [name, shape] of expected) {
          const e = w.tensors.get(name)?.entry;
          if (!e) problems.push(`${field}: ${weights} lacks tensor ${name}, which model.config needs`);
          else if (e.shape.join(',') !== shape.join(',')) problems.push(`${field}: ${weights}: tensor ${name} has shape [${e.shape.join(', ')}], model.config gives [${shape.join(', ')}]`);
        }
        for (const name of w.tensors.keys())
          if (!expected.has(name) && !(tied && name === 'lm_head.weight') && !/(^|\.)rotary_emb\.inv_freq$/.test(name)) problems.push(`${field}: ${weights} holds tensor ${name}, which no model of model.config has`);
      } finally {
        w.close();
      }
    } catch (err) {
      // A single file whose header does not read is already named by startupProblems (cli/run/preflight.ts).
      if (!statSync(weights).isFile()) problems.push(`${field}: ${isRlstreamError(err) ? err.message : describeError(err)}`);
    }
  }
  if (m.base !== null && isModelDir(m.base)) {
    try {
      readGenerationDefaults(m.base);
    } catch (err) {
      problems.push(`model.base: ${isRlstreamError(err) ? err.message : describeError(err)}`);
    }
  }
  return problems;
}

/** The report of a config's problems, the same from `config check` and from a `run` that refuses to start. */
export function problemsReport(file: string, problems: string[]): string {
  return `${file}: ${problems.length} problem(s)\n${problems.map((p) => `  ${p}`).join('\n')}`;
}

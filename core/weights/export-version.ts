// One policy version of a run written as a Hugging Face model directory: what `rlstream export` writes, and what a
// run with export.every_versions writes as it goes. The version's weights file is checked against the sha256 its
// PolicyVersion event names before anything is written, and the directory is written aside and renamed into place
// by the one directory writer (hf-dir.ts's writeHfDir), which refuses an existing directory unless forced.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { RlstreamError } from '../errors.ts';
import { sha256File } from './checksum.ts';
import { isModelDir, readWeights, writeHfDir } from './hf-dir.ts';
import { parseModelConfig } from './model-config.ts';
import type { WriteDtype } from './safetensors.ts';

/** The version to write: its weights file and what its PolicyVersion event says of it. */
export interface VersionWeights {
  version: number;
  /** sha256 of the weights file, as the PolicyVersion event names it. */
  checksum: string;
  /** The model's config.json as the run read it (the event's config_json). */
  configJson: string;
  weightsFile: string;
}

export interface ExportVersionOptions {
  dtype: WriteDtype;
  /** Largest shard in bytes (default 5e9, as save_pretrained). */
  maxShardBytes?: number;
  /** The tokenizer files to copy (a directory holding tokenizer.json), or null for none. */
  tokenizerDir: string | null;
  /** The run's model.base: its generation_config.json is the export's; without one, the config's token ids. */
  base: string | null;
  /** Replace an existing directory (else refused). */
  force: boolean;
}

/** generation_config.json of an export: the base model directory's, else the token ids the config names. */
export function generationConfigFor(configJson: string, base: string | null): Record<string, unknown> {
  if (base !== null && isModelDir(base) && existsSync(join(base, 'generation_config.json'))) return JSON.parse(readFileSync(join(base, 'generation_config.json'), 'utf8')) as Record<string, unknown>;
  const cfg = JSON.parse(configJson) as Record<string, unknown>;
  return Object.fromEntries(['bos_token_id', 'eos_token_id', 'pad_token_id'].filter((k) => cfg[k] !== undefined && cfg[k] !== null).map((k) => [k, cfg[k]]));
}

/** Write version `v` as a model directory at `out` (absolute). */
export async function exportVersion(v: VersionWeights, out: string, o: ExportVersionOptions): Promise<void> {
  if (existsSync(out) && !o.force) throw new RlstreamError('INPUT_INVALID', `${out} exists; choose another directory or pass --force to replace it`);
  const sum = await sha256File(v.weightsFile);
  if (sum !== v.checksum) throw new RlstreamError('WEIGHTS_FORMAT', `${v.weightsFile}: sha256 ${sum} is not version ${v.version}'s ${v.checksum}: the file was changed or damaged; nothing written`);
  parseModelConfig(v.configJson); // the version's config is one rlstream runs (and the directory carries it back)
  if (o.tokenizerDir !== null && !existsSync(join(o.tokenizerDir, 'tokenizer.json'))) throw new RlstreamError('INPUT_INVALID', `tokenizer directory ${o.tokenizerDir} has no tokenizer.json (--tokenizer names another)`);
  await writeHfDir(out, { tensors: readWeights(v.weightsFile) }, {
    configJson: v.configJson,
    dtype: o.dtype,
    ...(o.maxShardBytes !== undefined ? { maxShardBytes: o.maxShardBytes } : {}),
    tokenizerDir: o.tokenizerDir,
    generationConfig: generationConfigFor(v.configJson, o.base),
    force: o.force,
  });
}

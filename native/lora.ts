// LoRA adapters (PEFT's LoRA on the attention and MLP projections): option checking, the adapter tensors' names in
// the native model and in a PEFT adapter directory, and the adapter file a policy version publishes.
import { readFileSync, writeFileSync } from 'node:fs';
import { mkdir, rename, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { RlstreamError } from '../core/errors.ts';
import { parseSafetensors, writeSafetensors, type Tensor } from '../core/weights/safetensors.ts';

/** The projections an adapter can sit on, by their Hugging Face module names (PEFT's target_modules). */
export const LORA_TARGETS = Object.freeze(['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] as const);
export type LoraTarget = (typeof LORA_TARGETS)[number];

/**
 * y = x W^T + (alpha / rank) * (x A^T) B^T on each targeted projection, W frozen; A [rank, in] starts uniform in
 * ±1/sqrt(in) (PEFT's kaiming_uniform(a=sqrt(5))) from `seed`, B [out, rank] at zero.
 */
export interface LoraOptions {
  rank: number;
  alpha: number;
  targets: readonly LoraTarget[];
  /** Dropout on each adapter's input in training calls (backward*), PEFT's lora_dropout; default 0. */
  dropout?: number;
  /** Seed of A's initialisation; default 0. */
  seed?: number;
}

/** The adapter file's metadata `format` (safetensors of the adapter tensors under the model's own names). */
export const LORA_FILE_FORMAT = 'rlstream-lora';

function invalid(msg: string): never {
  throw new RlstreamError('NATIVE_INVALID_ARGUMENT', msg);
}

/** Checks the options, naming the field; returns them with targets deduplicated in LORA_TARGETS order. */
export function checkLoraOptions(o: unknown, where: string): Required<LoraOptions> {
  if (typeof o !== 'object' || o === null) invalid(`${where}: lora must be an object { rank, alpha, targets }`);
  const r = o as Record<string, unknown>;
  const rank = r.rank;
  if (typeof rank !== 'number' || !Number.isInteger(rank) || rank < 1 || rank > 4096) invalid(`${where}: lora.rank must be an integer in [1, 4096], got ${String(rank)}`);
  const alpha = r.alpha;
  if (typeof alpha !== 'number' || !Number.isFinite(alpha) || alpha <= 0) invalid(`${where}: lora.alpha must be a positive number, got ${String(alpha)}`);
  const dropout = r.dropout ?? 0;
  if (typeof dropout !== 'number' || !(dropout >= 0 && dropout < 1)) invalid(`${where}: lora.dropout must be a number in [0, 1), got ${String(dropout)}`);
  const seed = r.seed ?? 0;
  if (typeof seed !== 'number' || !Number.isInteger(seed)) invalid(`${where}: lora.seed must be an integer, got ${String(seed)}`);
  if (!Array.isArray(r.targets) || r.targets.length === 0) invalid(`${where}: lora.targets must be a non-empty array of ${LORA_TARGETS.join(', ')}`);
  for (const [i, t] of r.targets.entries())
    if (!LORA_TARGETS.includes(t as LoraTarget)) invalid(`${where}: lora.targets[${i}] must be one of ${LORA_TARGETS.join(', ')}, got ${JSON.stringify(t)}`);
  const targets = LORA_TARGETS.filter((t) => (r.targets as unknown[]).includes(t));
  return { rank, alpha, targets, dropout, seed };
}

/** Whether a tensor name (the model's own) is an adapter's. */
export function isAdapterTensor(name: string): boolean {
  return /\.lora_[AB]\.weight$/.test(name);
}

/** The layer, target and matrix of an adapter tensor name, `model.layers.<l>.<self_attn|mlp>.<target>.lora_<A|B>.weight`. */
export function parseAdapterName(name: string): { layer: number; target: LoraTarget; matrix: 'A' | 'B' } | null {
  const m = /^model\.layers\.(\d+)\.(?:self_attn|mlp)\.([a-z_]+)\.lora_([AB])\.weight$/.exec(name);
  if (!m || !LORA_TARGETS.includes(m[2] as LoraTarget)) return null;
  return { layer: Number(m[1]), target: m[2] as LoraTarget, matrix: m[3] as 'A' | 'B' };
}

/** PEFT's name of an adapter tensor in adapter_model.safetensors (the model's own name under `base_model.model.`). */
export function peftTensorName(name: string): string {
  return `base_model.model.${name}`;
}

/** The adapter file's metadata (strings, as safetensors metadata is). */
export function loraMetadata(o: Required<LoraOptions>): Record<string, string> {
  return { format: LORA_FILE_FORMAT, rank: String(o.rank), alpha: String(o.alpha), targets: o.targets.join(','), dropout: String(o.dropout) };
}

/** Reads the options back from an adapter file's metadata; throws WEIGHTS_FORMAT naming the file and field. */
export function loraFromMetadata(meta: Record<string, string>, path: string): Required<LoraOptions> {
  if (meta.format !== LORA_FILE_FORMAT) throw new RlstreamError('WEIGHTS_FORMAT', `${path}: not an adapter file (metadata format ${JSON.stringify(meta.format)}, want ${LORA_FILE_FORMAT})`);
  try {
    return checkLoraOptions({ rank: Number(meta.rank), alpha: Number(meta.alpha), targets: (meta.targets ?? '').split(','), dropout: Number(meta.dropout ?? '0') }, path);
  } catch (err) {
    throw new RlstreamError('WEIGHTS_FORMAT', (err as Error).message, { cause: err });
  }
}

/** PEFT's adapter_config.json for these options (a LoRA adapter over `baseModel`). */
export function peftAdapterConfig(o: Required<LoraOptions>, baseModel: string | null): Record<string, unknown> {
  return {
    peft_type: 'LORA',
    task_type: 'CAUSAL_LM',
    base_model_name_or_path: baseModel,
    r: o.rank,
    lora_alpha: o.alpha,
    lora_dropout: o.dropout,
    target_modules: [...o.targets],
    bias: 'none',
    fan_in_fan_out: false,
    use_rslora: false,
    use_dora: false,
    init_lora_weights: true,
    inference_mode: true,
    modules_to_save: null,
  };
}

/**
 * A PEFT LoRA adapter directory from an adapter file of a policy version: adapter_config.json and
 * adapter_model.safetensors (tensors `base_model.model.<name>`, float32), written aside and renamed into `out`.
 */
export async function writePeftAdapterDir(out: string, adapterFile: string, baseModel: string | null, force: boolean): Promise<Record<string, unknown> & { r: number; lora_alpha: number; target_modules: string[]; base_model_name_or_path: string | null }> {
  const { tensors, metadata } = parseSafetensors(readFileSync(adapterFile), adapterFile);
  const lora = loraFromMetadata(metadata, adapterFile);
  const renamed: [string, Tensor][] = [];
  for (const [name, t] of tensors) {
    if (!parseAdapterName(name)) throw new RlstreamError('WEIGHTS_FORMAT', `${adapterFile}: unexpected tensor ${name} in an adapter file`);
    renamed.push([peftTensorName(name), t]);
  }
  const cfg = peftAdapterConfig(lora, baseModel) as Record<string, unknown> & { r: number; lora_alpha: number; target_modules: string[]; base_model_name_or_path: string | null };
  const tmp = `${out}.tmp-${process.pid}`;
  await rm(tmp, { recursive: true, force: true });
  await mkdir(tmp, { recursive: true });
  await writeSafetensors(join(tmp, 'adapter_model.safetensors'), renamed, { format: 'pt' });
  writeFileSync(join(tmp, 'adapter_config.json'), JSON.stringify(cfg, null, 2) + '\n');
  if (force) await rm(out, { recursive: true, force: true });
  await rename(tmp, out);
  return cfg;
}

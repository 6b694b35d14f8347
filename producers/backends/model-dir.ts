// A policy version as a Hugging Face model directory (config.json + model.safetensors), which is what
// inference servers load new weights from (SGLang's update_weights_from_disk, vLLM's reload_weights): they
// read every *.safetensors of the directory they are given, and the trainer's weights store keeps all kept
// versions side by side in one directory, so a server needs a directory of its own per version. The weights
// are hard-linked (copied only across file systems), so a version costs no extra disk.
import { existsSync } from 'node:fs';
import { mkdir, readdir, rm } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { writeHfDir } from '../../core/weights/hf-dir.ts';
import { writePeftAdapterDir } from '../../native/lora.ts';
import type { PolicyUpdate } from './types.ts';

const SERVED = 'served';

/**
 * `<weights dir>/served/v<version>/` holding config.json and model.safetensors, written by the one Hugging Face
 * directory writer (core/weights/hf-dir.ts, also `rlstream export`'s); idempotent.
 */
export function versionModelDir(update: PolicyUpdate): Promise<string> {
  const dir = join(dirname(update.weightsPath), SERVED, `v${update.version}`);
  // the servers of one backend take a version at once: one write of its directory, the others wait on it
  let p = writing.get(dir);
  if (!p) {
    p = (async () => {
      if (existsSync(join(dir, 'config.json')) && existsSync(join(dir, 'model.safetensors'))) return dir;
      await mkdir(dirname(dir), { recursive: true });
      await writeHfDir(dir, { file: update.weightsPath }, { configJson: update.configJson, dtype: 'F32', force: true });
      return dir;
    })().finally(() => writing.delete(dir));
    writing.set(dir, p);
  }
  return p;
}
const writing = new Map<string, Promise<string>>();

/** The name a version's adapter is loaded under on an inference server (its LoRA endpoints and requests). */
export function adapterName(version: number): string {
  return `policy-v${version}`;
}

/**
 * A version published as adapters (update.adapter) as a PEFT adapter directory, `<weights dir>/served/lora-v<version>/`
 * (adapter_config.json, adapter_model.safetensors): what vLLM's and SGLang's LoRA loading endpoints read; idempotent.
 */
export function versionAdapterDir(update: PolicyUpdate): Promise<string> {
  if (!update.adapter) throw new Error('versionAdapterDir: the update holds no adapter');
  const file = update.adapter.path;
  const dir = join(dirname(file), SERVED, `lora-v${update.version}`);
  let p = writing.get(dir);
  if (!p) {
    p = (async () => {
      if (existsSync(join(dir, 'adapter_config.json')) && existsSync(join(dir, 'adapter_model.safetensors'))) return dir;
      await mkdir(dirname(dir), { recursive: true });
      await writePeftAdapterDir(dir, file, null, true);
      return dir;
    })().finally(() => writing.delete(dir));
    writing.set(dir, p);
  }
  return p;
}

/** Delete the directories (weights and adapters) of versions older than `version` (no server loads them again). */
export async function pruneVersionModelDirs(update: PolicyUpdate): Promise<void> {
  const root = join(dirname(update.weightsPath), SERVED);
  const names = await readdir(root).catch(() => [] as string[]);
  for (const n of names) {
    const m = /^(?:lora-)?v(\d+)$/.exec(n);
    if (m && Number(m[1]) < update.version) await rm(join(root, n), { recursive: true, force: true });
  }
}

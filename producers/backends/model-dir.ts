// A policy version as a Hugging Face model directory (config.json + model.safetensors), which is what
// inference servers load new weights from (SGLang's update_weights_from_disk, vLLM's reload_weights): they
// read every *.safetensors of the directory they are given, and the trainer's weights store keeps all kept
// versions side by side in one directory, so a server needs a directory of its own per version. The weights
// are hard-linked (copied only across file systems), so a version costs no extra disk.
import { copyFile, link, mkdir, readdir, rm, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import type { PolicyUpdate } from './types.ts';

const SERVED = 'served';

/** `<weights dir>/served/v<version>/` holding config.json and model.safetensors; idempotent. */
export async function versionModelDir(update: PolicyUpdate): Promise<string> {
  const dir = join(dirname(update.weightsPath), SERVED, `v${update.version}`);
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, 'config.json'), update.configJson);
  const target = join(dir, 'model.safetensors');
  try {
    await link(update.weightsPath, target);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EXDEV' || code === 'EPERM') await copyFile(update.weightsPath, target);
    else if (code !== 'EEXIST') throw err;
  }
  return dir;
}

/** Delete the directories of versions older than `version` (no server loads them again). */
export async function pruneVersionModelDirs(update: PolicyUpdate): Promise<void> {
  const root = join(dirname(update.weightsPath), SERVED);
  const names = await readdir(root).catch(() => [] as string[]);
  for (const n of names) {
    const m = /^v(\d+)$/.exec(n);
    if (m && Number(m[1]) < update.version) await rm(join(root, n), { recursive: true, force: true });
  }
}

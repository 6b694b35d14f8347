// Content-addressed weights: a policy version's weights live at <store>/<sha256>.safetensors, so a path
// names its content and every reader can verify what it loads. Retention deletes the files of versions no
// reader can still need; since two versions with the same weights share one file, a file goes only when no
// kept version names its checksum.
import { randomUUID } from 'node:crypto';
import { mkdir, rename, stat, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { sha256File } from '../../core/weights/checksum.ts';

/** Save through `write(tmpPath)`, then move the file to its content address. */
export async function storeWeights(storeDir: string, write: (path: string) => Promise<void>): Promise<{ path: string; checksum: string }> {
  await mkdir(storeDir, { recursive: true });
  const tmp = join(storeDir, `.tmp-${randomUUID()}.safetensors`);
  await write(tmp);
  const checksum = await sha256File(tmp);
  const path = join(storeDir, `${checksum}.safetensors`);
  const exists = await stat(path).then(() => true, () => false);
  if (exists) await unlink(tmp);
  else await rename(tmp, path);
  return { path, checksum };
}

export interface WeightsKeep {
  /** The trainer's newest version. */
  current: number;
  /** trainer.keep_versions: the newest N versions stay. */
  keepVersions: number;
  /** The staleness bound: a sample of a version this close to `current` may still be trained. */
  stalenessBound: number;
  /** Versions named by records read but not yet consumed (their [min, max] policy versions). */
  referenced: readonly (readonly [number, number])[];
}

/**
 * Whether a version's weights must stay. Version 0 always stays: it is the warm start every run of the same
 * init shares, content-addressed to the same file in a shared store.
 */
export function mustKeepVersion(v: number, k: WeightsKeep): boolean {
  if (v === 0 || v > k.current - k.keepVersions || v >= k.current - k.stalenessBound) return true;
  return k.referenced.some(([lo, hi]) => v >= lo && v <= hi);
}

/**
 * Delete the weights of the versions in `versions` (version → checksum) that `keep` lets go, unless a kept
 * version has the same checksum. Deleted versions leave the map. Returns the versions deleted.
 */
export async function pruneWeights(storeDir: string, versions: Map<number, string>, keep: (version: number) => boolean): Promise<number[]> {
  const kept = new Set<string>();
  const gone: number[] = [];
  for (const [v, sum] of versions) {
    if (keep(v)) kept.add(sum);
    else gone.push(v);
  }
  for (const v of gone) {
    const sum = versions.get(v)!;
    versions.delete(v);
    if (kept.has(sum)) continue;
    await unlink(join(storeDir, `${sum}.safetensors`)).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'ENOENT') throw err;
    });
  }
  return gone;
}

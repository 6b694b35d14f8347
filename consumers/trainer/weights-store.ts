// Content-addressed weights: a policy version's weights live at <store>/<sha256>.safetensors, so a path
// names its content and every reader can verify what it loads.
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

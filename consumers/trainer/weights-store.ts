// Content-addressed weights: a policy version's weights live at <store>/<sha256>.safetensors, so a path
// names its content and every reader can verify what it loads.
import { createHash, randomUUID } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { mkdir, rename, stat, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { RlstreamError } from '../../core/errors.ts';

export async function sha256File(path: string): Promise<string> {
  const h = createHash('sha256');
  for await (const chunk of createReadStream(path)) h.update(chunk as Buffer);
  return h.digest('hex');
}

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

export async function verifyWeights(path: string, checksum: string): Promise<void> {
  const actual = await sha256File(path);
  if (actual !== checksum) throw new RlstreamError('WEIGHTS_CHECKSUM', `weights ${path} have sha256 ${actual}, expected ${checksum}`);
}

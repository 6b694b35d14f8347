// The checksum of a weights file: lower-case hex sha256, what a PolicyVersion carries and what a content-addressed
// weights path is named by. Streams, so a large model never sits in memory for it.
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';

export async function sha256File(path: string): Promise<string> {
  const h = createHash('sha256');
  for await (const chunk of createReadStream(path)) h.update(chunk as Buffer);
  return h.digest('hex');
}

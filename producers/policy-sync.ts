// Verifying a PolicyVersion's weights before a backend loads them: weights_uri is a local path or a
// file:// URI, and the file's sha256 must equal the event's checksum.
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { RlstreamError } from '../core/errors.ts';
import { sha256File } from '../core/weights/checksum.ts';
import type { PolicyVersion } from '../schemas/generated/types.ts';
import type { PolicyUpdate } from './backends/types.ts';

export function weightsPath(uri: string): string {
  if (uri.startsWith('file://')) return fileURLToPath(uri);
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(uri)) throw new RlstreamError('WEIGHTS_FORMAT', `weights_uri ${uri}: only local paths and file:// URIs are supported`);
  return uri;
}

/** The PolicyUpdate for a backend, after checking the file's sha256; throws WEIGHTS_CHECKSUM if it differs. */
export async function verifyPolicyVersion(pv: PolicyVersion): Promise<PolicyUpdate> {
  const path = weightsPath(pv.weights_uri);
  if (!existsSync(path)) throw new RlstreamError('WEIGHTS_FORMAT', `policy version ${pv.version}: weights file not found: ${path} (the trainer deletes the weights of old versions: trainer.keep_versions)`);
  const actual = await sha256File(path);
  if (actual !== pv.checksum.toLowerCase()) {
    throw new RlstreamError('WEIGHTS_CHECKSUM', `policy version ${pv.version}: sha256 of ${path} is ${actual}, the event says ${pv.checksum}`);
  }
  return { version: pv.version, weightsPath: path, configJson: pv.config_json };
}

// Verifying a PolicyVersion's weights before a backend loads them: weights_uri is a local path or a
// file:// URI, and the file's sha256 must equal the event's checksum.
import { existsSync, statSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { RlstreamError } from '../core/errors.ts';
import { sha256File } from '../core/weights/checksum.ts';
import { openWeights } from '../core/weights/hf-dir.ts';
import { LORA_FILE_FORMAT } from '../native/lora.ts';
import type { PolicyVersion } from '../schemas/generated/types.ts';
import type { PolicyUpdate } from './backends/types.ts';

export function weightsPath(uri: string): string {
  if (uri.startsWith('file://')) return fileURLToPath(uri);
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(uri)) throw new RlstreamError('WEIGHTS_FORMAT', `weights_uri ${uri}: only local paths and file:// URIs are supported`);
  return uri;
}

/** The PolicyUpdate for a backend, after checking the file's sha256; throws WEIGHTS_CHECKSUM if it differs. */
export async function verifyPolicyVersion(pv: PolicyVersion): Promise<PolicyUpdate> {
  const path = await verified(pv.policy_version, pv.weights_uri, pv.checksum, 'weights');
  if (pv.format !== LORA_FILE_FORMAT) return { version: pv.policy_version, weightsPath: path, configJson: pv.config_json };
  // Adapters (trainer.lora): their file names the weights they sit on, checked as the version's own file is.
  const w = openWeights(path);
  let meta: Record<string, string>;
  try {
    meta = w.metadata;
  } finally {
    w.close();
  }
  if (!meta.base_uri || !meta.base_checksum) throw new RlstreamError('WEIGHTS_FORMAT', `policy version ${pv.policy_version}: adapter file ${path} names no base weights (metadata base_uri, base_checksum)`);
  const base = await verified(pv.policy_version, meta.base_uri, meta.base_checksum, 'base weights');
  return { version: pv.policy_version, weightsPath: path, configJson: pv.config_json, adapter: { path, baseWeightsPath: base } };
}

// The base weights verified in this process: the base of every adapter version is the same (large) file, hashed
// once, as long as it is the same file unchanged. Keyed by path and checksum with the file's identity (device,
// inode, size, mtime and ctime in ns): a base rewritten, replaced or damaged after its first check is hashed again
// (ctime moves on any write or utimes, so a reset mtime does not hide a change).
const verifiedBases = new Map<string, string>();
function fileIdentity(path: string): string {
  const s = statSync(path, { bigint: true });
  return `${s.dev}:${s.ino}:${s.size}:${s.mtimeNs}:${s.ctimeNs}`;
}

async function verified(version: number, uri: string, checksum: string, what: string): Promise<string> {
  const path = weightsPath(uri);
  if (!existsSync(path)) throw new RlstreamError('WEIGHTS_FORMAT', `policy version ${version}: ${what} file not found: ${path} (the trainer deletes the weights of old versions: trainer.keep_versions)`);
  const want = checksum.toLowerCase();
  const identity = what === 'base weights' ? `${want} ${fileIdentity(path)}` : null;
  if (identity !== null && verifiedBases.get(path) === identity) return path;
  const actual = await sha256File(path);
  if (actual !== want) {
    throw new RlstreamError('WEIGHTS_CHECKSUM', `policy version ${version}: sha256 of ${path} is ${actual}, the ${what === 'weights' ? 'event' : 'adapter file'} says ${checksum}`);
  }
  // The identity as it was before hashing: a write during the hash changes ctime, so the next check hashes again.
  if (identity !== null) verifiedBases.set(path, identity);
  return path;
}

// export.every_versions: every N-th policy version the trainer commits, written as a Hugging Face model directory
// (<export.dir>/v<N>, default <run dir>/export/v<N>) by the writer `rlstream export` uses. A directory that exists
// is never overwritten: it is logged and left (a resumed run meets the directories its earlier life wrote). A
// version that fails to write is logged and the run goes on: its weights stay in the run's store for `rlstream
// export --version N` while trainer.keep_versions keeps them.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import type { ExportConfig } from '../config/run-config.ts';
import { describeError, RlstreamError } from '../../core/errors.ts';
import type { Logger } from '../../core/telemetry.ts';
import { sha256File } from '../../core/weights/checksum.ts';
import { exportVersion, type ExportVersionOptions, type VersionWeights } from '../../core/weights/export-version.ts';
import { LORA_FILE_FORMAT, writePeftAdapterDir } from '../../native/lora.ts';
import type { PolicyVersion } from '../../schemas/generated/types.ts';

/** What was written for one version: a model directory, or (a version of a LoRA run) a PEFT adapter directory. */
export type WrittenVersion = { kind: 'model' } | { kind: 'peft-lora'; rank: number; alpha: number; targetModules: string[]; baseModel: string | null };

/**
 * One version written to `out`, as `rlstream export` and export.every_versions write it: a version of a LoRA run
 * (trainer.lora) is its adapters, written as a PEFT adapter directory over the run's base model; any other version
 * a Hugging Face model directory (core/weights/export-version.ts). Either way the weights file is checked against
 * the sha256 its PolicyVersion names before anything is written.
 */
export async function writeVersion(v: VersionWeights & { format: string }, out: string, o: ExportVersionOptions): Promise<WrittenVersion> {
  if (v.format !== LORA_FILE_FORMAT) {
    await exportVersion(v, out, o);
    return { kind: 'model' };
  }
  const sum = await sha256File(v.weightsFile);
  if (sum !== v.checksum) throw new RlstreamError('WEIGHTS_FORMAT', `${v.weightsFile}: sha256 ${sum} is not version ${v.version}'s ${v.checksum}: the file was changed or damaged; nothing written`);
  const cfg = await writePeftAdapterDir(out, v.weightsFile, o.base, o.force ?? false);
  return { kind: 'peft-lora', rank: cfg.r, alpha: cfg.lora_alpha, targetModules: cfg.target_modules, baseModel: cfg.base_model_name_or_path };
}

export interface VersionExportResult {
  version: number;
  dir: string;
  outcome: 'written' | 'exists' | 'failed';
}

/** The trainer's onVersion for export.every_versions, or null when the config asks for none. */
export function versionExporter(
  config: ExportConfig,
  runDir: string,
  model: { tokenizerDir: string | null; base: string | null },
  logger: Logger,
  onResult?: (r: VersionExportResult) => void,
): ((pv: PolicyVersion) => Promise<void>) | null {
  const every = config.everyVersions;
  if (every === null) return null;
  const root = config.dir ?? join(runDir, 'export');
  return async (pv) => {
    if (pv.policy_version === 0 || pv.policy_version % every !== 0) return;
    const dir = join(root, `v${pv.policy_version}`);
    const done = (outcome: VersionExportResult['outcome']) => onResult?.({ version: pv.policy_version, dir, outcome });
    if (existsSync(dir)) {
      logger.warn('export: directory exists, not overwritten', { version: pv.policy_version, dir });
      return done('exists');
    }
    const started = Date.now();
    try {
      await writeVersion({ version: pv.policy_version, checksum: pv.checksum, configJson: pv.config_json, weightsFile: pv.weights_uri, format: pv.format }, dir, {
        dtype: config.dtype,
        maxShardBytes: config.maxShardBytes,
        tokenizerDir: model.tokenizerDir,
        base: model.base,
        force: false,
      });
    } catch (err) {
      logger.error('export: version not written', { version: pv.policy_version, dir, error: describeError(err) });
      return done('failed');
    }
    logger.info('export: version written', { version: pv.policy_version, dir, seconds: (Date.now() - started) / 1000 });
    done('written');
  };
}

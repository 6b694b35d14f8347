// export.every_versions: every N-th policy version the trainer commits, written as a Hugging Face model directory
// (<export.dir>/v<N>, default <run dir>/export/v<N>) by the writer `rlstream export` uses. A directory that exists
// is never overwritten: it is logged and left (a resumed run meets the directories its earlier life wrote). A
// version that fails to write is logged and the run goes on: its weights stay in the run's store for `rlstream
// export --version N` while trainer.keep_versions keeps them.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import type { ExportConfig } from '../config/run-config.ts';
import { describeError } from '../../core/errors.ts';
import type { Logger } from '../../core/telemetry.ts';
import { exportVersion } from '../../core/weights/export-version.ts';
import type { PolicyVersion } from '../../schemas/generated/types.ts';

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
    if (pv.version === 0 || pv.version % every !== 0) return;
    const dir = join(root, `v${pv.version}`);
    const done = (outcome: VersionExportResult['outcome']) => onResult?.({ version: pv.version, dir, outcome });
    if (existsSync(dir)) {
      logger.warn('export: directory exists, not overwritten', { version: pv.version, dir });
      return done('exists');
    }
    const started = Date.now();
    try {
      await exportVersion({ version: pv.version, checksum: pv.checksum, configJson: pv.config_json, weightsFile: pv.weights_uri }, dir, {
        dtype: config.dtype,
        maxShardBytes: config.maxShardBytes,
        tokenizerDir: model.tokenizerDir,
        base: model.base,
        force: false,
      });
    } catch (err) {
      logger.error('export: version not written', { version: pv.version, dir, error: describeError(err) });
      return done('failed');
    }
    logger.info('export: version written', { version: pv.version, dir, seconds: (Date.now() - started) / 1000 });
    done('written');
  };
}

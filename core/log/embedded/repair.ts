// Explicit recovery of a damaged embedded log (`rlstream log repair`), and its read-only check (`rlstream log
// check`). Repair opens the log with every damage quarantined instead of refused: damaged frames and frames that
// cannot be re-synchronised move to quarantine files, missing segments become listed gaps, damaged journal
// entries and checkpoints are set aside, meta.json is rewritten from the partition directories. Nothing that is
// intact is dropped; what was lost is reported.
import { type Logger, silentLogger } from '../../telemetry.ts';
import { type DamageReport, EmbeddedLog } from './index.ts';

export async function repairLog(dir: string, logger: Logger = silentLogger): Promise<DamageReport> {
  const log = EmbeddedLog.open({ dir, repair: true }, logger);
  try {
    return log.damageReport();
  } finally {
    await log.close();
  }
}

/**
 * The damage a log lists and what a check of every record's frame finds now, without writing anything; fails
 * as a read-only open fails (a missing or damaged journal, checkpoint or meta.json).
 */
export async function checkLog(dir: string, logger: Logger = silentLogger): Promise<DamageReport> {
  const log = EmbeddedLog.open({ dir, readOnly: true, verify: true }, logger);
  try {
    return log.damageReport();
  } finally {
    await log.close();
  }
}

// Options of the embedded log, each with its default, compiled once into a frozen, fully specified object.
import { RlstreamError } from '../../errors.ts';

export type FsyncPolicy = 'always' | 'transaction' | 'none';

export interface EmbeddedLogOptions {
  /** Directory holding the log (created if missing). */
  dir: string;
  /**
   * When data is forced to disk. 'always': after every send, offset commit and transaction. 'transaction'
   * (default): a transaction's journal entry (its records and offsets) is fsynced at commit; plain sends and
   * offset commits reach the OS at once (they survive a process crash) and the disk when a segment rolls, the
   * journal is checkpointed or fsynced for a transaction, or the log closes, like Kafka's default of leaving
   * flushes to the OS: an fsync per send would cost the hot path a disk round trip each. 'none': never fsync
   * records or offsets (files and directories created are still fsynced: topics, segments, checkpoints).
   */
  fsync?: FsyncPolicy;
  /** A segment rolls when the next record would take it past this size (default 64 MiB). */
  segmentBytes?: number;
  /** Bytes between sparse index entries (default 4 KiB). */
  indexIntervalBytes?: number;
  /** Largest record accepted (key + value + headers; default 16 MiB) → LOG_RECORD_TOO_LARGE. */
  maxRecordBytes?: number;
  /** The journal is checkpointed once it grows past this size (default 64 MiB). */
  journalMaxBytes?: number;
  /** How often retention runs besides segment rolls, in ms (default 60 s; 0 = only on roll and open). */
  retentionCheckMs?: number;
  /**
   * Open to read only (default false): no lock is taken and nothing in the directory is written, created or
   * deleted (a torn tail is ignored in memory, retention does not run); sends, commits and createTopic of a new
   * topic fail with LOG_READ_ONLY. Damaged records and missing segments are read around in memory and reported
   * (damageReport, warnings) instead of quarantined; a missing or damaged journal, checkpoint or meta.json still
   * fails the open. For readers of a log they do not own (replay, `rlstream log check`), also while a writer runs.
   */
  readOnly?: boolean;
  /**
   * Quarantine every damage found instead of refusing to open (default false): segments missing, frames that
   * cannot be re-synchronised, damaged journal entries, checkpoint or meta.json. What `rlstream log repair` does.
   */
  repair?: boolean;
  /**
   * Check every record's frame on open (default false; repair always does): sealed segments are otherwise
   * trusted on their indexes and their damage found only when read. Reads the whole log. `rlstream log check`.
   */
  verify?: boolean;
}

export type CompiledEmbeddedLogOptions = Readonly<Required<EmbeddedLogOptions>>;

function positiveInt(name: string, value: number | undefined, fallback: number, min = 1): number {
  const v = value ?? fallback;
  if (!Number.isInteger(v) || v < min) throw new RlstreamError('CONFIG_INVALID', `embedded log option ${name} must be an integer >= ${min}, got ${String(value)}`);
  return v;
}

function flag(name: string, value: boolean | undefined): boolean {
  if (value !== undefined && typeof value !== 'boolean') throw new RlstreamError('CONFIG_INVALID', `embedded log option ${name} must be true or false, got ${String(value)}`);
  return value ?? false;
}

export function compileEmbeddedLogOptions(o: EmbeddedLogOptions): CompiledEmbeddedLogOptions {
  if (typeof o.dir !== 'string' || o.dir === '') throw new RlstreamError('CONFIG_INVALID', 'embedded log option dir must be a non-empty path');
  const fsync = o.fsync ?? 'transaction';
  if (!['always', 'transaction', 'none'].includes(fsync)) throw new RlstreamError('CONFIG_INVALID', `embedded log option fsync must be always, transaction or none, got ${String(fsync)}`);
  if (o.readOnly === true && o.repair === true) throw new RlstreamError('CONFIG_INVALID', 'embedded log options readOnly and repair exclude each other: repair writes');
  return Object.freeze({
    dir: o.dir,
    fsync,
    segmentBytes: positiveInt('segmentBytes', o.segmentBytes, 64 * 1024 * 1024, 1024),
    indexIntervalBytes: positiveInt('indexIntervalBytes', o.indexIntervalBytes, 4096),
    maxRecordBytes: positiveInt('maxRecordBytes', o.maxRecordBytes, 16 * 1024 * 1024),
    journalMaxBytes: positiveInt('journalMaxBytes', o.journalMaxBytes, 64 * 1024 * 1024, 1024),
    retentionCheckMs: positiveInt('retentionCheckMs', o.retentionCheckMs, 60_000, 0),
    readOnly: flag('readOnly', o.readOnly),
    repair: flag('repair', o.repair),
    verify: flag('verify', o.verify),
  });
}

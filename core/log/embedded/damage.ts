// Damage of the embedded log's files found on open: what it is, where, and what became of it. A partition's
// damage ledger (damage.json in its directory) lists every offset range lost to damage, with the quarantine
// file that holds the bytes; it is both the report (EmbeddedLog.damage(), `rlstream log repair`) and the
// acknowledgement that lets a later open accept the gap instead of failing again. Readers skip a gap and count
// it. Files that hold state (meta.json, checkpoint.json, damage.json) fail with an error naming the file.
import { closeSync, existsSync, fsyncSync, lstatSync, openSync, readFileSync, renameSync, unlinkSync, writeSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { RlstreamError } from '../../errors.ts';

/** One offset range lost to damage in a partition. */
export interface DamageRecord {
  topic: string;
  partition: number;
  /** First lost offset. */
  fromOffset: number;
  /** First offset after the loss; null when the loss runs to the partition's end (nothing after it survived). */
  toOffset: number | null;
  /** Damaged bytes moved out of the segment (0 for a missing file). */
  bytes: number;
  /** The file the damage was found in. */
  file: string;
  /** Where the damaged bytes are kept, relative to the partition directory; null when there were none. */
  quarantine: string | null;
  reason: string;
  /** When it was found (ms since the epoch). */
  foundMs: number;
}

const LEDGER_FILE = 'damage.json';

/** The command that quarantines damage explicitly, for error messages. */
export function repairCommand(logDir: string): string {
  return `rlstream log repair ${/[\s"'$`\\]/.test(logDir) ? JSON.stringify(logDir) : logDir}`;
}

/** LOG_CORRUPT naming the file, what is wrong, and how to repair it. */
export function corruptError(logDir: string, file: string, what: string, repairDoes: string, cause?: unknown): RlstreamError {
  return new RlstreamError('LOG_CORRUPT', `${file}: ${what}. Run \`${repairCommand(logDir)}\` to ${repairDoes}`, cause === undefined ? {} : { cause });
}

/** What a path is on disk: a regular file, a directory, something else (a link, a socket, …), or nothing. */
export type FileKind = 'file' | 'directory' | 'other' | 'missing';

export function fileKind(path: string): FileKind {
  try {
    const st = lstatSync(path);
    return st.isFile() ? 'file' : st.isDirectory() ? 'directory' : 'other';
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT' || (err as NodeJS.ErrnoException).code === 'ENOTDIR') return 'missing';
    throw err;
  }
}

/** Where repair moves a path of the wrong type, out of the way of the log's own names. */
export function asideName(path: string): string {
  return `${path}.quarantine`;
}

/**
 * LOG_CORRUPT for a path of the wrong type (a directory where a segment file belongs, a file where a partition
 * directory belongs), instead of the raw EISDIR/ENOTDIR an open would otherwise meet; null when it is right.
 */
export function wrongKindError(logDir: string, path: string, want: 'file' | 'directory'): RlstreamError | null {
  const kind = fileKind(path);
  if (kind === want || kind === 'missing') return null;
  const found = kind === 'other' ? 'neither a file nor a directory' : `a ${kind}`;
  return corruptError(logDir, path, `is ${found} where the log keeps a ${want}`, `move it aside to ${asideName(path)}`);
}

/** A JSON state file, or LOG_CORRUPT naming it (never a bare SyntaxError). */
export function readJsonFile(logDir: string, file: string, repairDoes: string): unknown {
  const wrong = wrongKindError(logDir, file, 'file');
  if (wrong) throw wrong;
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw corruptError(logDir, file, `cannot be read (${(err as NodeJS.ErrnoException).code ?? String(err)})`, repairDoes, err);
  }
  try {
    return JSON.parse(text) as unknown;
  } catch (err) {
    throw corruptError(logDir, file, `is not valid JSON (${(err as Error).message})`, repairDoes, err);
  }
}

/** fsync a directory, so that files created, renamed or deleted in it survive a machine crash. */
export function fsyncDir(dir: string): void {
  const fd = openSync(dir, 'r');
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** Delete a file; one already gone is fine. */
export function unlinkIfThere(path: string): void {
  try {
    unlinkSync(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
}

/** Write a file whole and durably: temporary file, fsync, rename, fsync of the directory. */
export function writeFileDurably(path: string, data: string | Buffer): void {
  const tmp = `${path}.tmp`;
  const fd = openSync(tmp, 'w');
  try {
    writeSync(fd, typeof data === 'string' ? Buffer.from(data) : data);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, path);
  fsyncDir(dirname(path));
}

function isDamageRecord(x: unknown): x is DamageRecord {
  if (typeof x !== 'object' || x === null) return false;
  const r = x as Record<string, unknown>;
  return typeof r['fromOffset'] === 'number' && (r['toOffset'] === null || typeof r['toOffset'] === 'number') && typeof r['reason'] === 'string';
}

/** A partition's damage ledger: the gaps it has accepted. */
export class DamageLedger {
  readonly records: DamageRecord[];

  private constructor(
    private readonly partitionDir: string,
    records: DamageRecord[],
  ) {
    this.records = records;
  }

  static load(logDir: string, partitionDir: string, repair: boolean): DamageLedger {
    const path = join(partitionDir, LEDGER_FILE);
    if (!existsSync(path)) return new DamageLedger(partitionDir, []);
    try {
      const parsed = readJsonFile(logDir, path, 'rewrite it from the damage found again');
      if (!Array.isArray(parsed) || !parsed.every(isDamageRecord)) {
        throw corruptError(logDir, path, 'is not a list of damage records', 'rewrite it from the damage found again');
      }
      return new DamageLedger(partitionDir, parsed);
    } catch (err) {
      // Repair forgets a damaged ledger: the damage it listed is found again (gaps between segments, missing
      // files) and listed anew; quarantine files stay where they are.
      if (repair) return new DamageLedger(partitionDir, []);
      throw err;
    }
  }

  /** Whether offsets [from, to) are a gap the ledger accounts for. */
  covers(from: number, to: number): boolean {
    // Gaps recorded one after another may cover a range together.
    let at = from;
    for (const r of [...this.records].sort((a, b) => a.fromOffset - b.fromOffset)) {
      if (r.fromOffset > at) break;
      if (r.toOffset === null) return true;
      at = Math.max(at, r.toOffset);
      if (at >= to) return true;
    }
    return at >= to;
  }

  /** Add records (once each: the same range found again after a crash is not listed twice) and save durably. */
  add(records: DamageRecord[]): void {
    for (const r of records) {
      if (!this.records.some((o) => o.fromOffset === r.fromOffset && o.file === r.file && o.reason === r.reason)) this.records.push(r);
    }
    writeFileDurably(join(this.partitionDir, LEDGER_FILE), JSON.stringify(this.records, null, 1));
  }
}

// One segment of a partition: an append-only .log file of records plus two sparse indexes, .index
// (relative offset → file position) and .timeindex (largest timestamp so far → relative offset). The indexes
// are kept in memory and appended to their files; they are hints that can always be rebuilt from the .log,
// which is what recovery does for the active segment and for any index that fails its sanity check.
// Recovery tells two failures apart: a torn tail (the active segment's last write, cut short by a crash: no
// valid frame follows the damage) is cut off; damage with valid frames after it is found again by scanning for
// the next frame whose header and CRC verify, and the damaged bytes are moved to a quarantine file, leaving the
// records after them at their offsets (the lost range becomes a gap, listed in the partition's damage ledger).
import { closeSync, existsSync, fstatSync, fsyncSync, ftruncateSync, openSync, readFileSync, readSync, unlinkSync, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';
import { RlstreamError } from '../../errors.ts';
import type { Logger } from '../../telemetry.ts';
import { crc32Combine } from './crc32-combine.ts';
import { corruptError, fsyncDir, writeFileDurably } from './damage.ts';
import { type EncodedBatch, FRAME, findNextFrame, frameProblem, peekOffset, peekTimestamp, recordSizeAt, validFrames } from './record-format.ts';

export interface SegmentConfig {
  indexIntervalBytes: number;
  maxBodyBytes: number;
  /** The log's directory, for error messages that give the repair command. */
  logDir: string;
  /** Open files read-only and never write: torn tails are ignored in memory, indexes rebuilt in memory only. */
  readOnly: boolean;
}

/** A damaged byte range of a segment found on open. */
export interface SegmentDamage {
  /** File positions [pos, end) of the damaged bytes. */
  pos: number;
  end: number;
  /** First lost offset, and the offset of the first valid record after the damage (null: none in this segment). */
  fromOffset: number;
  toOffset: number | null;
  problem: string;
}

const SCAN_CHUNK = 4 * 1024 * 1024;
/** Largest read of one Segment.read call; a poll wanting more reads again (see Partition.read). */
/** The most a read takes in one call (a record larger than this is read alone, at its size). */
export const READ_CHUNK = 1024 * 1024;

export function segmentFileName(base: number, ext: string): string {
  return `${String(base).padStart(20, '0')}${ext}`;
}

export class Segment {
  size = 0;
  next: number;
  maxTimestamp = -Infinity;
  private readonly idxRel: number[] = [];
  private readonly idxPos: number[] = [];
  private readonly timeTs: number[] = [];
  private readonly timeRel: number[] = [];
  private lastIndexedPos = -Infinity;
  private lastTimePos = -Infinity;
  private fd: number;
  private indexFd: number;
  private timeFd: number;
  dirty = false;
  /** Damage found by the last rebuild, not yet quarantined (see quarantine()). */
  damage: SegmentDamage[] = [];
  /** Damaged byte ranges left in place (a read-only open cannot move them), in file order: reads step over them. */
  private holes: { pos: number; end: number }[] = [];
  /**
   * CRC-32 of the file's bytes [0, size), kept up to date by appends (combined from each batch's own CRC, so no
   * byte is read twice); null when not known (a segment opened from disk), computed on demand by crcNow().
   */
  crc: number | null = null;

  private constructor(
    readonly dir: string,
    readonly base: number,
    private readonly config: SegmentConfig,
    withFile = true,
  ) {
    this.next = base;
    this.fd = !withFile ? -1 : openSync(this.path('.log'), config.readOnly ? 'r' : existsSync(this.path('.log')) ? 'r+' : 'w+');
    this.indexFd = -1;
    this.timeFd = -1;
  }

  path(ext: string): string {
    return join(this.dir, segmentFileName(this.base, ext));
  }

  static create(dir: string, base: number, config: SegmentConfig): Segment {
    // A read-only log never creates files: an empty partition has an empty segment in memory.
    if (config.readOnly) return new Segment(dir, base, config, false);
    const s = new Segment(dir, base, config);
    s.crc = 0;
    s.indexFd = openSync(s.path('.index'), 'w+');
    s.timeFd = openSync(s.path('.timeindex'), 'w+');
    // The new files' names must survive a machine crash along with the records later fsynced into them.
    fsyncDir(dir);
    return s;
  }

  /**
   * Open an existing segment. The active (last) segment is always scanned: records after the last whole,
   * CRC-valid one are a torn tail and are cut off. A sealed segment trusts its indexes when they are sane and
   * end with an entry for its last record; otherwise it is rescanned. Damage with valid frames after it is left
   * in `damage` for the partition to quarantine (or refuse); a sealed segment's damage that runs to its end is
   * listed too, with toOffset null. `full` rescans a sealed segment even with sane indexes (repair).
   * `tornTailFrom`: in the active segment, only damage at or after this offset can be a torn tail (records the
   * log's manifest does not list, written after its last entry); damage before it is damage to the end.
   */
  static open(dir: string, base: number, config: SegmentConfig, active: boolean, logger: Logger, full = false, tornTailFrom = 0): Segment {
    const s = new Segment(dir, base, config);
    s.size = fstatSync(s.fd).size;
    s.tornTailFrom = tornTailFrom;
    if (!active && !full && s.loadIndexes()) {
      if (!config.readOnly) {
        s.indexFd = openSync(s.path('.index'), 'r+');
        s.timeFd = openSync(s.path('.timeindex'), 'r+');
      }
      return s;
    }
    s.rebuild(active, logger);
    return s;
  }

  /** Load sealed indexes; false when they are missing or inconsistent with the .log. */
  private loadIndexes(): boolean {
    let idx: Buffer, time: Buffer;
    try {
      idx = readFileSync(this.path('.index'));
      time = readFileSync(this.path('.timeindex'));
    } catch {
      return false;
    }
    if (idx.length % 8 !== 0 || time.length % 12 !== 0 || idx.length === 0 || time.length === 0) return false;
    for (let p = 0; p < idx.length; p += 8) {
      const rel = idx.readUInt32BE(p);
      const pos = idx.readUInt32BE(p + 4);
      const n = this.idxRel.length;
      if (pos >= this.size || (n > 0 && (rel <= this.idxRel[n - 1]! || pos <= this.idxPos[n - 1]!))) return false;
      this.idxRel.push(rel);
      this.idxPos.push(pos);
    }
    for (let p = 0; p < time.length; p += 12) {
      this.timeTs.push(time.readDoubleBE(p));
      this.timeRel.push(time.readUInt32BE(p + 8));
    }
    // Count the records after the last offset-index entry to learn the next offset; the final time entry
    // (written when the segment was sealed) must name the last record, else maxTimestamp may be stale.
    let lastRel = -1;
    const tail = this.scan(this.idxPos[this.idxPos.length - 1]!, (buf, pos) => {
      lastRel = peekOffset(buf, pos) - this.base;
      this.maxTimestamp = Math.max(this.maxTimestamp, peekTimestamp(buf, pos));
    });
    if (tail.problem || tail.end !== this.size || lastRel < 0) return false;
    if (this.timeRel[this.timeRel.length - 1] !== lastRel) return false;
    this.maxTimestamp = Math.max(this.maxTimestamp, ...this.timeTs.slice(-1));
    this.next = this.base + lastRel + 1;
    this.lastIndexedPos = this.idxPos[this.idxPos.length - 1]!;
    return true;
  }

  /**
   * Rescan the whole .log, rebuilding both indexes. Offsets may jump forward (a gap left by earlier
   * quarantine); a frame that fails its checks, or whose offset goes backwards, is damage: the scan resumes at
   * the next frame that verifies and the range is listed in `damage`. Damage with no valid frame after it is a
   * torn tail in the active segment (cut off, or ignored read-only) and damage to the end in a sealed one.
   */
  private tornTailFrom = 0;

  private rebuild(active: boolean, logger: Logger): void {
    this.crc = null;
    this.idxRel.length = this.idxPos.length = this.timeTs.length = this.timeRel.length = 0;
    this.lastIndexedPos = this.lastTimePos = -Infinity;
    this.maxTimestamp = -Infinity;
    this.damage = [];
    const fileSize = this.size;
    let expected = this.base;
    let from = 0;
    let whole: Buffer | null = null;
    let end = fileSize;
    for (;;) {
      let backwards = false;
      const res = this.scan(from, (buf, pos, filePos) => {
        const offset = peekOffset(buf, pos);
        if (offset < expected) {
          backwards = true;
          return false;
        }
        this.track(offset - this.base, filePos, peekTimestamp(buf, pos));
        expected = offset + 1;
        return true;
      });
      const problem = res.problem ?? (backwards ? 'offset out of sequence' : null);
      if (problem === null) break;
      // Damage is rare: look for the next valid frame in the whole file, read once.
      whole ??= this.readAll(fileSize);
      const next = findNextFrame(whole, res.end + 1, res.end, expected, this.config.maxBodyBytes);
      if (next < 0 && active && expected >= this.tornTailFrom) {
        end = res.end;
        if (this.config.readOnly) logger.warn('embedded log: ignoring torn tail (read-only open)', { file: this.path('.log'), at: res.end, bytes: fileSize - res.end, problem });
        else {
          logger.warn('embedded log: truncating torn tail', { file: this.path('.log'), at: res.end, dropped: fileSize - res.end, problem });
          ftruncateSync(this.fd, res.end);
        }
        break;
      }
      this.damage.push({ pos: res.end, end: next < 0 ? fileSize : next, fromOffset: expected, toOffset: next < 0 ? null : peekOffset(whole, next), problem });
      if (next < 0) break;
      from = next;
    }
    this.size = end;
    this.next = expected;
    // Index positions of a damaged file change when the damage is moved out; quarantine() rebuilds them.
    if (this.damage.length === 0) this.writeIndexFiles();
  }

  /** The CRC-32 of the file as it is now (read whole; holes and all). */
  fileCrc(): number {
    const size = fstatSync(this.fd).size;
    const buf = Buffer.allocUnsafe(Math.min(SCAN_CHUNK, size));
    let crc = 0;
    for (let pos = 0; pos < size; ) {
      const got = readSync(this.fd, buf, 0, Math.min(buf.length, size - pos), pos);
      if (got <= 0) break;
      crc = crc32(buf.subarray(0, got), crc);
      pos += got;
    }
    return crc;
  }

  /** The CRC-32 of [0, size), computed once from the file when appends have not kept it. */
  crcNow(): number {
    this.crc ??= this.fileCrc();
    return this.crc;
  }

  /** Leave the damage found in place and step over it when reading (a read-only open). */
  keepDamageAsHoles(): void {
    this.holes = [...this.holes, ...this.damage.map((d) => ({ pos: d.pos, end: d.end }))].sort((a, b) => a.pos - b.pos);
    this.damage = [];
    if (this.holes.length > 0) this.size = Math.max(this.size, this.holes[this.holes.length - 1]!.end);
  }

  /** The first hole that ends after a position (it may start before it), or null. */
  private holeFrom(pos: number): { pos: number; end: number } | null {
    for (const h of this.holes) if (h.end > pos) return h;
    return null;
  }

  /** A read position moved past a hole it stands in. */
  skipHole(pos: number): number {
    if (this.holes.length === 0) return pos;
    const h = this.holeFrom(pos);
    return h && h.pos <= pos ? h.end : pos;
  }

  /** Rescan a sealed segment whole (a read found it damaged); what it finds is left in `damage`. */
  rescan(logger: Logger): void {
    this.size = fstatSync(this.fd).size;
    this.rebuild(false, logger);
  }

  private readAll(size: number): Buffer {
    const buf = Buffer.allocUnsafe(size);
    this.readFully(buf, size, 0);
    return buf;
  }

  /**
   * Move the damaged ranges found on open to quarantine files beside the segment (`<base>-<fromOffset>.quarantine`,
   * written durably first), then rewrite the .log without them (by rename, so a crash leaves either file whole)
   * and rebuild its indexes. `beforeRewrite` runs between the two: the partition records the gaps in its ledger
   * there, so a gap is never on disk unaccounted for. Returns each range with its quarantine file's name.
   */
  quarantine(active: boolean, logger: Logger, beforeRewrite: (moved: { damage: SegmentDamage; file: string }[]) => void): void {
    if (this.damage.length === 0) return;
    const fileSize = fstatSync(this.fd).size;
    const whole = this.readAll(fileSize);
    const moved = this.damage.map((d) => {
      const file = `${segmentFileName(this.base, '')}-${d.fromOffset}.quarantine`;
      writeFileDurably(join(this.dir, file), whole.subarray(d.pos, d.end));
      return { damage: d, file };
    });
    beforeRewrite(moved);
    const kept: Buffer[] = [];
    let at = 0;
    for (const d of this.damage) {
      kept.push(whole.subarray(at, d.pos));
      at = d.end;
    }
    kept.push(whole.subarray(at, fileSize));
    writeFileDurably(this.path('.log'), Buffer.concat(kept));
    closeSync(this.fd);
    this.fd = openSync(this.path('.log'), 'r+');
    this.size = fstatSync(this.fd).size;
    this.rebuild(active, logger);
    if (this.damage.length > 0) throw new RlstreamError('INTERNAL', `${this.path('.log')}: damage remains after quarantine`);
  }

  private writeIndexFiles(): void {
    if (this.config.readOnly) return;
    const idx = Buffer.allocUnsafe(this.idxRel.length * 8);
    this.idxRel.forEach((rel, i) => {
      idx.writeUInt32BE(rel, i * 8);
      idx.writeUInt32BE(this.idxPos[i]!, i * 8 + 4);
    });
    const time = Buffer.allocUnsafe(this.timeTs.length * 12);
    this.timeTs.forEach((ts, i) => {
      time.writeDoubleBE(ts, i * 12);
      time.writeUInt32BE(this.timeRel[i]!, i * 12 + 8);
    });
    if (this.indexFd >= 0) closeSync(this.indexFd);
    if (this.timeFd >= 0) closeSync(this.timeFd);
    writeFileSync(this.path('.index'), idx);
    writeFileSync(this.path('.timeindex'), time);
    this.indexFd = openSync(this.path('.index'), 'r+');
    this.timeFd = openSync(this.path('.timeindex'), 'r+');
  }

  /** Record index entries for a record at filePos; returns whether an entry was added (for file appends). */
  private track(rel: number, filePos: number, ts: number): { idx: boolean; time: boolean } {
    let idx = false;
    let time = false;
    if (filePos - this.lastIndexedPos >= this.config.indexIntervalBytes) {
      this.idxRel.push(rel);
      this.idxPos.push(filePos);
      this.lastIndexedPos = filePos;
      idx = true;
    }
    if (ts > this.maxTimestamp) {
      this.maxTimestamp = ts;
      if (filePos - this.lastTimePos >= this.config.indexIntervalBytes) {
        this.timeTs.push(ts);
        this.timeRel.push(rel);
        this.lastTimePos = filePos;
        time = true;
      }
    }
    return { idx, time };
  }

  /**
   * Walk records from a file position; `visit` sees each whole, CRC-valid record (return false to stop).
   * Returns the position after the last record visited and why the walk stopped early, if it did.
   */
  scan(from: number, visit: (buf: Buffer, pos: number, filePos: number) => boolean | void): { end: number; problem: string | null } {
    let filePos = from;
    let buf = Buffer.allocUnsafe(Math.min(SCAN_CHUNK, Math.max(0, this.size - from)));
    while (filePos < this.size) {
      const hole = this.holes.length === 0 ? null : this.holeFrom(filePos);
      if (hole && hole.pos <= filePos) {
        filePos = hole.end;
        continue;
      }
      const limit = hole ? hole.pos : this.size;
      const want = Math.min(Math.max(buf.length, FRAME), limit - filePos);
      if (buf.length < want) buf = Buffer.allocUnsafe(want);
      const got = readSync(this.fd, buf, 0, want, filePos);
      let pos = 0;
      while (pos < got) {
        // The chunk's frames checked in one call (native CRC when built); frameProblem names what stopped it.
        const valid = validFrames(buf, pos, got, Infinity, this.config.maxBodyBytes).end;
        for (; pos < valid; pos += recordSizeAt(buf, pos)) {
          if (visit(buf, pos, filePos + pos) === false) return { end: filePos + pos, problem: null };
        }
        if (pos >= got) break;
        const problem = frameProblem(buf, pos, got, this.config.maxBodyBytes);
        if (problem) {
          const truncated = problem.startsWith('truncated');
          // A record cut by the chunk boundary: read again from its start (bigger buffer if needed).
          if (truncated && filePos + got < limit) {
            if (pos === 0) buf = Buffer.allocUnsafe(Math.min(limit - filePos, Math.max(buf.length * 2, got - pos >= 4 ? recordSizeAt(buf, pos) : FRAME)));
            break;
          }
          return { end: filePos + pos, problem };
        }
        if (visit(buf, pos, filePos + pos) === false) return { end: filePos + pos, problem: null };
        pos += recordSizeAt(buf, pos);
      }
      filePos += pos;
    }
    return { end: filePos, problem: null };
  }

  /** Append records [from, to) of a batch, which must continue this segment's offsets. */
  append(batch: EncodedBatch, from: number, to: number): void {
    const start = from === 0 ? 0 : batch.ends[from - 1]!;
    const end = batch.ends[to - 1]!;
    if (batch.baseOffset + from !== this.next) throw new RlstreamError('INTERNAL', `append at offset ${batch.baseOffset + from}, segment expects ${this.next}`);
    writeSync(this.fd, batch.buf, start, end - start, this.size);
    if (this.crc !== null) {
      const whole = start === 0 && end === batch.buf.length;
      this.crc = crc32Combine(this.crc, whole ? batch.crc : crc32(batch.buf.subarray(start, end)), end - start);
    }
    const idxEntries: number[] = [];
    const timeEntries: number[] = [];
    for (let i = from; i < to; i++) {
      const filePos = this.size + ((i === 0 ? 0 : batch.ends[i - 1]!) - start);
      const rel = this.next + (i - from) - this.base;
      const added = this.track(rel, filePos, batch.timestamps[i]!);
      if (added.idx) idxEntries.push(rel, filePos);
      if (added.time) timeEntries.push(i);
    }
    this.size += end - start;
    this.next += to - from;
    this.dirty = true;
    if (idxEntries.length > 0) {
      const b = Buffer.allocUnsafe(idxEntries.length * 4);
      idxEntries.forEach((v, i) => b.writeUInt32BE(v, i * 4));
      writeSync(this.indexFd, b, 0, b.length, (this.idxRel.length - idxEntries.length / 2) * 8);
    }
    if (timeEntries.length > 0) this.appendTimeEntries(timeEntries.length);
  }

  private appendTimeEntries(count: number): void {
    const b = Buffer.allocUnsafe(count * 12);
    const first = this.timeTs.length - count;
    for (let i = 0; i < count; i++) {
      b.writeDoubleBE(this.timeTs[first + i]!, i * 12);
      b.writeUInt32BE(this.timeRel[first + i]!, i * 12 + 8);
    }
    writeSync(this.timeFd, b, 0, b.length, first * 12);
  }

  /** Called when the segment stops being active: a final time entry names the last record. */
  seal(): void {
    if (this.next === this.base) return;
    const lastRel = this.next - 1 - this.base;
    if (this.timeRel[this.timeRel.length - 1] !== lastRel) {
      this.timeTs.push(this.maxTimestamp);
      this.timeRel.push(lastRel);
      this.appendTimeEntries(1);
    }
  }

  /** File position of the indexed record at or before an offset (scan forward from there). */
  lookup(offset: number): { offset: number; pos: number } {
    const rel = offset - this.base;
    let lo = 0;
    let hi = this.idxRel.length - 1;
    let best = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (this.idxRel[mid]! <= rel) {
        best = mid;
        lo = mid + 1;
      } else hi = mid - 1;
    }
    return best < 0 ? { offset: this.base, pos: 0 } : { offset: this.base + this.idxRel[best]!, pos: this.idxPos[best]! };
  }

  /** Exact file position of an offset inside this segment. */
  positionOf(offset: number): number {
    if (offset >= this.next) return this.size;
    const start = this.lookup(offset);
    let found = -1;
    const res = this.scan(start.pos, (buf, pos, filePos) => {
      if (peekOffset(buf, pos) >= offset) {
        found = filePos;
        return false;
      }
      return true;
    });
    if (found < 0) throw new RlstreamError('LOG_CORRUPT', `${this.path('.log')}: offset ${offset} not found (${res.problem ?? 'end of segment'})`);
    return found;
  }

  /** First offset in this segment whose timestamp is >= ts, or null when none. */
  offsetForTimestamp(ts: number): number | null {
    if (this.maxTimestamp < ts) return null;
    // The last time entry whose running maximum is still below ts: every record up to it is older.
    let lo = 0;
    let hi = this.timeTs.length - 1;
    let best = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (this.timeTs[mid]! < ts) {
        best = mid;
        lo = mid + 1;
      } else hi = mid - 1;
    }
    const startOffset = best < 0 ? this.base : this.base + this.timeRel[best]! + 1;
    const start = this.lookup(startOffset);
    let found: number | null = null;
    const res = this.scan(start.pos, (buf, pos) => {
      if (peekOffset(buf, pos) >= startOffset && peekTimestamp(buf, pos) >= ts) {
        found = peekOffset(buf, pos);
        return false;
      }
      return true;
    });
    // Stopped by damage before an answer: the records after it may hold one.
    if (found === null && res.problem !== null) {
      throw corruptError(this.config.logDir, this.path('.log'), `${res.problem} at byte ${res.end}`, 'move the damaged bytes to a quarantine file and keep the records after them');
    }
    return found;
  }

  /**
   * Read whole, CRC-checked records from a file position: at most maxRecords, about maxBytes (never more than
   * READ_CHUNK in one call, so a poll does not read and check far more than it returns), but always at least
   * one record. `alloc` gives the buffer to read into (a consumer's recycled one).
   */
  read(pos: number, maxBytes: number, maxRecords = Infinity, alloc: (bytes: number) => Buffer = Buffer.allocUnsafe): Buffer {
    const hole = this.holes.length === 0 ? null : this.holeFrom(pos);
    const limit = hole ? Math.max(pos, hole.pos) : this.size;
    if (pos >= limit) return Buffer.alloc(0);
    let len = Math.min(Math.max(Math.min(maxBytes, READ_CHUNK), 64 * 1024), limit - pos);
    let buf = alloc(len);
    this.readFully(buf, len, pos);
    let p = 0;
    let records = 0;
    while (p < len && records < maxRecords) {
      const valid = validFrames(buf, p, len, maxRecords - records, this.config.maxBodyBytes);
      p = valid.end;
      records += valid.records;
      if (p >= len || records >= maxRecords) break;
      const problem = frameProblem(buf, p, len, this.config.maxBodyBytes);
      if (problem === null) {
        // Not expected (validFrames stopped here), but this check is the reference: the frame is good.
        p += recordSizeAt(buf, p);
        records++;
        continue;
      }
      if (!problem.startsWith('truncated') || pos + len >= limit) {
        throw corruptError(this.config.logDir, this.path('.log'), `${problem} at byte ${pos + p}`, 'move the damaged bytes to a quarantine file and keep the records after them');
      }
      if (p > 0) break;
      // The first record alone is larger than the chunk: read exactly that record.
      len = Math.min(recordSizeAt(buf, 0), limit - pos);
      buf = Buffer.allocUnsafe(len);
      this.readFully(buf, len, pos);
    }
    return p === buf.length ? buf : buf.subarray(0, p);
  }

  /**
   * len bytes from a file position into buf, or LOG_CORRUPT: fewer would leave bytes the frame checks could
   * take for records (a reused read buffer holds earlier, valid frames).
   */
  private readFully(buf: Buffer, len: number, pos: number): void {
    const got = readSync(this.fd, buf, 0, len, pos);
    if (got < len) throw new RlstreamError('LOG_CORRUPT', `${this.path('.log')}: ${len} bytes expected at byte ${pos}, the file has ${got}`);
  }

  /** Drop every record at or after an offset (recovery of a half-applied transaction). */
  truncateTo(offset: number): void {
    const pos = this.positionOf(offset);
    ftruncateSync(this.fd, pos);
    this.crc = null;
    this.size = pos;
    const rel = offset - this.base;
    while (this.idxRel.length > 0 && this.idxRel[this.idxRel.length - 1]! >= rel) {
      this.idxRel.pop();
      this.idxPos.pop();
    }
    while (this.timeRel.length > 0 && this.timeRel[this.timeRel.length - 1]! >= rel) {
      this.timeRel.pop();
      this.timeTs.pop();
    }
    this.next = offset;
    this.maxTimestamp = this.timeTs.length > 0 ? this.timeTs[this.timeTs.length - 1]! : -Infinity;
    // Recompute the exact maximum from the records after the last time entry.
    const from = this.lookup(this.base + (this.timeRel[this.timeRel.length - 1] ?? -1) + 1).pos;
    this.scan(from, (buf, p) => {
      this.maxTimestamp = Math.max(this.maxTimestamp, peekTimestamp(buf, p));
    });
    this.lastIndexedPos = this.idxPos[this.idxPos.length - 1] ?? -Infinity;
    this.lastTimePos = -Infinity;
    this.writeIndexFiles();
  }

  flush(force = false): void {
    if (!this.dirty && !(force && this.fd >= 0)) return;
    fsyncSync(this.fd);
    this.dirty = false;
  }

  close(): void {
    if (this.fd >= 0) closeSync(this.fd);
    if (this.indexFd >= 0) closeSync(this.indexFd);
    if (this.timeFd >= 0) closeSync(this.timeFd);
    this.indexFd = this.timeFd = -1;
  }

  delete(): void {
    if (this.config.readOnly) throw new RlstreamError('LOG_READ_ONLY', `${this.path('.log')}: a read-only log deletes nothing`);
    this.close();
    // Indexes first: a crash in between leaves a whole .log without indexes (rebuilt on open), never indexes
    // without their .log, which an open takes for a missing segment.
    for (const ext of ['.index', '.timeindex', '.log']) {
      try {
        unlinkSync(this.path(ext));
      } catch {
        /* already gone */
      }
    }
  }
}

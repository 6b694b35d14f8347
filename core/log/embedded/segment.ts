// One segment of a partition: an append-only .log file of records plus two sparse indexes, .index
// (relative offset → file position) and .timeindex (largest timestamp so far → relative offset). The indexes
// are kept in memory and appended to their files; they are hints that can always be rebuilt from the .log,
// which is what recovery does for the active segment and for any index that fails its sanity check.
import { closeSync, existsSync, fstatSync, fsyncSync, ftruncateSync, openSync, readFileSync, readSync, unlinkSync, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { RlstreamError } from '../../errors.ts';
import type { Logger } from '../../telemetry.ts';
import { type EncodedBatch, FRAME, frameProblem, peekOffset, peekTimestamp, recordSizeAt, validFrames } from './record-format.ts';

export interface SegmentConfig {
  indexIntervalBytes: number;
  maxBodyBytes: number;
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
  private readonly fd: number;
  private indexFd: number;
  private timeFd: number;
  dirty = false;

  private constructor(
    readonly dir: string,
    readonly base: number,
    private readonly config: SegmentConfig,
  ) {
    this.next = base;
    this.fd = openSync(this.path('.log'), existsSync(this.path('.log')) ? 'r+' : 'w+');
    this.indexFd = -1;
    this.timeFd = -1;
  }

  path(ext: string): string {
    return join(this.dir, segmentFileName(this.base, ext));
  }

  static create(dir: string, base: number, config: SegmentConfig): Segment {
    const s = new Segment(dir, base, config);
    s.indexFd = openSync(s.path('.index'), 'w+');
    s.timeFd = openSync(s.path('.timeindex'), 'w+');
    return s;
  }

  /**
   * Open an existing segment. The active (last) segment is always scanned: records after the last whole,
   * CRC-valid one are a torn tail and are cut off. A sealed segment trusts its indexes when they are sane and
   * end with an entry for its last record; otherwise it is rescanned, and there a bad record is corruption.
   */
  static open(dir: string, base: number, config: SegmentConfig, active: boolean, logger: Logger): Segment {
    const s = new Segment(dir, base, config);
    s.size = fstatSync(s.fd).size;
    if (!active && s.loadIndexes()) {
      s.indexFd = openSync(s.path('.index'), 'r+');
      s.timeFd = openSync(s.path('.timeindex'), 'r+');
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

  /** Rescan the whole .log, rebuilding both indexes; cut a torn tail (active) or fail (sealed). */
  private rebuild(active: boolean, logger: Logger): void {
    this.idxRel.length = this.idxPos.length = this.timeTs.length = this.timeRel.length = 0;
    this.lastIndexedPos = this.lastTimePos = -Infinity;
    this.maxTimestamp = -Infinity;
    let expected = this.base;
    let badOffset = false;
    const res = this.scan(0, (buf, pos, filePos) => {
      const offset = peekOffset(buf, pos);
      if (offset !== expected) {
        badOffset = true;
        return false;
      }
      this.track(offset - this.base, filePos, peekTimestamp(buf, pos));
      expected++;
      return true;
    });
    const problem = res.problem ?? (badOffset ? 'offset out of sequence' : null);
    if (problem) {
      if (!active) throw new RlstreamError('LOG_CORRUPT', `${this.path('.log')}: ${problem} at byte ${res.end}`);
      logger.warn('embedded log: truncating torn tail', { file: this.path('.log'), at: res.end, dropped: this.size - res.end, problem });
      ftruncateSync(this.fd, res.end);
    }
    this.size = res.end;
    this.next = expected;
    this.writeIndexFiles();
  }

  private writeIndexFiles(): void {
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
      const want = Math.min(Math.max(buf.length, FRAME), this.size - filePos);
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
          if (truncated && filePos + got < this.size) {
            if (pos === 0) buf = Buffer.allocUnsafe(Math.min(this.size - filePos, Math.max(buf.length * 2, got - pos >= 4 ? recordSizeAt(buf, pos) : FRAME)));
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
    this.scan(start.pos, (buf, pos) => {
      if (peekOffset(buf, pos) >= startOffset && peekTimestamp(buf, pos) >= ts) {
        found = peekOffset(buf, pos);
        return false;
      }
      return true;
    });
    return found;
  }

  /**
   * Read whole, CRC-checked records from a file position: at most maxRecords, about maxBytes (never more than
   * READ_CHUNK in one call, so a poll does not read and check far more than it returns), but always at least
   * one record. `alloc` gives the buffer to read into (a consumer's recycled one).
   */
  read(pos: number, maxBytes: number, maxRecords = Infinity, alloc: (bytes: number) => Buffer = Buffer.allocUnsafe): Buffer {
    if (pos >= this.size) return Buffer.alloc(0);
    let len = Math.min(Math.max(Math.min(maxBytes, READ_CHUNK), 64 * 1024), this.size - pos);
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
      if (!problem.startsWith('truncated') || pos + len >= this.size) throw new RlstreamError('LOG_CORRUPT', `${this.path('.log')}: ${problem} at byte ${pos + p}`);
      if (p > 0) break;
      // The first record alone is larger than the chunk: read exactly that record.
      len = Math.min(recordSizeAt(buf, 0), this.size - pos);
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

  flush(): void {
    if (!this.dirty) return;
    fsyncSync(this.fd);
    this.dirty = false;
  }

  close(): void {
    closeSync(this.fd);
    if (this.indexFd >= 0) closeSync(this.indexFd);
    if (this.timeFd >= 0) closeSync(this.timeFd);
    this.indexFd = this.timeFd = -1;
  }

  delete(): void {
    this.close();
    for (const ext of ['.log', '.index', '.timeindex']) {
      try {
        unlinkSync(this.path(ext));
      } catch {
        /* already gone */
      }
    }
  }
}

// One topic-partition of the embedded log: an ordered list of segments, appends that roll to a new segment
// by size, reads by offset and by timestamp, whole-segment retention, and the wake-up of waiting consumers.
import { mkdirSync, readdirSync } from 'node:fs';
import { RlstreamError } from '../../errors.ts';
import type { Logger } from '../../telemetry.ts';
import type { RecordChunk, RetentionOptions } from '../types.ts';
import { type EncodedBatch, FRAME, offsetAt } from './record-format.ts';
import { Segment, type SegmentConfig } from './segment.ts';

export interface PartitionConfig extends SegmentConfig {
  segmentBytes: number;
}

/** Where a reader stands: the next offset and, when known, its exact place in a segment. */
export interface ReadCursor {
  offset: number;
  segmentBase: number;
  pos: number;
}

export class Partition {
  private readonly segments: Segment[] = [];
  private waiters = new Set<() => void>();

  constructor(
    readonly topic: string,
    readonly index: number,
    readonly dir: string,
    private readonly config: PartitionConfig,
    private readonly logger: Logger,
    public retention: RetentionOptions = {},
  ) {
    mkdirSync(dir, { recursive: true });
    const bases = readdirSync(dir)
      .filter((f) => /^\d{20}\.log$/.test(f))
      .map((f) => Number(f.slice(0, 20)))
      .sort((a, b) => a - b);
    bases.forEach((base, i) => this.segments.push(Segment.open(dir, base, config, i === bases.length - 1, logger)));
    // A crash between creating a segment and writing to it can leave an empty active segment whose base
    // does not follow the previous one; fix by dropping it.
    while (this.segments.length > 1) {
      const last = this.segments[this.segments.length - 1]!;
      const prev = this.segments[this.segments.length - 2]!;
      if (last.base === prev.next) break;
      if (last.size > 0) throw new RlstreamError('LOG_CORRUPT', `${dir}: segment ${last.base} does not follow ${prev.next}`);
      last.delete();
      this.segments.pop();
    }
    if (this.segments.length === 0) this.segments.push(Segment.create(dir, 0, config));
  }

  get low(): number {
    return this.segments[0]!.base;
  }

  get high(): number {
    return this.active.next;
  }

  private get active(): Segment {
    return this.segments[this.segments.length - 1]!;
  }

  get bytes(): number {
    return this.segments.reduce((n, s) => n + s.size, 0);
  }

  /** Append an encoded batch whose baseOffset is this partition's high; rolls segments by size. */
  append(batch: EncodedBatch): void {
    if (batch.baseOffset !== this.high) throw new RlstreamError('INTERNAL', `${this.topic}/${this.index}: batch at ${batch.baseOffset}, high is ${this.high}`);
    let from = 0;
    const n = batch.ends.length;
    while (from < n) {
      const seg = this.active;
      const startByte = from === 0 ? 0 : batch.ends[from - 1]!;
      // Take records while they fit in the segment (at least one, so a huge record still goes somewhere).
      let to = from;
      while (to < n && (to === from || seg.size + (batch.ends[to]! - startByte) <= this.config.segmentBytes)) to++;
      if (seg.size > 0 && seg.size + (batch.ends[from]! - startByte) > this.config.segmentBytes) {
        this.roll();
        continue;
      }
      seg.append(batch, from, to);
      from = to;
    }
    this.wake();
  }

  private roll(): void {
    const old = this.active;
    old.seal();
    old.flush();
    this.segments.push(Segment.create(this.dir, old.next, this.config));
    this.applyRetention(Date.now());
  }

  /** Delete whole old segments beyond the size or age limit; the active segment always stays. */
  applyRetention(now: number): number {
    let deleted = 0;
    const { maxBytes, maxAgeMs } = this.retention;
    while (this.segments.length > 1) {
      const oldest = this.segments[0]!;
      const tooBig = maxBytes != null && this.bytes > maxBytes; // null or absent: no limit
      const tooOld = maxAgeMs != null && oldest.maxTimestamp < now - maxAgeMs;
      if (!tooBig && !tooOld) break;
      oldest.delete();
      this.segments.shift();
      deleted++;
    }
    if (deleted > 0) this.logger.debug('embedded log: retention deleted segments', { topic: this.topic, partition: this.index, deleted, low: this.low });
    return deleted;
  }

  private segmentFor(offset: number): Segment {
    let lo = 0;
    let hi = this.segments.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (this.segments[mid]!.base <= offset) lo = mid;
      else hi = mid - 1;
    }
    return this.segments[lo]!;
  }

  /**
   * Records from a cursor, up to maxRecords and about maxBytes, as the chunks read from the segments (one
   * RecordChunk per read, its frames CRC-checked); advances the cursor. A cursor below the retained range moves
   * to the first retained record. `alloc` gives the buffers to read into (Segment.read).
   */
  readChunks(cursor: ReadCursor, out: RecordChunk[], maxRecords: number, maxBytes: number, alloc?: (bytes: number) => Buffer): { records: number; bytes: number } {
    if (cursor.offset < this.low) Object.assign(cursor, { offset: this.low, segmentBase: -1, pos: 0 });
    let bytes = 0;
    let records = 0;
    while (records < maxRecords && bytes < maxBytes && cursor.offset < this.high) {
      let seg = this.segmentFor(cursor.offset);
      if (cursor.segmentBase !== seg.base) {
        cursor.segmentBase = seg.base;
        cursor.pos = seg.positionOf(cursor.offset);
      }
      if (cursor.pos >= seg.size) {
        // End of a sealed segment: continue in the next one.
        seg = this.segmentFor(seg.next);
        if (seg.base === cursor.segmentBase) break;
        cursor.segmentBase = seg.base;
        cursor.pos = 0;
        continue;
      }
      const chunk = seg.read(cursor.pos, maxBytes - bytes, maxRecords - records, alloc);
      const view = new DataView(chunk.buffer, chunk.byteOffset, chunk.length);
      const firstOffset = cursor.offset;
      const starts: number[] = [];
      let p = 0;
      while (p < chunk.length && records < maxRecords) {
        const offset = offsetAt(view, p);
        if (offset !== cursor.offset) throw new RlstreamError('LOG_CORRUPT', `${this.topic}/${this.index}: expected offset ${cursor.offset}, found ${offset}`);
        starts.push(p);
        const size = FRAME + view.getUint32(p);
        p += size;
        bytes += size;
        records++;
        cursor.pos += size;
        cursor.offset++;
      }
      if (starts.length > 0) out.push({ topic: this.topic, partition: this.index, firstOffset, buf: chunk, starts: Int32Array.from(starts) });
    }
    return { records, bytes };
  }

  /** First offset whose timestamp is >= ts (high when none). */
  offsetForTimestamp(ts: number): number {
    for (const seg of this.segments) {
      const o = seg.offsetForTimestamp(ts);
      if (o !== null) return o;
    }
    return this.high;
  }

  /** Drop records at or after an offset; used only by recovery. */
  truncateTo(offset: number): void {
    while (this.segments.length > 1 && this.active.base >= offset) {
      this.active.delete();
      this.segments.pop();
    }
    if (offset < this.high) this.active.truncateTo(Math.max(offset, this.active.base));
  }

  /** Resolve once when new records arrive (or now, if `since` is already below high). */
  onAppend(cb: () => void): () => void {
    this.waiters.add(cb);
    return () => this.waiters.delete(cb);
  }

  private wake(): void {
    if (this.waiters.size === 0) return;
    const ws = this.waiters;
    this.waiters = new Set();
    for (const w of ws) w();
  }

  flush(): void {
    this.active.flush();
  }

  close(): void {
    for (const s of this.segments) s.close();
    this.wake();
  }
}

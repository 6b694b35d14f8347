// One topic-partition of the embedded log: an ordered list of segments, appends that roll to a new segment
// by size, reads by offset and by timestamp, whole-segment retention, and the wake-up of waiting consumers.
// On open it checks that its segments account for every offset: a gap between segments, a segment file gone
// while its index is still there, or a first segment above 0 without retention is a missing segment, refused
// (LOG_CORRUPT with the repair command) unless its damage ledger lists the gap; damaged frames found inside a
// segment are quarantined (see segment.ts). A read-only open reads around both instead, in memory. Readers step
// over gaps and count the offsets skipped.
import { existsSync, mkdirSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { isRlstreamError, RlstreamError } from '../../errors.ts';
import type { Logger } from '../../telemetry.ts';
import type { RecordChunk, RetentionOptions } from '../types.ts';
import { corruptError, DamageLedger, type DamageRecord, unlinkIfThere } from './damage.ts';
import { type EncodedBatch, FRAME, offsetAt } from './record-format.ts';
import { Segment, type SegmentConfig, type SegmentDamage, segmentFileName } from './segment.ts';

export interface PartitionConfig extends SegmentConfig {
  segmentBytes: number;
  /** Quarantine every damage found, missing segments included, instead of refusing to open (`rlstream log repair`). */
  repair: boolean;
  /** Rescan sealed segments on open too, whatever their indexes say. */
  verify: boolean;
}

const SEGMENT_FILE = /^(\d{20})\.(log|index|timeindex)$/;

/** Where a reader stands: the next offset and, when known, its exact place in a segment. */
export interface ReadCursor {
  offset: number;
  segmentBase: number;
  pos: number;
  /** The partition's layout epoch pos was computed in (Partition.epoch); another epoch recomputes it. */
  epoch?: number;
}

export class Partition {
  private readonly segments: Segment[] = [];
  private waiters = new Set<() => void>();
  private readonly ledger: DamageLedger;
  /** Damage found and quarantined by this open (the ledger holds it too, with what earlier opens found). */
  readonly found: DamageRecord[] = [];
  /** Offsets readers have stepped over because they fall in a gap (lost to damage). */
  gapOffsetsSkipped = 0;
  /** Bumped when a segment file is rewritten under readers (quarantine at read time): their positions are stale. */
  private epoch = 0;
  private readonly rescannedClean = new WeakSet<Segment>();

  constructor(
    readonly topic: string,
    readonly index: number,
    readonly dir: string,
    private readonly config: PartitionConfig,
    private readonly logger: Logger,
    public retention: RetentionOptions = {},
  ) {
    if (!config.readOnly) mkdirSync(dir, { recursive: true });
    this.ledger = DamageLedger.load(config.logDir, dir, config.repair);
    const files = existsSync(dir) ? readdirSync(dir) : [];
    const logBases = new Set<number>();
    const indexBases = new Set<number>();
    for (const f of files) {
      const m = SEGMENT_FILE.exec(f);
      if (m) (m[2] === 'log' ? logBases : indexBases).add(Number(m[1]));
    }
    const bases = [...logBases].sort((a, b) => a - b);
    bases.forEach((base, i) => this.segments.push(Segment.open(dir, base, config, i === bases.length - 1, logger, config.repair || config.verify)));
    // A crash between creating a segment and writing to it can leave an empty active segment whose base
    // does not follow the previous one; fix by dropping it (unless a listed gap explains it).
    while (this.segments.length > 1) {
      const last = this.segments[this.segments.length - 1]!;
      const prev = this.segments[this.segments.length - 2]!;
      if (last.base === prev.next || last.size > 0 || (last.base > prev.next && this.ledger.covers(prev.next, last.base))) break;
      if (config.readOnly) last.close();
      else last.delete();
      this.segments.pop();
    }
    this.checkComplete([...indexBases].filter((b) => !logBases.has(b)));
    if (this.segments.length === 0) this.segments.push(Segment.create(dir, 0, config));
  }

  private get hasRetention(): boolean {
    return this.retention.maxBytes != null || this.retention.maxAgeMs != null;
  }

  /**
   * Every offset below high is in a segment or in a listed gap; damaged frames found inside segments are
   * quarantined. What cannot be handled in this mode fails the open with the repair command.
   */
  private checkComplete(orphanBases: number[]): void {
    const missing: { from: number; to: number | null; file: string; reason: string }[] = [];
    const firstBase = this.segments[0]?.base ?? Infinity;
    for (const base of orphanBases) {
      // Retention deletes a segment's indexes before its .log, so indexes below the first segment are leftovers
      // of a retention cut short; anywhere else, the .log is gone.
      if (this.hasRetention && base < firstBase) {
        if (!this.config.readOnly) for (const ext of ['.index', '.timeindex']) unlinkIfThere(join(this.dir, segmentFileName(base, ext)));
        continue;
      }
      const after = this.segments.find((s) => s.base > base);
      missing.push({ from: base, to: after?.base ?? null, file: join(this.dir, segmentFileName(base, '.log')), reason: 'segment file missing (its index is still there)' });
    }
    if (firstBase !== Infinity && firstBase > 0 && !this.hasRetention && !missing.some((m) => m.from === 0)) {
      missing.push({ from: 0, to: firstBase, file: join(this.dir, segmentFileName(0, '.log')), reason: `segment file missing: the first segment starts at offset ${firstBase} and the topic has no retention` });
    }
    for (let i = 1; i < this.segments.length; i++) {
      const prev = this.segments[i - 1]!;
      const seg = this.segments[i]!;
      if (seg.base < prev.next) {
        throw new RlstreamError('LOG_CORRUPT', `${seg.path('.log')}: starts at offset ${seg.base}, inside the previous segment (which ends at ${prev.next}): two segments hold the same offsets; move one of them out of ${this.dir}`);
      }
      if (seg.base === prev.next || prev.damage.some((d) => d.toOffset === null)) continue;
      if (missing.some((m) => m.from >= prev.next && m.from < seg.base)) continue;
      missing.push({ from: prev.next, to: seg.base, file: join(this.dir, segmentFileName(prev.next, '.log')), reason: `segment file missing: offsets ${prev.next} to ${seg.base - 1} are in no segment` });
    }
    const unlisted = missing.filter((m) => !this.ledger.covers(m.from, m.to ?? m.from + 1));
    const { readOnly, repair } = this.config;
    for (const m of unlisted) {
      if (!repair && !readOnly) {
        throw corruptError(this.config.logDir, m.file, `${m.reason}; ${m.to === null ? `offsets from ${m.from}` : `offsets ${m.from} to ${m.to - 1}`} of ${this.topic}/${this.index} are lost`, 'accept the gap (it is listed in damage.json and readers skip it)');
      }
    }
    const damaged = this.segments.filter((s) => s.damage.length > 0);
    for (const seg of damaged) {
      const i = this.segments.indexOf(seg);
      const nextBase = this.segments[i + 1]?.base ?? null;
      for (const d of seg.damage) {
        if (d.toOffset !== null) continue;
        d.toOffset = nextBase;
        if (!repair && !readOnly) {
          throw corruptError(this.config.logDir, seg.path('.log'), `${d.problem} at byte ${d.pos}, and no valid record follows in the sealed segment (the frames cannot be re-synchronised)`, 'move the damaged bytes to a quarantine file');
        }
      }
    }
    const now = Date.now();
    const records = unlisted.map((m): DamageRecord => ({ topic: this.topic, partition: this.index, fromOffset: m.from, toOffset: m.to, bytes: 0, file: m.file, quarantine: null, reason: m.reason, foundMs: now }));
    if (records.length > 0) {
      // Read-only: the gap is reported, and readers step over it, but it is not written down.
      if (!readOnly) {
        this.ledger.add(records);
        for (const m of unlisted) for (const ext of ['.index', '.timeindex']) unlinkIfThere(join(this.dir, segmentFileName(m.from, ext)));
      }
      this.found.push(...records);
    }
    for (const seg of damaged) {
      const record = (d: SegmentDamage, quarantine: string | null): DamageRecord => ({
        topic: this.topic,
        partition: this.index,
        fromOffset: d.fromOffset,
        toOffset: d.toOffset,
        bytes: d.end - d.pos,
        file: seg.path('.log'),
        quarantine,
        reason: d.problem,
        foundMs: now,
      });
      if (readOnly) {
        // Nothing may be moved: the damaged bytes stay where they are and reads step over them.
        this.found.push(...seg.damage.map((d) => record(d, null)));
        seg.keepDamageAsHoles();
        continue;
      }
      const i = this.segments.indexOf(seg);
      seg.quarantine(i === this.segments.length - 1, this.logger, (moved) => {
        const recs = moved.map(({ damage: d, file }) => record(d, file));
        this.ledger.add(recs);
        this.found.push(...recs);
      });
    }
    for (const r of this.found) {
      const msg = readOnly ? 'embedded log: damaged records found (left in place: read-only open); their offsets are a gap that readers skip' : 'embedded log: damaged records quarantined; their offsets are a gap that readers skip';
      this.logger.warn(msg, { topic: r.topic, partition: r.partition, fromOffset: r.fromOffset, toOffset: r.toOffset, bytes: r.bytes, file: r.file, quarantine: r.quarantine, reason: r.reason });
    }
  }

  /** Every gap this partition has accepted (its damage ledger). */
  get damage(): readonly DamageRecord[] {
    // A read-only open writes no ledger: what it found is listed beside what earlier opens wrote down.
    return this.config.readOnly ? [...this.ledger.records, ...this.found] : this.ledger.records;
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
    if (this.config.readOnly) throw new RlstreamError('LOG_READ_ONLY', `${this.dir}: the log is open read-only`);
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
      const seg = this.segmentFor(cursor.offset);
      if (cursor.segmentBase !== seg.base || cursor.epoch !== this.epoch) {
        cursor.segmentBase = seg.base;
        cursor.epoch = this.epoch;
        try {
          cursor.pos = seg.positionOf(cursor.offset);
        } catch (err) {
          cursor.segmentBase = -1;
          if (this.quarantinedAtRead(err, seg)) continue;
          throw err;
        }
      }
      cursor.pos = seg.skipHole(cursor.pos);
      if (cursor.pos >= seg.size) {
        // End of a sealed segment: continue in the next one (past a gap, if one lies between).
        const i = this.segments.indexOf(seg);
        const next = this.segments[i + 1];
        if (!next) break;
        if (next.base > cursor.offset) this.skipGap(cursor.offset, next.base);
        cursor.offset = Math.max(cursor.offset, next.base);
        cursor.segmentBase = next.base;
        cursor.epoch = this.epoch;
        cursor.pos = 0;
        continue;
      }
      let chunk: Buffer;
      try {
        chunk = seg.read(cursor.pos, maxBytes - bytes, maxRecords - records, alloc);
      } catch (err) {
        if (this.quarantinedAtRead(err, seg)) continue;
        throw err;
      }
      const view = new DataView(chunk.buffer, chunk.byteOffset, chunk.length);
      let firstOffset = cursor.offset;
      let starts: number[] = [];
      let p = 0;
      while (p < chunk.length && records < maxRecords) {
        const offset = offsetAt(view, p);
        if (offset !== cursor.offset) {
          // A gap (records lost to damage) inside the segment: a chunk's offsets are dense, so a new one starts.
          if (offset < cursor.offset) throw new RlstreamError('LOG_CORRUPT', `${this.topic}/${this.index}: expected offset ${cursor.offset}, found ${offset}`);
          if (starts.length > 0) out.push({ topic: this.topic, partition: this.index, firstOffset, buf: chunk, starts: Int32Array.from(starts) });
          this.skipGap(cursor.offset, offset);
          firstOffset = cursor.offset = offset;
          starts = [];
        }
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

  /**
   * Rescan a sealed segment a read failed on with LOG_CORRUPT and quarantine what it finds, as an open does (a
   * sealed segment is not rescanned on open: its indexes are trusted, so damage there shows up when read); false
   * when that does not apply or the rescan finds nothing (the read's error stands). Readers' positions in the
   * partition are recomputed.
   */
  private quarantinedAtRead(err: unknown, seg: Segment): boolean {
    if (!isRlstreamError(err, 'LOG_CORRUPT') || seg === this.active) return false;
    seg.rescan(this.logger);
    if (seg.damage.length === 0) {
      // The .log is whole: a damaged index sent the read astray. The rescan rebuilt the indexes; read again,
      // once (a second failure after a clean rescan is not the indexes').
      if (this.rescannedClean.has(seg)) return false;
      this.rescannedClean.add(seg);
      this.logger.warn('embedded log: segment indexes rebuilt after a read found them wrong', { file: seg.path('.index') });
      this.epoch++;
      return true;
    }
    const nextBase = this.segments[this.segments.indexOf(seg) + 1]?.base ?? null;
    for (const d of seg.damage) d.toOffset ??= nextBase;
    const found: DamageRecord[] = [];
    if (this.config.readOnly) {
      const now = Date.now();
      found.push(...seg.damage.map((d): DamageRecord => ({ topic: this.topic, partition: this.index, fromOffset: d.fromOffset, toOffset: d.toOffset, bytes: d.end - d.pos, file: seg.path('.log'), quarantine: null, reason: d.problem, foundMs: now })));
      seg.keepDamageAsHoles();
      this.found.push(...found);
      this.epoch++;
      for (const r of found) this.logger.warn('embedded log: damaged records found (left in place: read-only open); their offsets are a gap that readers skip', { ...r });
      return true;
    }
    seg.quarantine(false, this.logger, (moved) => {
      const now = Date.now();
      found.push(...moved.map(({ damage: d, file }): DamageRecord => ({ topic: this.topic, partition: this.index, fromOffset: d.fromOffset, toOffset: d.toOffset, bytes: d.end - d.pos, file: seg.path('.log'), quarantine: file, reason: d.problem, foundMs: now })));
      this.ledger.add(found);
    });
    this.found.push(...found);
    this.epoch++;
    for (const r of found) this.logger.warn('embedded log: damaged records quarantined; their offsets are a gap that readers skip', { ...r });
    return true;
  }

  private skipGap(from: number, to: number): void {
    this.gapOffsetsSkipped += to - from;
    this.logger.warn('embedded log: reader skipped offsets lost to damage', { topic: this.topic, partition: this.index, fromOffset: from, toOffset: to });
  }

  /** First offset whose timestamp is >= ts (high when none). */
  offsetForTimestamp(ts: number): number {
    for (const seg of this.segments) {
      let o: number | null;
      try {
        o = seg.offsetForTimestamp(ts);
      } catch (err) {
        if (!this.quarantinedAtRead(err, seg)) throw err;
        o = seg.offsetForTimestamp(ts);
      }
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

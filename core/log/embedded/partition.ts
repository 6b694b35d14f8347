// One topic-partition of the embedded log: an ordered list of segments, appends that roll to a new segment
// by size, reads by offset and by timestamp, whole-segment retention, and the wake-up of waiting consumers.
// On open it checks that its segments hold what the log's manifest (manifest.ts) says was written: a segment
// missing, cut short, replaced by another file or by a directory, the whole partition directory gone, an extra
// segment nobody wrote. Each loss is an offset range; a read-write open refuses them (Partition.refused, which
// the log reports together, naming the repair command) unless its damage ledger lists them already, a repair
// lists and quarantines them, a read-only open reads around them and reports them. A log older than its
// manifest is checked as before it: a gap between segments, a segment file gone while its index is still there,
// a first segment above 0 without retention. Damaged frames found inside a segment are quarantined (see
// segment.ts) by any read-write open. Readers step over gaps and count the offsets skipped.
import { existsSync, mkdirSync, readdirSync, renameSync, statSync } from 'node:fs';
import { basename, join } from 'node:path';
import { isRlstreamError, RlstreamError } from '../../errors.ts';
import type { Logger } from '../../telemetry.ts';
import type { RetentionOptions } from '../types.ts';
import { FrameChunk } from './chunk.ts';
import { asideName, DamageLedger, type DamageRecord, unlinkIfThere } from './damage.ts';
import { highOf, lowOf, type PartitionRecord } from './manifest.ts';
import { type EncodedBatch, FRAME, offsetAt } from './record-format.ts';
import { Segment, type SegmentConfig, type SegmentDamage, segmentFileName } from './segment.ts';

export interface PartitionConfig extends SegmentConfig {
  segmentBytes: number;
  /** Quarantine every damage found, missing segments included, instead of refusing to open (`rlstream log repair`). */
  repair: boolean;
  /** Rescan sealed segments on open too, whatever their indexes say, and check their CRC-32 against the manifest. */
  verify: boolean;
}

/** What the log expects of a partition when it opens it. */
export interface PartitionExpectation {
  /** The partition's entry in the log's manifest; null for a log older than its manifest. */
  record: PartitionRecord | null;
  /** Why the partition's directory was not there before this open (its topic's or its own deleted). */
  goneReason?: string;
  /**
   * The manifest was written by a close. Otherwise its writer may have rolled segments after its last entry (the
   * log writes the manifest a moment after a roll, not in it), so segments after the last one listed are its own.
   */
  clean?: boolean;
  /**
   * The partition's high-water mark as last noted by a writer on this boot of the machine (written.ts): records
   * below it reached the page cache, which a process crash does not lose, so a cut below it is damage too.
   */
  written?: number;
  /** The mark an append under way was to reach when the writer last noted (≥ written; written.ts). */
  writing?: number;
}

/** A file that holds no lost offsets but is not the log's: an extra segment, something of the wrong type. */
export interface ExtraFile {
  topic: string;
  partition: number | null;
  file: string;
  reason: string;
  /** Where repair moved it (null: left in place, by a read-only open). */
  quarantine: string | null;
}

const SEGMENT_FILE = /^(\d{20})\.(log|index|timeindex)$/;

/** Offsets [from, to) lost, and why. `foreign`: a segment present but not written here, moved out by repair. */
interface Loss {
  from: number;
  to: number | null;
  file: string;
  reason: string;
  quarantine?: string | null;
  foreign?: Segment;
}

/** Where a reader stands: the next offset and, when known, its exact place in a segment. */
export interface ReadCursor {
  offset: number;
  segmentBase: number;
  pos: number;
  /** The partition's layout epoch pos was computed in (Partition.epoch); another epoch recomputes it. */
  epoch?: number;
}

function hex(n: number): string {
  return `0x${n.toString(16).padStart(8, '0')}`;
}

export function describeRange(from: number, to: number | null): string {
  return to === null ? `offsets from ${from}` : to - from === 1 ? `offset ${from}` : `offsets ${from} to ${to - 1}`;
}

export class Partition {
  private readonly segments: Segment[] = [];
  private waiters = new Set<() => void>();
  private readonly ledger: DamageLedger;
  /** Damage found and quarantined by this open (the ledger holds it too, with what earlier opens found). */
  readonly found: DamageRecord[] = [];
  /** Losses a plain read-write open refuses (one line each): the log fails its open with all of them. */
  readonly refused: string[] = [];
  /** Files found that are not the log's own (extra segments, wrong types), with what became of them. */
  readonly extra: ExtraFile[] = [];
  /** Offsets readers have stepped over because they fall in a gap (lost to damage). */
  gapOffsetsSkipped = 0;
  /** Bumped when a segment file is rewritten under readers (quarantine at read time): their positions are stale. */
  private epoch = 0;
  private readonly rescannedClean = new WeakSet<Segment>();
  /** PartitionExpectation.writing: where no segment file is left, the loss runs to it. */
  private readonly expectWriting: number | undefined;
  /** The partition's manifest entry as of the last time its data was on disk (markDurable). */
  durable: PartitionRecord | null = null;

  constructor(
    readonly topic: string,
    readonly index: number,
    readonly dir: string,
    private readonly config: PartitionConfig,
    private readonly logger: Logger,
    public retention: RetentionOptions = {},
    expect: PartitionExpectation = { record: null },
    /**
     * Called after durable changed: segments were added (the log writes its manifest soon) or are about to be
     * deleted (`now`: it writes it before they go).
     */
    private readonly onLayout: (now: boolean) => void = () => {},
  ) {
    const rec = expect.record;
    const expectedHigh = rec ? Math.max(highOf(rec), expect.written ?? 0) : 0;
    this.expectWriting = rec ? expect.writing : undefined;
    const dirThere = existsSync(dir);
    // A plain open of a partition whose records are gone with its directory refuses, and creates nothing.
    const lostDir = !dirThere && rec !== null && expectedHigh > lowOf(rec);
    const refuses = lostDir && !config.readOnly && !config.repair;
    if (!config.readOnly && !refuses) mkdirSync(dir, { recursive: true });
    this.ledger = DamageLedger.load(config.logDir, dir, config.repair);
    const entries = dirThere ? readdirSync(dir, { withFileTypes: true }) : [];
    const logBases = new Set<number>();
    const indexBases = new Set<number>();
    const wrongKind = new Map<number, string>();
    for (const f of entries) {
      const m = SEGMENT_FILE.exec(f.name);
      if (!m) continue;
      if (!f.isFile()) {
        this.setAside(join(dir, f.name), `is ${f.isDirectory() ? 'a directory' : 'not a regular file'} where a segment ${m[2] === 'log' ? 'file' : 'index'} belongs`);
        if (m[2] === 'log') wrongKind.set(Number(m[1]), join(dir, f.name));
        continue;
      }
      (m[2] === 'log' ? logBases : indexBases).add(Number(m[1]));
    }
    if (rec) this.dropUnlisted(rec, logBases, expect.clean === true);
    const bases = [...logBases].sort((a, b) => a - b);
    const listed = new Map((rec?.segments ?? []).map((s) => [s.base, s]));
    bases.forEach((base, i) => {
      const last = i === bases.length - 1;
      const seg = Segment.open(dir, base, config, last, logger, config.repair || config.verify, last && rec ? expectedHigh : 0);
      const e = listed.get(base);
      // The manifest's CRC stands for a segment of the length it lists (checked against the bytes by verify).
      if (e && e.crc !== null && seg.crc === null && seg.size === e.bytes && seg.damage.length === 0) seg.crc = e.crc;
      this.segments.push(seg);
    });
    // A crash between creating a segment and writing to it can leave an empty active segment whose base
    // does not follow the previous one; fix by dropping it (unless a listed gap explains it).
    while (this.segments.length > 1) {
      const last = this.segments[this.segments.length - 1]!;
      const prev = this.segments[this.segments.length - 2]!;
      if (last.base === prev.next || last.size > 0 || (last.base > prev.next && this.ledger.covers(prev.next, last.base)) || listed.has(last.base)) break;
      if (config.readOnly) last.close();
      else last.delete();
      this.segments.pop();
    }
    this.checkComplete([...indexBases].filter((b) => !logBases.has(b)), rec, expectedHigh, wrongKind, expect.goneReason);
    const writable = !config.readOnly && this.refused.length === 0;
    // Offsets lost at the end stay used: the next record gets the offset after the last one ever written, so a
    // group's committed offset, or a reader's position, never lands on a different record.
    const from = this.segments[this.segments.length - 1]?.next ?? (rec ? lowOf(rec) : 0);
    const writingHigh = Math.max(expectedHigh, this.expectWriting ?? 0);
    // (an append in flight listed as lost: the next record goes after it, not into the listed range)
    const resumeAt = !rec ? 0 : this.ledger.covers(from, writingHigh) ? writingHigh : this.ledger.covers(from, expectedHigh) ? expectedHigh : 0;
    if (this.segments.length === 0) this.segments.push(Segment.create(dir, resumeAt, writable ? config : { ...config, readOnly: true }));
    else if (writable && resumeAt > this.high) {
      this.active.seal();
      this.active.flush();
      this.segments.push(Segment.create(dir, resumeAt, config));
    }
  }

  /**
   * A path of the wrong type (a directory named like a segment): a repair moves it aside, a read-only open
   * leaves it, a plain open refuses. Either way it is listed.
   */
  private setAside(path: string, what: string): void {
    const { readOnly, repair } = this.config;
    if (!readOnly && !repair) this.refused.push(`${path}: ${what}`);
    let quarantine: string | null = null;
    if (repair) {
      renameSync(path, asideName(path));
      quarantine = asideName(path);
    }
    this.extra.push({ topic: this.topic, partition: this.index, file: path, reason: what, quarantine });
  }

  /**
   * Segments on disk that the manifest does not list: an empty one is a roll cut short, one below the first
   * listed is a retention cut short (the manifest forgets a segment before it is deleted); either is deleted.
   * Any other is not this log's: repair moves it aside, a read-only open does not read it, a plain open refuses.
   */
  private dropUnlisted(rec: PartitionRecord, logBases: Set<number>, clean: boolean): void {
    const listed = new Set(rec.segments.map((s) => s.base));
    const lastListed = rec.segments[rec.segments.length - 1]!.base;
    const { readOnly, repair } = this.config;
    for (const base of [...logBases].filter((b) => !listed.has(b) && (clean || b < lastListed))) {
      const file = join(this.dir, segmentFileName(base, '.log'));
      const leftover = statSync(file).size === 0 || (this.hasRetention && base < lowOf(rec));
      logBases.delete(base);
      if (leftover) {
        if (!readOnly) for (const ext of ['.index', '.timeindex', '.log']) unlinkIfThere(join(this.dir, segmentFileName(base, ext)));
        continue;
      }
      const what = `a segment the manifest does not list (holds offsets from ${base}; not written by this log)`;
      if (!readOnly && !repair) this.refused.push(`${file}: ${what}`);
      let quarantine: string | null = null;
      if (repair) {
        renameSync(file, asideName(file));
        for (const ext of ['.index', '.timeindex']) unlinkIfThere(join(this.dir, segmentFileName(base, ext)));
        quarantine = asideName(file);
      }
      this.extra.push({ topic: this.topic, partition: this.index, file, reason: what, quarantine });
    }
  }

  private get hasRetention(): boolean {
    return this.retention.maxBytes != null || this.retention.maxAgeMs != null;
  }

  /**
   * What the manifest lists and the files do not hold: each segment missing (or of the wrong type), cut short, or
   * replaced by another file (same length, other bytes: found by verify), the whole partition when its directory
   * was gone. Damage to the end of a segment found by its scan runs to the segment's listed end.
   */
  private compareWithManifest(rec: PartitionRecord, expectedHigh: number, wrongKind: Map<number, string>, goneReason: string | undefined, missing: Loss[], listedEnd: Map<Segment, number>): void {
    if (goneReason) {
      if (expectedHigh > lowOf(rec)) missing.push({ from: lowOf(rec), to: expectedHigh, file: this.dir, reason: goneReason });
      return;
    }
    for (const [i, e] of rec.segments.entries()) {
      const file = join(this.dir, segmentFileName(e.base, '.log'));
      const seg = this.segments.find((s) => s.base === e.base);
      // The last listed segment may have been rolled after the manifest's entry: then it ends where the next
      // segment starts.
      const after = seg && i === rec.segments.length - 1 ? this.segments[this.segments.indexOf(seg) + 1] : undefined;
      const end = Math.max(e.next, after?.base ?? 0);
      if (!seg) {
        if (e.next > e.base) {
          const wrong = wrongKind.get(e.base);
          const reason = wrong ? 'segment file replaced by a directory (or another non-file)' : 'segment file missing';
          missing.push({ from: e.base, to: e.next, file, reason, quarantine: wrong && this.config.repair ? basename(asideName(wrong)) : null });
        }
        continue;
      }
      const toEnd = seg.damage.find((d) => d.toOffset === null);
      if (toEnd && toEnd.fromOffset < end) {
        listedEnd.set(seg, end);
        continue;
      }
      if (seg.next < end) {
        missing.push({ from: seg.next, to: end, file, reason: `segment cut short: ${seg.size} bytes, ${after ? 'more than ' : ''}${e.bytes} were written` });
        continue;
      }
      if ((this.config.verify || this.config.repair) && e.crc !== null && seg.size === e.bytes && seg.damage.length === 0) {
        const crc = seg.fileCrc();
        if (crc !== e.crc && e.next > e.base) {
          missing.push({ from: e.base, to: e.next, file, reason: `segment replaced by another file: its CRC-32 is ${hex(crc)}, ${hex(e.crc)} was written (same length, every record frame valid)`, foreign: seg });
        }
      }
    }
    // Records noted as written after the manifest's entries (Partition.expect.written) end the last segment.
    const last = this.segments[this.segments.length - 1];
    if (!last) {
      // No segment file left: the loss of the last listed segment runs to the last record written, not to the
      // manifest's entry for it (a killed writer appended after it).
      // An append under way when the writer stopped (written.ts) may have reached the file: with no file left to
      // tell, its offsets are listed too.
      const listedHigh = highOf(rec);
      const lostHigh = Math.max(expectedHigh, this.expectWriting ?? 0);
      if (lostHigh <= listedHigh) return;
      const inFlight = lostHigh > expectedHigh ? ` (offsets ${expectedHigh}..${lostHigh - 1} were being appended when it stopped: written or not, no file is left to tell)` : '';
      const tail = missing.find((m) => m.to === listedHigh && !m.foreign);
      if (tail) {
        tail.to = lostHigh;
        tail.reason += inFlight;
      } else missing.push({ from: listedHigh, to: lostHigh, file: join(this.dir, segmentFileName(listedHigh, '.log')), reason: `records written before the writer stopped are missing: no segment file is left, ${expectedHigh} were written${inFlight}` });
      return;
    }
    if (last.next >= expectedHigh) return;
    // The files end below what was written: the tail was destroyed, with it any append under way.
    const lostHigh = Math.max(expectedHigh, this.expectWriting ?? 0);
    const inFlight = lostHigh > expectedHigh ? ` (offsets ${expectedHigh}..${lostHigh - 1} were being appended when it stopped: written or not, the files end before them)` : '';
    const toEnd = last.damage.find((d) => d.toOffset === null);
    if (toEnd) {
      listedEnd.set(last, Math.max(listedEnd.get(last) ?? 0, lostHigh));
      return;
    }
    const tail = missing.find((m) => m.from === last.next && !m.foreign);
    if (tail) tail.to = Math.max(tail.to ?? 0, lostHigh);
    else missing.push({ from: last.next, to: lostHigh, file: last.path('.log'), reason: `records written before the writer stopped are missing: the partition ends at ${last.next}, ${expectedHigh} were written${inFlight}` });
  }

  /**
   * Every offset below high is in a segment or in a listed gap; damaged frames found inside segments are
   * quarantined. What cannot be handled in this mode is refused (Partition.refused).
   */
  private checkComplete(orphanBases: number[], rec: PartitionRecord | null, expectedHigh: number, wrongKind: Map<number, string>, goneReason: string | undefined): void {
    const missing: Loss[] = [];
    // Where damage to the end of a segment stops: the end the manifest lists for it (else the next segment's base).
    const listedEnd = new Map<Segment, number>();
    if (rec) this.compareWithManifest(rec, expectedHigh, wrongKind, goneReason, missing, listedEnd);
    const firstBase = this.segments[0]?.base ?? Infinity;
    if (!rec) {
      for (const base of [...orphanBases, ...wrongKind.keys()]) {
        // Retention deletes a segment's indexes before its .log, so indexes below the first segment are leftovers
        // of a retention cut short; anywhere else, the .log is gone.
        if (this.hasRetention && base < firstBase && !wrongKind.has(base)) {
          if (!this.config.readOnly) for (const ext of ['.index', '.timeindex']) unlinkIfThere(join(this.dir, segmentFileName(base, ext)));
          continue;
        }
        const after = this.segments.find((s) => s.base > base);
        const wrong = wrongKind.get(base);
        missing.push({ from: base, to: after?.base ?? null, file: join(this.dir, segmentFileName(base, '.log')), reason: wrong ? 'segment file replaced by a directory (or another non-file)' : 'segment file missing (its index is still there)', quarantine: wrong && this.config.repair ? basename(asideName(wrong)) : null });
      }
      if (firstBase !== Infinity && firstBase > 0 && !this.hasRetention && !missing.some((m) => m.from === 0)) {
        missing.push({ from: 0, to: firstBase, file: join(this.dir, segmentFileName(0, '.log')), reason: `segment file missing: the first segment starts at offset ${firstBase} and the topic has no retention` });
      }
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
    const damaged = this.segments.filter((s) => s.damage.length > 0);
    for (const seg of damaged) {
      const i = this.segments.indexOf(seg);
      const nextBase = listedEnd.get(seg) ?? this.segments[i + 1]?.base ?? null;
      for (const d of seg.damage) {
        if (d.toOffset !== null) continue;
        d.toOffset = nextBase;
        if (!repair && !readOnly) this.refused.push(`${seg.path('.log')}: ${d.problem} at byte ${d.pos}, and no valid record follows in the segment: ${describeRange(d.fromOffset, d.toOffset)} of ${this.topic}/${this.index} are lost`);
      }
    }
    if (!repair && !readOnly) {
      for (const m of unlisted) this.refused.push(`${m.file}: ${m.reason}: ${describeRange(m.from, m.to)} of ${this.topic}/${this.index} are lost`);
      // Refused: nothing of this partition is moved or listed; the repair does it all.
      if (this.refused.length > 0) return;
    }
    const now = Date.now();
    for (const m of unlisted) {
      if (!m.foreign) continue;
      this.segments.splice(this.segments.indexOf(m.foreign), 1);
      m.foreign.close();
      if (repair) {
        const file = m.foreign.path('.log');
        renameSync(file, asideName(file));
        for (const ext of ['.index', '.timeindex']) unlinkIfThere(m.foreign.path(ext));
        m.quarantine = basename(asideName(file));
      }
    }
    const records = unlisted.map((m): DamageRecord => ({ topic: this.topic, partition: this.index, fromOffset: m.from, toOffset: m.to, bytes: 0, file: m.file, quarantine: m.quarantine ?? null, reason: m.reason, foundMs: now }));
    if (records.length > 0) {
      // Read-only: the gap is reported, and readers step over it, but it is not written down.
      if (!readOnly) {
        this.ledger.add(records);
        for (const m of unlisted) if (!m.foreign) for (const ext of ['.index', '.timeindex']) unlinkIfThere(join(this.dir, segmentFileName(m.from, ext)));
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
    // Every segment but the new, empty one is on disk now: the manifest lists them as they are.
    this.markDurable();
    this.onLayout(false);
    this.applyRetention(Date.now());
  }

  /** The partition's manifest entry as its files are now (CRCs that appends did not keep are computed). */
  snapshot(segments = this.segments): PartitionRecord {
    return { segments: segments.map((s) => ({ base: s.base, next: s.next, bytes: s.size, crc: s.crcNow() })) };
  }

  /** Take the manifest entry now: the caller has just made the partition's data durable (or closes the log). */
  markDurable(): void {
    this.durable = this.snapshot();
  }

  /** Delete whole old segments beyond the size or age limit; the active segment always stays. */
  applyRetention(now: number): number {
    let deleted = 0;
    const { maxBytes, maxAgeMs } = this.retention;
    let bytes = this.bytes;
    while (deleted < this.segments.length - 1) {
      const oldest = this.segments[deleted]!;
      const tooBig = maxBytes != null && bytes > maxBytes; // null or absent: no limit
      const tooOld = maxAgeMs != null && oldest.maxTimestamp < now - maxAgeMs;
      if (!tooBig && !tooOld) break;
      bytes -= oldest.size;
      deleted++;
    }
    if (deleted === 0) return 0;
    // The manifest forgets the segments before they go: a crash in between leaves unlisted segments below the
    // first listed one, which the next open deletes, never listed segments missing, which it would call a loss.
    const low = this.segments[deleted]!.base;
    if (this.durable) {
      this.durable = { segments: this.durable.segments.filter((s) => s.base >= low) };
      if (this.durable.segments.length === 0) this.durable = this.snapshot(this.segments.slice(deleted));
    }
    this.onLayout(true);
    for (const s of this.segments.splice(0, deleted)) s.delete();
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
  readChunks(cursor: ReadCursor, out: FrameChunk[], maxRecords: number, maxBytes: number, alloc?: (bytes: number) => Buffer): { records: number; bytes: number } {
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
          if (starts.length > 0) out.push(new FrameChunk(this.topic, this.index, firstOffset, chunk, Int32Array.from(starts)));
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
      if (starts.length > 0) out.push(new FrameChunk(this.topic, this.index, firstOffset, chunk, Int32Array.from(starts)));
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

  /** Force the active segment's writes to disk (`force`: even those of an earlier process, not marked dirty here). */
  flush(force = false): void {
    this.active.flush(force);
  }

  close(): void {
    for (const s of this.segments) s.close();
    this.wake();
  }
}

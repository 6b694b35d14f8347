// The embedded event log: a file-backed log inside the process (topics of partitions of segments, consumer
// groups, transactions through a write-ahead journal), with the same semantics as Kafka (core/log/types.ts).
// Layout: <dir>/LOCK, <dir>/checkpoint.json, <dir>/journal-N.log, <dir>/topics/<topic>/{meta.json,<p>/}.
// All file I/O is synchronous on purpose: an append or a commit runs start to end without another task in
// between, which is what makes offsets assignment and transaction application atomic within the process.
// Opening recovers: torn tails are cut, damaged records quarantined (damage.ts), and what cannot be recovered
// without loss fails with LOG_CORRUPT naming the file and the repair command: a missing journal or meta.json, a
// damaged checkpoint, and whatever the files lack of what the manifest (manifest.json, manifest.ts) says was
// written, all of it in one report. Durability of each call: see EmbeddedLogOptions.fsync and core/log/types.ts.
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { RlstreamError } from '../../errors.ts';
import { type Logger, silentLogger } from '../../telemetry.ts';
import type { Partitioner } from '../partitioner.ts';
import type {
  Consumer,
  ConsumerOptions,
  EventLog,
  GroupLag,
  PartitionOffsets,
  ProduceRecord,
  Producer,
  ProducerOptions,
  RecordPosition,
  TopicPartitionOffset,
  TopicSpec,
} from '../types.ts';
import { checkTopicSpec } from '../topic-spec.ts';
import { EmbeddedConsumer } from './consumer.ts';
import { asideName, corruptError, type DamageRecord, fileKind, fsyncDir, readJsonFile, repairCommand, wrongKindError, writeFileDurably } from './damage.ts';
import { GroupCoordinator, type GroupMember } from './groups.ts';
import { Journal, type JournalEntry, type OffsetTriple, type TxnPart } from './journal.ts';
import { DirectoryLock, inspectLock, type LockState } from './lock.ts';
import { type CompiledEmbeddedLogOptions, type EmbeddedLogOptions, compileEmbeddedLogOptions } from './options.ts';
import { describeRange, type ExtraFile, Partition } from './partition.ts';
import { readWritten, type WrittenMark, WrittenNotes } from './written.ts';
import { highOf, lowOf, type LogManifest, type ManifestState, type PartitionRecord, readManifest, type TopicRecord, writeManifest } from './manifest.ts';
import { EmbeddedProducer, type PendingPart } from './producer.ts';
import { type PlainRecord, batchFromBlob, batchSize, encodeBatch, encodedSize, readRecordAt } from './record-format.ts';

export type { EmbeddedLogOptions, FsyncPolicy } from './options.ts';
export type { DamageRecord } from './damage.ts';
export type { ExtraFile } from './partition.ts';
export type { ManifestState } from './manifest.ts';
export type { LockState } from './lock.ts';

/** What a log's files have lost, as found by this open and earlier ones (EmbeddedLog.damageReport). */
export interface DamageReport {
  /** Every gap the partitions' damage ledgers list, oldest first. */
  gaps: DamageRecord[];
  /** The gaps this open found (and quarantined). */
  foundNow: DamageRecord[];
  /** Offsets readers of this process stepped over, per topic/partition with any. */
  skipped: { topic: string; partition: number; offsets: number }[];
  /** Committed offsets that were past their partition's end on open and were moved back to it. */
  clamped: { group: string; topic: string; partition: number; from: number; to: number }[];
  /** Files found that hold no lost records but are not the log's own (extra segments, wrong types), and their fate. */
  extra: ExtraFile[];
  /** How this open found the manifest: present, or the log predates it, or it was missing or damaged. */
  manifest: ManifestState;
  /** Whether the manifest found was written by a close (null: none found). */
  closedCleanly: boolean | null;
  /** The LOCK as this open found it: taken over from a stale holder (a repair), or, read-only, whoever holds it. */
  lock: LockState | null;
}

/** How long after a segment roll the manifest lists it (see layoutChanged). */
const MANIFEST_DELAY_MS = 1000;

/** The reusable batch buffer is given back after a batch larger than this. */
const ARENA_KEPT_BYTES = 32 * 1024 * 1024;

interface Topic {
  spec: TopicSpec;
  partitions: Partition[];
}

export class EmbeddedLog implements EventLog {
  readonly kind = 'embedded' as const;
  private readonly topics = new Map<string, Topic>();
  private readonly groups: GroupCoordinator;
  private readonly journal: Journal;
  private readonly epochs = new Map<string, number>();
  private readonly consumers = new Set<EmbeddedConsumer>();
  private closed = false;
  private timer: NodeJS.Timeout | null = null;
  /**
   * Where sends and transactions encode their records: the encoded batch is only written (journal, segment),
   * never kept, so one buffer serves every commit instead of a fresh multi-megabyte allocation each time.
   */
  private arena = Buffer.allocUnsafe(0);

  private readonly clamped: DamageReport['clamped'] = [];
  /** Losses a read-write open refuses that belong to no open partition (a topic directory gone, of the wrong type). */
  private readonly refusals: string[] = [];
  private readonly extraFiles: ExtraFile[] = [];
  private manifestState: ManifestState = 'present';
  private closedCleanly: boolean | null = null;
  /** While open recovers, layout changes do not write the manifest: the end of recovery writes it once. */
  private recovering = true;
  /** A write of the manifest due after a segment roll (layoutChanged). */
  private manifestTimer: NodeJS.Timeout | null = null;
  private writtenMark: (topic: string, partition: number) => WrittenMark | undefined = () => undefined;
  private readonly writtenNotes: WrittenNotes;

  private constructor(
    readonly options: CompiledEmbeddedLogOptions,
    private readonly lock: DirectoryLock | null,
    private readonly logger: Logger,
  ) {
    this.groups = new GroupCoordinator((t) => this.topic(t).partitions.length);
    this.journal = new Journal(options.dir, logger, { readOnly: options.readOnly, repair: options.repair });
    this.writtenNotes = new WrittenNotes(options.dir);
  }

  /**
   * Open (and recover) a log directory; fails with LOG_LOCKED when another process holds it (a read-only
   * open takes no lock), with LOG_CORRUPT (file, what, repair command) when recovery would lose data.
   */
  static open(input: EmbeddedLogOptions, logger: Logger = silentLogger): EmbeddedLog {
    const options = compileEmbeddedLogOptions(input);
    if (options.readOnly) {
      const isLog = existsSync(join(options.dir, 'topics')) || (existsSync(options.dir) && readdirSync(options.dir).some((f) => /^journal-\d+\.log$/.test(f)));
      if (!isLog) throw new RlstreamError('LOG_UNAVAILABLE', `${options.dir} is not an embedded log directory (no topics/ and no journal in it)`, { retriable: false });
    } else if (!existsSync(join(options.dir, 'topics'))) {
      mkdirSync(join(options.dir, 'topics'), { recursive: true });
      fsyncDir(options.dir);
    }
    const lock = options.readOnly ? null : DirectoryLock.acquire(options.dir, { breakStale: options.repair });
    try {
      const log = new EmbeddedLog(options, lock, logger.child({ component: 'embedded-log' }));
      log.recover();
      if (options.retentionCheckMs > 0 && !options.readOnly) {
        log.timer = setInterval(() => log.applyRetention(), options.retentionCheckMs);
        log.timer.unref();
      }
      return log;
    } catch (err) {
      lock?.release();
      throw err;
    }
  }

  private get segmentConfig() {
    return {
      segmentBytes: this.options.segmentBytes,
      indexIntervalBytes: this.options.indexIntervalBytes,
      maxBodyBytes: this.options.maxRecordBytes + 64 * 1024,
      logDir: this.options.dir,
      readOnly: this.options.readOnly,
      repair: this.options.repair,
      verify: this.options.verify,
    };
  }

  private recover(): void {
    const { dir, readOnly, repair } = this.options;
    const topicsDir = join(dir, 'topics');
    const wrongTopics = wrongKindError(dir, topicsDir, 'directory');
    if (wrongTopics) throw wrongTopics;
    const onDisk = existsSync(topicsDir) ? readdirSync(topicsDir).filter((n) => !n.endsWith('.quarantine')) : [];
    const { manifest, state } = readManifest(dir, onDisk.some((n) => metaMarked(join(topicsDir, n))), this.options);
    this.manifestState = state;
    this.closedCleanly = manifest?.clean ?? null;
    this.writtenMark = readWritten(dir);
    for (const name of [...new Set([...onDisk, ...Object.keys(manifest?.topics ?? {})])]) {
      const rec = manifest?.topics[name];
      const tdir = join(topicsDir, name);
      const kind = fileKind(tdir);
      if (kind !== 'directory' && kind !== 'missing') {
        const what = `is ${kind === 'file' ? 'a file' : 'not a directory'} where the directory of topic ${name} belongs`;
        if (!readOnly && !repair) {
          this.refusals.push(`${tdir}: ${what}`);
          continue;
        }
        if (repair) renameSync(tdir, asideName(tdir));
        this.extraFiles.push({ topic: name, partition: null, file: tdir, reason: what, quarantine: repair ? asideName(tdir) : null });
      }
      if (kind !== 'directory') {
        if (rec) this.recoverMissingTopic(name, rec);
        continue;
      }
      const spec = this.readTopicMeta(topicsDir, name, rec !== undefined);
      if (!spec) continue;
      if (manifest && !rec) {
        this.extraFiles.push({ topic: name, partition: null, file: tdir, reason: 'a topic the manifest does not list (kept, and listed from now on)', quarantine: null });
        this.logger.warn('embedded log: a topic the manifest does not list; it is kept', { topic: name });
      }
      const partitions = Array.from({ length: spec.partitions }, (_, p) => {
        const gone = existsSync(join(tdir, String(p))) ? undefined : 'partition directory missing';
        return this.openPartition(name, p, spec.retention, rec?.partitions[p] ?? null, gone);
      });
      this.topics.set(name, { spec, partitions });
    }
    const parts = [...this.topics.values()].flatMap((t) => t.partitions);
    const refused = [...this.refusals, ...parts.flatMap((p) => p.refused)];
    if (refused.length > 0 && !readOnly && !repair) {
      for (const p of parts) p.close();
      throw new RlstreamError(
        'LOG_CORRUPT',
        `${dir}: the log's files do not hold what it wrote (${manifest ? 'its manifest.json lists every segment written' : 'found by its checks'}):\n${refused.map((r) => `  - ${r}`).join('\n')}\n` +
          `Run \`${repairCommand(dir)}\` to list these losses in the partitions' damage.json (readers then skip them) and move aside what is not the log's own, then run this command again (a resumed run goes on after the last offset written); \`${repairCommand(dir).replace(' repair ', ' check ')}\` shows this report without writing anything.`,
        { retriable: false },
      );
    }
    this.extraFiles.push(...parts.flatMap((p) => p.extra));
    const { groups, entries } = this.journal.recover(this.topics.size > 0);
    for (const [g, triples] of Object.entries(groups)) this.groups.setOffsets(g, triples);
    for (const entry of entries) this.replay(entry);
    this.clampOffsets();
    if (readOnly) return;
    // A repaired journal (or checkpoint) is retired at once: the checkpoint of what was recovered starts a new one.
    if (this.journal.repaired) {
      this.flush();
      this.journal.checkpoint(this.groups.snapshot());
    }
    // What the files hold now is the record from here on; forced to disk first (an earlier process may have
    // left it in the page cache), so that the manifest never lists records a machine crash could take back.
    for (const p of parts) {
      p.flush(true);
      p.markDurable();
    }
    this.recovering = false;
    this.saveManifest(false);
    // After the manifest: a deletion by retention is listed before it happens (Partition.applyRetention).
    this.applyRetention();
    if (state !== 'present') for (const [name, t] of this.topics) writeFileDurably(join(topicsDir, name, 'meta.json'), JSON.stringify({ ...t.spec, manifest: true }));
  }

  private openPartition(topic: string, index: number, retention: TopicSpec['retention'], record: PartitionRecord | null, goneReason: string | undefined): Partition {
    const dir = join(this.options.dir, 'topics', topic, String(index));
    const written = record ? this.writtenMark(topic, index) : undefined;
    const expect = { record, clean: this.closedCleanly === true, ...(goneReason ? { goneReason } : {}), ...(written !== undefined ? { written: written.high, writing: written.writing } : {}) };
    return new Partition(topic, index, dir, this.segmentConfig, this.logger, retention, expect, (now) => this.layoutChanged(now));
  }

  /**
   * A topic the manifest lists whose directory is gone: each partition that held records lost them all. A plain
   * open refuses; a repair creates the topic again (its partitions go on at their old high-water marks, the loss
   * listed); a read-only open reports it. One that held nothing is created again without a word.
   */
  private recoverMissingTopic(name: string, rec: TopicRecord): void {
    const { readOnly, repair } = this.options;
    const tdir = join(this.options.dir, 'topics', name);
    const lost = rec.partitions.flatMap((p, i) => (highOf(p) > lowOf(p) ? [`${tdir}: topic directory missing: ${describeRange(lowOf(p), highOf(p))} of ${name}/${i} are lost`] : []));
    if (lost.length > 0 && !readOnly && !repair) {
      this.refusals.push(...lost);
      return;
    }
    const spec: TopicSpec = { name, partitions: rec.partitions.length, ...(rec.retention ? { retention: { ...rec.retention } } : {}) };
    if (!readOnly) mkdirSync(tdir, { recursive: true });
    const partitions = rec.partitions.map((p, i) => this.openPartition(name, i, spec.retention, p, 'topic directory missing'));
    if (!readOnly) {
      fsyncDir(tdir);
      writeFileDurably(join(tdir, 'meta.json'), JSON.stringify({ ...spec, manifest: true }));
      fsyncDir(join(this.options.dir, 'topics'));
    }
    this.topics.set(name, { spec, partitions });
  }

  /**
   * A partition rolled a segment (`now` false) or is about to delete some (`now` true). A roll is listed a moment
   * later, once for all the rolls meanwhile: a durable write in every roll costs small segments a third of their
   * produce rate (measured with 1 MiB segments), and a roll not yet listed is recognised on open (Partition).
   * A deletion is listed before it happens, or the next open would take it for a loss.
   */
  private layoutChanged(now: boolean): void {
    if (this.recovering || this.options.readOnly || this.closed) return;
    if (now) {
      this.saveManifest(false);
      return;
    }
    this.manifestTimer ??= setTimeout(() => {
      this.manifestTimer = null;
      if (!this.closed) this.saveManifest(false);
    }, MANIFEST_DELAY_MS);
    this.manifestTimer.unref();
  }

  /**
   * Note every partition's high-water mark in written.json right after each append (see written.ts). Its
   * segment bytes are already in the page cache (a plain write) when the mark is written, so a SIGKILL leaves a
   * mark at most one append behind what the files hold, never ahead of it.
   */
  private noteWritten(writing?: Map<Partition, number>): void {
    if (this.recovering || this.options.readOnly || this.closed) return;
    this.writtenNotes.note(
      [...this.topics].flatMap(([name, t]) =>
        t.partitions.map((p): [string, number, number, number?] => {
          const w = writing?.get(p);
          return w !== undefined ? [name, p.index, p.high, w] : [name, p.index, p.high];
        }),
      ),
    );
  }

  /** Write the manifest from each partition's last durable entry (see manifest.ts). */
  private saveManifest(clean: boolean): void {
    if (this.manifestTimer) clearTimeout(this.manifestTimer);
    this.manifestTimer = null;
    const topics: LogManifest['topics'] = {};
    for (const [name, t] of this.topics) {
      topics[name] = { partitions: t.partitions.map((p) => p.durable ?? p.snapshot()), ...(t.spec.retention ? { retention: t.spec.retention } : {}) };
    }
    writeManifest(this.options.dir, { version: 1, clean, topics });
  }

  /**
   * A topic's spec from its meta.json, checked against its partition directories; null for a topic directory
   * left by a crash inside createTopic (no meta.json, no records). Anything else that does not add up fails
   * with LOG_CORRUPT, or is rewritten from the partition directories when repairing.
   */
  private readTopicMeta(topicsDir: string, name: string, listed: boolean): TopicSpec | null {
    const dir = join(topicsDir, name);
    const metaPath = join(dir, 'meta.json');
    const entries = readdirSync(dir, { withFileTypes: true }).filter((f) => /^\d+$/.test(f.name));
    for (const f of entries.filter((e) => !e.isDirectory())) {
      // A file where a partition directory belongs: moved aside by repair, and the partition is then missing.
      const path = join(dir, f.name);
      const what = `is ${f.isFile() ? 'a file' : 'not a directory'} where the directory of partition ${f.name} of topic ${name} belongs`;
      if (!this.options.readOnly && !this.options.repair) throw wrongKindError(this.options.dir, path, 'directory')!;
      if (this.options.repair) renameSync(path, asideName(path));
      this.extraFiles.push({ topic: name, partition: Number(f.name), file: path, reason: what, quarantine: this.options.repair ? asideName(path) : null });
    }
    const partitionDirs = entries.filter((e) => e.isDirectory()).map((e) => Number(e.name));
    const holding = partitionDirs.filter((p) => readdirSync(join(dir, String(p)), { withFileTypes: true }).some((f) => /\.log$/.test(f.name) && f.isFile() && fileSize(join(dir, String(p), f.name)) > 0));
    const count = partitionDirs.length === 0 ? 0 : Math.max(...partitionDirs) + 1;
    const rewrite = (why: string, retention?: TopicSpec['retention']): TopicSpec => {
      const spec: TopicSpec = { name, partitions: count, ...(retention ? { retention } : {}) };
      this.logger.warn('embedded log: meta.json rewritten from the partition directories', { file: metaPath, why, partitions: count });
      writeFileDurably(metaPath, JSON.stringify({ ...spec, manifest: true }));
      return spec;
    };
    const repairDoes = `write it anew with the ${count} partitions found in ${dir} (a retention setting it held is lost)`;
    if (!existsSync(metaPath)) {
      if (holding.length === 0) return null; // a crash inside createTopic before its meta was renamed in
      if (this.options.repair) return rewrite('missing');
      throw corruptError(this.options.dir, metaPath, `is missing, yet partitions ${holding.join(', ')} of topic ${name} hold records`, repairDoes);
    }
    let spec: TopicSpec;
    try {
      const parsed = readJsonFile(this.options.dir, metaPath, repairDoes);
      const ok = typeof parsed === 'object' && parsed !== null && (parsed as TopicSpec).name === name && Number.isInteger((parsed as TopicSpec).partitions) && (parsed as TopicSpec).partitions > 0;
      if (!ok) throw corruptError(this.options.dir, metaPath, `is not the spec of topic ${name} ({ name, partitions >= 1, retention? })`, repairDoes);
      const { manifest: _marker, ...rest } = parsed as TopicSpec & { manifest?: unknown };
      spec = rest;
    } catch (err) {
      if (this.options.repair) return rewrite('unreadable');
      throw err;
    }
    const beyond = holding.filter((p) => p >= spec.partitions);
    if (beyond.length > 0) {
      if (this.options.repair) return rewrite(`named ${spec.partitions} partitions`, spec.retention);
      throw corruptError(this.options.dir, metaPath, `names ${spec.partitions} partitions, but partitions ${beyond.join(', ')} of topic ${name} hold records`, `set the count to the ${count} partitions found`);
    }
    // createTopic makes every partition directory before meta.json: one missing now was deleted.
    const lost = Array.from({ length: spec.partitions }, (_, p) => p).filter((p) => !partitionDirs.includes(p));
    // A topic the manifest lists: each missing partition reports its own lost range (Partition).
    if (lost.length > 0 && !listed) {
      if (!this.options.repair) throw corruptError(this.options.dir, join(dir, String(lost[0])), `is missing: partitions ${lost.join(', ')} of topic ${name} are gone (their records are lost)`, 'create them empty');
      this.logger.warn('embedded log: partition directories missing, created empty', { topic: name, partitions: lost });
    }
    return spec;
  }

  /**
   * Committed offsets past their partition's end (records lost to damage at the end) move back to the end:
   * otherwise the group would skip the records appended next, at offsets it believes it has read.
   */
  private clampOffsets(): void {
    for (const [group, triples] of Object.entries(this.groups.snapshot())) {
      const fixed: OffsetTriple[] = [];
      for (const [topic, partition, offset] of triples) {
        const p = this.topics.get(topic)?.partitions[partition];
        if (!p || offset <= p.high) continue;
        fixed.push([topic, partition, p.high]);
        this.clamped.push({ group, topic, partition, from: offset, to: p.high });
        this.logger.warn('embedded log: committed offset past the partition end moved back to it', { group, topic, partition, committed: offset, high: p.high });
      }
      if (fixed.length === 0) continue;
      if (this.options.readOnly) this.groups.setOffsets(group, fixed);
      else this.commitOffsets(group, fixed);
    }
  }

  /** What the log's files have lost: gaps listed by its partitions, found by this open, skipped, clamped. */
  damageReport(): DamageReport {
    const parts = [...this.topics.values()].flatMap((t) => t.partitions);
    return {
      gaps: parts.flatMap((p) => p.damage).sort((a, b) => a.foundMs - b.foundMs),
      foundNow: parts.flatMap((p) => p.found),
      skipped: parts.filter((p) => p.gapOffsetsSkipped > 0).map((p) => ({ topic: p.topic, partition: p.index, offsets: p.gapOffsetsSkipped })),
      clamped: [...this.clamped],
      extra: [...this.extraFiles],
      manifest: this.manifestState,
      closedCleanly: this.closedCleanly,
      lock: this.lock ? this.lock.tookOver : this.options.readOnly ? inspectLock(this.options.dir) : null,
    };
  }

  /** Apply a journal entry again; transactions are idempotent per partition (by their base offset). */
  private replay(entry: JournalEntry): void {
    if (entry.kind === 'offsets') {
      this.groups.setOffsets(entry.group, entry.offsets);
      return;
    }
    for (const part of entry.parts) {
      const partition = this.topics.get(part.topic)?.partitions[part.partition];
      if (!partition) {
        this.logger.warn('embedded log: journal names an unknown partition', { topic: part.topic, partition: part.partition });
        continue;
      }
      const batch = batchFromBlob(part.blob, this.segmentConfig.maxBodyBytes);
      const count = batch.ends.length;
      if (partition.high >= part.base + count) continue; // fully applied before the crash
      if (this.options.readOnly) {
        this.logger.warn('embedded log: a journaled transaction is not fully in its partition; a read-write open completes it', { topic: part.topic, partition: part.partition, base: part.base, records: count });
        continue;
      }
      if (partition.high >= part.base) {
        if (partition.high > part.base) partition.truncateTo(part.base);
        partition.append(batch);
      } else {
        // Records before this transaction were lost (only possible with fsync 'none' and a machine crash):
        // keep the transaction, at the offsets that are next now.
        this.logger.warn('embedded log: transaction replayed at a lower offset', { topic: part.topic, partition: part.partition, planned: part.base, high: partition.high });
        const records: PlainRecord[] = [];
        const view = new DataView(batch.buf.buffer, batch.buf.byteOffset, batch.buf.length);
        for (let i = 0, pos = 0; i < count; pos = batch.ends[i]!, i++) records.push(readRecordAt(view, batch.buf, pos, part.topic, part.partition));
        partition.append(encodeBatch(records, partition.high));
      }
    }
    for (const [g, triples] of entry.offsets) this.groups.setOffsets(g, triples);
  }

  checkOpen(): void {
    if (this.closed) throw new RlstreamError('LOG_CLOSED', `embedded log ${this.options.dir} is closed`);
  }

  private checkWritable(what: string): void {
    this.checkOpen();
    if (this.options.readOnly) throw new RlstreamError('LOG_READ_ONLY', `embedded log ${this.options.dir} is open read-only: cannot ${what}`);
  }

  private topic(name: string): Topic {
    const t = this.topics.get(name);
    if (!t) throw new RlstreamError('LOG_UNKNOWN_TOPIC', `topic ${name} does not exist`);
    return t;
  }

  partition(topic: string, index: number): Partition {
    const t = this.topic(topic);
    const p = Number.isInteger(index) ? t.partitions[index] : undefined;
    if (!p) throw new RlstreamError('LOG_UNKNOWN_PARTITION', `topic ${topic} has no partition ${index} (it has ${t.partitions.length})`);
    return p;
  }

  async createTopic(spec: TopicSpec): Promise<void> {
    this.checkOpen();
    checkTopicSpec(spec);
    const existing = this.topics.get(spec.name);
    if (existing) {
      if (existing.spec.partitions !== spec.partitions) {
        throw new RlstreamError('LOG_TOPIC_EXISTS', `topic ${spec.name} exists with ${existing.spec.partitions} partitions, not ${spec.partitions}`);
      }
      return;
    }
    this.checkWritable(`create topic ${spec.name}`);
    const dir = join(this.options.dir, 'topics', spec.name);
    mkdirSync(dir, { recursive: true });
    const clean: TopicSpec = { name: spec.name, partitions: spec.partitions, ...(spec.retention ? { retention: { ...spec.retention } } : {}) };
    const partitions = Array.from({ length: spec.partitions }, (_, p) => this.openPartition(spec.name, p, clean.retention, null, undefined));
    for (const p of partitions) p.markDurable();
    // Durable before it is used: the partition directories (their segments fsynced their own directories),
    // then the manifest listing the topic, then meta.json by rename, then the topic's entry in topics/. A crash
    // before meta.json leaves a topic directory without it and no records: the next open ignores it.
    fsyncDir(dir);
    this.topics.set(spec.name, { spec: clean, partitions });
    this.saveManifest(false);
    writeFileDurably(join(dir, 'meta.json'), JSON.stringify({ ...clean, manifest: true }));
    fsyncDir(join(this.options.dir, 'topics'));
  }

  async listTopics(): Promise<TopicSpec[]> {
    this.checkOpen();
    return [...this.topics.values()].map((t) => ({ ...t.spec }));
  }

  async offsets(topic: string): Promise<PartitionOffsets[]> {
    this.checkOpen();
    return this.topic(topic).partitions.map((p) => ({ partition: p.index, low: p.low, high: p.high }));
  }

  async offsetsForTimestamp(topic: string, timestampMs: number): Promise<TopicPartitionOffset[]> {
    this.checkOpen();
    return this.topic(topic).partitions.map((p) => ({ topic, partition: p.index, offset: p.offsetForTimestamp(timestampMs) }));
  }

  async committed(groupId: string, topic: string): Promise<TopicPartitionOffset[]> {
    this.checkOpen();
    this.topic(topic);
    return this.groups.committed(groupId, topic).map(([t, partition, offset]) => ({ topic: t, partition, offset }));
  }

  /** Lag per partition; a partition without a committed offset reports committed -1 and all it holds as lag. */
  async lag(groupId: string, topic: string): Promise<GroupLag[]> {
    this.checkOpen();
    return this.topic(topic).partitions.map((p) => {
      const c = this.groups.committedOffset(groupId, topic, p.index);
      return { topic, partition: p.index, committed: c ?? -1, high: p.high, lag: c === undefined ? p.high - p.low : Math.max(0, p.high - c) };
    });
  }

  async producer(options: ProducerOptions = {}): Promise<Producer> {
    this.checkOpen();
    return new EmbeddedProducer(this, options);
  }

  async consumer(options: ConsumerOptions): Promise<Consumer> {
    this.checkOpen();
    const c = new EmbeddedConsumer(this, options);
    this.consumers.add(c);
    return c;
  }

  // ---- host interface for producers and consumers ----

  prepare(topic: string, records: ProduceRecord[], partitioner: Partitioner): { partition: number; record: PlainRecord }[] {
    const t = this.topic(topic);
    const n = t.partitions.length;
    return records.map((r, i) => {
      if (!Buffer.isBuffer(r.value)) throw new RlstreamError('INPUT_INVALID', `record ${i} for ${topic}: value must be a Buffer`);
      const partition = partitioner.partition(r, n);
      if (!Number.isInteger(partition) || partition < 0 || partition >= n) throw new RlstreamError('LOG_UNKNOWN_PARTITION', `topic ${topic} has no partition ${partition} (it has ${n})`);
      const record: PlainRecord = {
        key: r.key === undefined || r.key === null ? null : typeof r.key === 'string' ? Buffer.from(r.key) : r.key,
        value: r.value,
        timestamp: r.timestamp ?? Date.now(),
        headers: r.headers ? { ...r.headers } : {},
      };
      const size = encodedSize(record);
      if (size > this.options.maxRecordBytes) throw new RlstreamError('LOG_RECORD_TOO_LARGE', `record ${i} for ${topic} takes ${size} bytes, more than maxRecordBytes ${this.options.maxRecordBytes}`);
      return { partition, record };
    });
  }

  append(topic: string, prepared: { partition: number; record: PlainRecord }[]): RecordPosition[] {
    this.checkWritable(`send to ${topic}`);
    const byPartition = new Map<number, number[]>();
    prepared.forEach((p, i) => byPartition.set(p.partition, [...(byPartition.get(p.partition) ?? []), i]));
    const out: RecordPosition[] = new Array(prepared.length);
    // before the segment writes: the marks they are about to reach (written.ts)
    this.noteWritten(new Map([...byPartition].map(([index, which]) => [this.partition(topic, index), this.partition(topic, index).high + which.length])));
    for (const [index, which] of byPartition) {
      const partition = this.partition(topic, index);
      const base = partition.high;
      const records = which.map((i) => prepared[i]!.record);
      partition.append(encodeBatch(records, base, this.arenaRegions([batchSize(records)])[0]));
      which.forEach((i, k) => (out[i] = { topic, partition: index, offset: base + k }));
      if (this.options.fsync === 'always') partition.flush();
    }
    this.noteWritten();
    return out;
  }

  bumpEpoch(transactionalId: string): number {
    const e = (this.epochs.get(transactionalId) ?? 0) + 1;
    this.epochs.set(transactionalId, e);
    return e;
  }

  currentEpoch(transactionalId: string): number {
    return this.epochs.get(transactionalId) ?? 0;
  }

  committedOffset(groupId: string, topic: string, partition: number): number | undefined {
    return this.groups.committedOffset(groupId, topic, partition);
  }

  commitOffsets(groupId: string, triples: OffsetTriple[]): void {
    this.checkWritable(`commit offsets of group ${groupId}`);
    for (const [t, p, o] of triples) {
      this.partition(t, p);
      if (!Number.isInteger(o) || o < 0) throw new RlstreamError('INPUT_INVALID', `offset for ${t}/${p} must be a non-negative integer, got ${o}`);
    }
    this.journal.append({ kind: 'offsets', group: groupId, offsets: triples }, this.options.fsync === 'always');
    this.groups.setOffsets(groupId, triples);
    this.maybeCheckpoint();
  }

  /** One journal entry, then the records into their partitions and the offsets into their groups. */
  commitTransaction(transactionalId: string, parts: PendingPart[], offsets: Map<string, OffsetTriple[]>): void {
    this.checkWritable(`commit transaction ${transactionalId}`);
    if (parts.length === 0 && offsets.size === 0) return;
    for (const triples of offsets.values()) for (const [t, p] of triples) this.partition(t, p);
    const regions = this.arenaRegions(parts.map((p) => batchSize(p.records)));
    const batches = parts.map((p, i) => ({ part: p, partition: this.partition(p.topic, p.partition), batch: encodeBatch(p.records, this.partition(p.topic, p.partition).high, regions[i]) }));
    const journalParts: TxnPart[] = batches.map(({ part, batch }) => ({ topic: part.topic, partition: part.partition, base: batch.baseOffset, blob: batch.buf, blobCrc: batch.crc }));
    this.journal.append({ kind: 'txn', transactionalId, offsets, parts: journalParts }, this.options.fsync !== 'none');
    if (batches.length > 0) this.noteWritten(new Map(batches.map(({ partition, part }) => [partition, partition.high + part.records.length])));
    for (const { partition, batch } of batches) partition.append(batch);
    if (batches.length > 0) this.noteWritten();
    for (const [g, triples] of offsets) this.groups.setOffsets(g, triples);
    this.maybeCheckpoint();
  }

  /** Consecutive regions of the reusable batch buffer of these sizes, valid until the next call. */
  private arenaRegions(sizes: number[]): Buffer[] {
    const total = sizes.reduce((a, b) => a + b, 0);
    if (this.arena.length < total || this.arena.length > Math.max(total, ARENA_KEPT_BYTES)) {
      this.arena = Buffer.allocUnsafe(total <= ARENA_KEPT_BYTES ? Math.max(total, Math.min(2 * this.arena.length, ARENA_KEPT_BYTES)) : total);
    }
    let pos = 0;
    return sizes.map((n) => this.arena.subarray(pos, (pos += n)));
  }

  join(groupId: string, member: GroupMember): void {
    this.groups.join(groupId, member);
  }

  leave(groupId: string, member: GroupMember): void {
    this.groups.leave(groupId, member);
    if (member instanceof EmbeddedConsumer) this.consumers.delete(member);
  }

  private maybeCheckpoint(): void {
    if (this.journal.bytes <= this.options.journalMaxBytes) return;
    // The checkpoint forgets the journal's transaction records, so they must be on disk in their partitions.
    if (this.options.fsync !== 'none') {
      for (const t of this.topics.values()) {
        for (const p of t.partitions) {
          p.flush();
          p.markDurable();
        }
      }
      this.saveManifest(false);
    }
    this.journal.checkpoint(this.groups.snapshot());
  }

  /** Delete segments beyond each topic's retention; returns how many went. */
  applyRetention(now = Date.now()): number {
    if (this.options.readOnly) return 0;
    let n = 0;
    for (const t of this.topics.values()) for (const p of t.partitions) n += p.applyRetention(now);
    return n;
  }

  /** Force everything written so far to disk. */
  flush(): void {
    for (const t of this.topics.values()) for (const p of t.partitions) p.flush();
  }

  async close(): Promise<void> {
    if (this.closed) return;
    for (const c of [...this.consumers]) await c.close();
    if (this.timer) clearInterval(this.timer);
    if (this.options.fsync !== 'none') this.flush();
    if (!this.options.readOnly) {
      // Every record written is listed: the next open takes any of them missing for damage, not a torn tail.
      for (const t of this.topics.values()) for (const p of t.partitions) p.markDurable();
      this.saveManifest(true);
      this.writtenNotes.forget();
    }
    this.closed = true;
    for (const t of this.topics.values()) for (const p of t.partitions) p.close();
    this.journal.close(this.options.fsync !== 'none');
    this.lock?.release();
  }
}

/** Whether a topic's meta.json says the log had a manifest when it was written (see manifest.ts). */
function metaMarked(topicDir: string): boolean {
  try {
    return (JSON.parse(readFileSync(join(topicDir, 'meta.json'), 'utf8')) as { manifest?: unknown }).manifest === true;
  } catch {
    return false;
  }
}

function fileSize(path: string): number {
  try {
    return statSync(path).size;
  } catch {
    return 0;
  }
}

export function openEmbeddedLog(options: EmbeddedLogOptions, logger?: Logger): EmbeddedLog {
  return EmbeddedLog.open(options, logger);
}

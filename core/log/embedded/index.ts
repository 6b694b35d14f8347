// The embedded event log: a file-backed log inside the process (topics of partitions of segments, consumer
// groups, transactions through a write-ahead journal), with the same semantics as Kafka (core/log/types.ts).
// Layout: <dir>/LOCK, <dir>/checkpoint.json, <dir>/journal-N.log, <dir>/topics/<topic>/{meta.json,<p>/}.
// All file I/O is synchronous on purpose: an append or a commit runs start to end without another task in
// between, which is what makes offsets assignment and transaction application atomic within the process.
import { closeSync, existsSync, fsyncSync, mkdirSync, openSync, readFileSync, readdirSync, renameSync, writeSync } from 'node:fs';
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
import { GroupCoordinator, type GroupMember } from './groups.ts';
import { Journal, type JournalEntry, type OffsetTriple, type TxnPart } from './journal.ts';
import { DirectoryLock } from './lock.ts';
import { type CompiledEmbeddedLogOptions, type EmbeddedLogOptions, compileEmbeddedLogOptions } from './options.ts';
import { Partition } from './partition.ts';
import { EmbeddedProducer, type PendingPart } from './producer.ts';
import { type PlainRecord, batchFromBlob, batchSize, encodeBatch, encodedSize, readRecordAt } from './record-format.ts';

export type { EmbeddedLogOptions, FsyncPolicy } from './options.ts';

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

  private constructor(
    readonly options: CompiledEmbeddedLogOptions,
    private readonly lock: DirectoryLock,
    private readonly logger: Logger,
  ) {
    this.groups = new GroupCoordinator((t) => this.topic(t).partitions.length);
    this.journal = new Journal(options.dir, logger);
  }

  /** Open (and recover) a log directory; fails with LOG_LOCKED when another process holds it. */
  static open(input: EmbeddedLogOptions, logger: Logger = silentLogger): EmbeddedLog {
    const options = compileEmbeddedLogOptions(input);
    mkdirSync(join(options.dir, 'topics'), { recursive: true });
    const lock = DirectoryLock.acquire(options.dir);
    try {
      const log = new EmbeddedLog(options, lock, logger.child({ component: 'embedded-log' }));
      log.recover();
      if (options.retentionCheckMs > 0) {
        log.timer = setInterval(() => log.applyRetention(), options.retentionCheckMs);
        log.timer.unref();
      }
      return log;
    } catch (err) {
      lock.release();
      throw err;
    }
  }

  private get segmentConfig() {
    return { segmentBytes: this.options.segmentBytes, indexIntervalBytes: this.options.indexIntervalBytes, maxBodyBytes: this.options.maxRecordBytes + 64 * 1024 };
  }

  private recover(): void {
    const topicsDir = join(this.options.dir, 'topics');
    for (const name of readdirSync(topicsDir)) {
      const metaPath = join(topicsDir, name, 'meta.json');
      if (!existsSync(metaPath)) continue; // a crash inside createTopic before its meta was renamed in
      const spec = JSON.parse(readFileSync(metaPath, 'utf8')) as TopicSpec;
      const partitions = Array.from({ length: spec.partitions }, (_, p) => new Partition(name, p, join(topicsDir, name, String(p)), this.segmentConfig, this.logger, spec.retention));
      this.topics.set(name, { spec, partitions });
    }
    const { groups, entries } = this.journal.recover();
    for (const [g, triples] of Object.entries(groups)) this.groups.setOffsets(g, triples);
    for (const entry of entries) this.replay(entry);
    this.applyRetention();
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
    const dir = join(this.options.dir, 'topics', spec.name);
    mkdirSync(dir, { recursive: true });
    const clean: TopicSpec = { name: spec.name, partitions: spec.partitions, ...(spec.retention ? { retention: { ...spec.retention } } : {}) };
    const partitions = Array.from({ length: spec.partitions }, (_, p) => new Partition(spec.name, p, join(dir, String(p)), this.segmentConfig, this.logger, clean.retention));
    const tmp = join(dir, 'meta.json.tmp');
    const fd = openSync(tmp, 'w');
    writeSync(fd, JSON.stringify(clean));
    fsyncSync(fd);
    closeSync(fd);
    renameSync(tmp, join(dir, 'meta.json'));
    this.topics.set(spec.name, { spec: clean, partitions });
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
    this.checkOpen();
    const byPartition = new Map<number, number[]>();
    prepared.forEach((p, i) => byPartition.set(p.partition, [...(byPartition.get(p.partition) ?? []), i]));
    const out: RecordPosition[] = new Array(prepared.length);
    for (const [index, which] of byPartition) {
      const partition = this.partition(topic, index);
      const base = partition.high;
      const records = which.map((i) => prepared[i]!.record);
      partition.append(encodeBatch(records, base, this.arenaRegions([batchSize(records)])[0]));
      which.forEach((i, k) => (out[i] = { topic, partition: index, offset: base + k }));
      if (this.options.fsync === 'always') partition.flush();
    }
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
    this.checkOpen();
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
    this.checkOpen();
    if (parts.length === 0 && offsets.size === 0) return;
    for (const triples of offsets.values()) for (const [t, p] of triples) this.partition(t, p);
    const regions = this.arenaRegions(parts.map((p) => batchSize(p.records)));
    const batches = parts.map((p, i) => ({ part: p, partition: this.partition(p.topic, p.partition), batch: encodeBatch(p.records, this.partition(p.topic, p.partition).high, regions[i]) }));
    const journalParts: TxnPart[] = batches.map(({ part, batch }) => ({ topic: part.topic, partition: part.partition, base: batch.baseOffset, blob: batch.buf, blobCrc: batch.crc }));
    this.journal.append({ kind: 'txn', transactionalId, offsets, parts: journalParts }, this.options.fsync !== 'none');
    for (const { partition, batch } of batches) partition.append(batch);
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
    if (this.options.fsync !== 'none') for (const t of this.topics.values()) for (const p of t.partitions) p.flush();
    this.journal.checkpoint(this.groups.snapshot());
  }

  /** Delete segments beyond each topic's retention; returns how many went. */
  applyRetention(now = Date.now()): number {
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
    this.closed = true;
    for (const t of this.topics.values()) for (const p of t.partitions) p.close();
    this.journal.close();
    this.lock.release();
  }
}

export function openEmbeddedLog(options: EmbeddedLogOptions, logger?: Logger): EmbeddedLog {
  return EmbeddedLog.open(options, logger);
}

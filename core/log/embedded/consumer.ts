// A consumer of the embedded log: a group member that polls its assigned partitions from in-process
// positions. An empty poll parks on the partitions' append notifications (no busy polling) until a record
// arrives, the assignment changes, the consumer closes, or timeoutMs passes.
import { RlstreamError } from '../../errors.ts';
import type { Consumer, ConsumerOptions, LogRecord, PollOptions, RecordChunk, TopicPartitionOffset } from '../types.ts';
import type { FrameChunk } from './chunk.ts';
import { type GroupMember, type TopicPartition, tpKey } from './groups.ts';
import type { OffsetTriple } from './journal.ts';
import type { Partition, ReadCursor } from './partition.ts';
import { READ_CHUNK } from './segment.ts';

/** What a consumer needs from the log that owns it. */
export interface ConsumerHost {
  partition(topic: string, index: number): Partition;
  committedOffset(groupId: string, topic: string, partition: number): number | undefined;
  commitOffsets(groupId: string, triples: OffsetTriple[]): void;
  join(groupId: string, member: GroupMember): void;
  leave(groupId: string, member: GroupMember): void;
  checkOpen(): void;
}

interface Position {
  topic: string;
  partition: number;
  cursor: ReadCursor;
  /** Moved by poll or seek since assignment: commit() without arguments commits it. */
  touched: boolean;
}

const DEFAULT_MAX_RECORDS = 500;
const DEFAULT_TIMEOUT_MS = 1000;
const POLL_MAX_BYTES = 8 * 1024 * 1024;
/** Read buffers kept for reuse (a poll reads at most POLL_MAX_BYTES, in reads of READ_CHUNK). */
const SPARE_READ_BUFFERS = 2 * (POLL_MAX_BYTES / READ_CHUNK);
let nextMemberId = 1;

export class EmbeddedConsumer implements Consumer, GroupMember {
  readonly memberId = nextMemberId++;
  readonly topics: readonly string[];
  private positions = new Map<string, Position>();
  private rotate = 0;
  private closed = false;
  private kick: (() => void) | null = null;
  /** Read buffers released by the caller, and those lent out in chunks (weakly: a chunk never released is garbage). */
  private readonly spare: ArrayBuffer[] = [];
  private readonly lent = new WeakSet<ArrayBuffer>();
  private readonly alloc = (bytes: number): Buffer => {
    if (bytes > READ_CHUNK) return Buffer.allocUnsafe(bytes);
    const ab = this.spare.pop() ?? (Buffer.allocUnsafe(READ_CHUNK).buffer as ArrayBuffer); // its own, uninitialized
    this.lent.add(ab);
    return Buffer.from(ab, 0, bytes);
  };

  constructor(
    private readonly host: ConsumerHost,
    private readonly options: ConsumerOptions,
  ) {
    this.topics = [...new Set(options.topics)];
    for (const t of this.topics) host.partition(t, 0); // unknown topic → LOG_UNKNOWN_TOPIC before joining
    host.join(options.groupId, this);
  }

  assign(partitions: TopicPartition[]): void {
    const next = new Map<string, Position>();
    for (const { topic, partition } of partitions) {
      const key = tpKey(topic, partition);
      const kept = this.positions.get(key);
      if (kept) {
        next.set(key, kept);
        continue;
      }
      const p = this.host.partition(topic, partition);
      const offset = this.host.committedOffset(this.options.groupId, topic, partition) ?? (this.options.fromBeginning === false ? p.high : p.low);
      next.set(key, { topic, partition, cursor: { offset, segmentBase: -1, pos: 0 }, touched: false });
    }
    this.positions = next;
    this.kick?.();
  }

  private check(): void {
    if (this.closed) throw new RlstreamError('LOG_CLOSED', `consumer of group ${this.options.groupId} is closed`);
    this.host.checkOpen();
  }

  private fetch(maxRecords: number, alloc?: (bytes: number) => Buffer): FrameChunk[] {
    const out: FrameChunk[] = [];
    const list = [...this.positions.values()];
    let records = 0;
    let bytes = 0;
    for (let i = 0; i < list.length && records < maxRecords && bytes < POLL_MAX_BYTES; i++) {
      const pos = list[(this.rotate + i) % list.length]!;
      const read = this.host.partition(pos.topic, pos.partition).readChunks(pos.cursor, out, maxRecords - records, POLL_MAX_BYTES - bytes, alloc);
      if (read.records > 0) pos.touched = true;
      records += read.records;
      bytes += read.bytes;
    }
    this.rotate = list.length > 0 ? (this.rotate + 1) % list.length : 0;
    return out;
  }

  async poll(options: PollOptions = {}): Promise<LogRecord[]> {
    const out: LogRecord[] = [];
    // Buffers of their own: the records refer to them for as long as the caller keeps them.
    for (const c of await this.read(options)) {
      for (let i = 0; i < c.count; i++) out.push(c.recordInPlace(i));
    }
    return out;
  }

  pollChunks(options: PollOptions = {}): Promise<RecordChunk[]> {
    return this.read(options, this.alloc);
  }

  private async read(options: PollOptions, alloc?: (bytes: number) => Buffer): Promise<FrameChunk[]> {
    this.check();
    const maxRecords = Math.max(1, options.maxRecords ?? DEFAULT_MAX_RECORDS);
    const deadline = Date.now() + (options.timeoutMs ?? DEFAULT_TIMEOUT_MS);
    for (;;) {
      const got = this.fetch(maxRecords, alloc);
      if (got.length > 0) return got;
      const left = deadline - Date.now();
      if (left <= 0 || this.closed) return [];
      await this.waitForData(left);
      this.check();
    }
  }

  releaseChunks(chunks: readonly RecordChunk[]): void {
    for (const c of chunks) {
      const ab = c.buf.buffer as ArrayBuffer;
      // Only buffers this consumer lent, once each (chunks of one read share it; a second release is a no-op).
      if (this.lent.delete(ab) && this.spare.length < SPARE_READ_BUFFERS) this.spare.push(ab);
    }
  }

  private waitForData(ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const offs: (() => void)[] = [];
      const done = () => {
        clearTimeout(timer);
        for (const off of offs) off();
        this.kick = null;
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.kick = done;
      for (const pos of this.positions.values()) offs.push(this.host.partition(pos.topic, pos.partition).onAppend(done));
    });
  }

  async commit(offsets?: TopicPartitionOffset[]): Promise<void> {
    this.check();
    const triples: OffsetTriple[] = offsets
      ? offsets.map((o) => [o.topic, o.partition, o.offset])
      : [...this.positions.values()].filter((p) => p.touched).map((p) => [p.topic, p.partition, p.cursor.offset]);
    if (triples.length > 0) this.host.commitOffsets(this.options.groupId, triples);
  }

  private assigned(topic: string, partition: number): Position {
    const pos = this.positions.get(tpKey(topic, partition));
    if (!pos) throw new RlstreamError('LOG_UNKNOWN_PARTITION', `${topic}/${partition} is not assigned to this consumer of group ${this.options.groupId}`);
    return pos;
  }

  async seek(topic: string, partition: number, offset: number): Promise<void> {
    this.check();
    if (!Number.isInteger(offset) || offset < 0) throw new RlstreamError('INPUT_INVALID', `seek offset must be a non-negative integer, got ${offset}`);
    const pos = this.assigned(topic, partition);
    pos.cursor = { offset, segmentBase: -1, pos: 0 };
    pos.touched = true;
  }

  async seekToTimestamp(topic: string, timestampMs: number): Promise<void> {
    this.check();
    for (const pos of this.positions.values()) {
      if (pos.topic !== topic) continue;
      pos.cursor = { offset: this.host.partition(topic, pos.partition).offsetForTimestamp(timestampMs), segmentBase: -1, pos: 0 };
      pos.touched = true;
    }
  }

  assignment(): TopicPartitionOffset[] {
    return [...this.positions.values()].map((p) => ({ topic: p.topic, partition: p.partition, offset: p.cursor.offset }));
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.host.leave(this.options.groupId, this);
    this.kick?.();
  }
}

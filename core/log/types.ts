// The event log contract: what every role may assume of a log, embedded or Kafka.
// Semantics (proven by test/log/conformance.ts against both implementations):
// - records are appended per partition with dense offsets starting at 0; order is kept per partition;
// - a keyed record always goes to the same partition (murmur2 of the key, as Kafka's default partitioner);
// - a consumer group's committed offset is the offset of the *next* record to read;
// - a transaction's records and offsets become visible together or not at all (read_committed).
//
// Durability, per call (what a machine crash, not only a process crash, can take back once the call returned):
// - Kafka: a send and a transaction commit return once every in-sync replica has the records (acks=all); how
//   soon brokers fsync is theirs to say (log.flush.*: by default they leave it to the OS and rely on replicas).
//   An offset commit returns once the group coordinator has written it to __consumer_offsets.
// - Embedded (core/log/embedded, EmbeddedLogOptions.fsync, default 'transaction'): every call has written its
//   bytes to the files (write(2)) before it returns, so a process crash loses nothing returned. Then:
//   Transaction.commit fsyncs its journal entry (records and offsets) unless fsync is 'none'; Producer.send
//   and Consumer.commit fsync only with 'always': otherwise their bytes reach the disk when a segment rolls (the
//   old segment is fsynced), when the journal is checkpointed (every partition is fsynced first), when a later
//   transaction's fsync covers the journal, or at close. createTopic fsyncs meta.json and the directories it
//   created, and a new segment file's directory is fsynced when it is created: a topic or segment that was
//   returned is never lost with its name.

export interface Headers {
  [name: string]: Buffer;
}

export interface ProduceRecord {
  key?: Buffer | string | null;
  value: Buffer;
  /** Explicit partition; otherwise chosen from the key (or round-robin without a key). */
  partition?: number;
  /** Milliseconds since the epoch; defaults to now. */
  timestamp?: number;
  headers?: Headers;
}

export interface RecordPosition {
  topic: string;
  partition: number;
  offset: number;
}

export interface LogRecord extends RecordPosition {
  key: Buffer | null;
  value: Buffer;
  timestamp: number;
  headers: Headers;
}

export interface TopicPartitionOffset {
  topic: string;
  partition: number;
  /** The next offset to read. */
  offset: number;
}

/**
 * A topic's retention. A limit left out is the log's default (the embedded log keeps everything; Kafka applies the
 * broker's log.retention.*); null is no limit on either log, whatever its default (a copy of a log asks for that
 * where its source keeps everything: Kafka's default of days would delete an old run's records minutes after
 * they were copied, their timestamps being the run's).
 */
export interface RetentionOptions {
  /** Delete whole segments whose newest record is older than this (a positive integer, ms). */
  maxAgeMs?: number | null;
  /** Keep at most about this many bytes per partition (whole segments are deleted; a positive integer). */
  maxBytes?: number | null;
}

export interface TopicSpec {
  name: string;
  partitions: number;
  retention?: RetentionOptions;
}

export interface PartitionOffsets {
  partition: number;
  /** First offset still held (after retention). */
  low: number;
  /** Offset the next appended record will get. */
  high: number;
}

export interface GroupLag {
  topic: string;
  partition: number;
  committed: number;
  high: number;
  lag: number;
}

export interface ProducerOptions {
  /** Required for transactions; a second producer with the same id fences the first. */
  transactionalId?: string;
  idempotent?: boolean;
  compression?: 'none' | 'gzip' | 'snappy' | 'lz4' | 'zstd';
}

export interface Producer {
  /** Append records; returns their positions. Durable as the header says: fsynced on the embedded log only with fsync 'always'. */
  send(topic: string, records: ProduceRecord[]): Promise<RecordPosition[]>;
  /** Begin a transaction; only for producers created with a transactionalId. */
  transaction(): Promise<Transaction>;
  close(): Promise<void>;
}

export interface Transaction {
  send(topic: string, records: ProduceRecord[]): Promise<void>;
  /** Commit these consumer-group offsets atomically with the transaction's records. */
  sendOffsets(groupId: string, offsets: TopicPartitionOffset[]): Promise<void>;
  /**
   * A retriable error (RlstreamError.retriable) means the transaction was certainly not committed: abort it and
   * run it again, with a new producer of the same transactionalId (the old one may be unusable). Any other
   * error leaves the outcome unknown. Durable when it returns (the embedded log fsyncs the journal entry unless
   * its fsync option is 'none').
   */
  commit(): Promise<void>;
  abort(): Promise<void>;
}

export interface ConsumerOptions {
  groupId: string;
  topics: string[];
  /** Where to start when the group has no committed offset: earliest (default) or latest. */
  fromBeginning?: boolean;
  /** Records of aborted or open transactions are never returned when true (default true). */
  readCommitted?: boolean;
}

export interface PollOptions {
  maxRecords?: number;
  /** How long to wait for at least one record before returning an empty batch. */
  timeoutMs?: number;
}

/**
 * Records of one partition, in offset order, read in bulk into one buffer (the embedded log's pollChunks), for a
 * consumer that reads records without building a LogRecord each. The chunk says where each record's value lies;
 * how records are framed in buf is the log's own business.
 */
export interface RecordChunk {
  readonly topic: string;
  readonly partition: number;
  /** Offset of the first record; each next record has the next offset. */
  readonly firstOffset: number;
  /** Records in the chunk. */
  readonly count: number;
  /** The bytes the records lie in (chunks of one read may share its ArrayBuffer). */
  readonly buf: Buffer;
  /** Where record i's value starts in buf. */
  valueStart(i: number): number;
  /** The length of record i's value. */
  valueLength(i: number): number;
  /** Record i as a LogRecord whose buffers are its own copies (still valid after releaseChunks). */
  record(i: number): LogRecord;
  /** The chunk's first `count` records. */
  head(count: number): RecordChunk;
}

export interface Consumer {
  /** Next records of the assigned partitions, in offset order per partition. */
  poll(options?: PollOptions): Promise<LogRecord[]>;
  /**
   * The same records as poll, as chunks of frames: the embedded log only (Kafka's client hands records one by
   * one). The trace sink reads this way: a LogRecord, its two Buffer views and their garbage would cost a
   * sizeable share of what transcoding the record natively costs.
   */
  pollChunks?(options?: PollOptions): Promise<RecordChunk[]>;
  /**
   * The caller is done with these chunks from pollChunks: nothing it keeps refers to their bytes (a record
   * kept beyond this was copied out), so the log may read later records into the same memory. Optional for
   * the caller: chunks never released are left to the collector. Reading into fresh buffers costs a drain's main
   * thread several times more in page faults than the read itself.
   */
  releaseChunks?(chunks: readonly RecordChunk[]): void;
  /**
   * Commit offsets (next offset to read); without arguments, the positions after everything polled. Not
   * fsynced by the embedded log unless its fsync option is 'always' (see the header); a commit inside a
   * transaction (Transaction.sendOffsets) is as durable as the transaction. The embedded log moves an offset
   * committed past a partition's end back to the end when it opens (records lost to damage at the end).
   */
  commit(offsets?: TopicPartitionOffset[]): Promise<void>;
  /** Move the read position; the next poll starts there. */
  seek(topic: string, partition: number, offset: number): Promise<void>;
  /** Move every assigned partition of a topic to the first record at or after this time. */
  seekToTimestamp(topic: string, timestampMs: number): Promise<void>;
  /** Partitions currently assigned to this member. */
  assignment(): TopicPartitionOffset[];
  close(): Promise<void>;
}

export interface EventLog {
  readonly kind: 'embedded' | 'kafka';
  /** Idempotent: creating an existing topic with the same partition count is a no-op. Durable when it returns. */
  createTopic(spec: TopicSpec): Promise<void>;
  listTopics(): Promise<TopicSpec[]>;
  offsets(topic: string): Promise<PartitionOffsets[]>;
  /** First offset whose timestamp is >= timestampMs per partition (high when none). */
  offsetsForTimestamp(topic: string, timestampMs: number): Promise<TopicPartitionOffset[]>;
  committed(groupId: string, topic: string): Promise<TopicPartitionOffset[]>;
  lag(groupId: string, topic: string): Promise<GroupLag[]>;
  producer(options?: ProducerOptions): Promise<Producer>;
  consumer(options: ConsumerOptions): Promise<Consumer>;
  close(): Promise<void>;
}

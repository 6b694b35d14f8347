// The exactly-once consume–transform–produce runtime the stream processors (reward, advantage) run on. One
// loop: poll a batch → decode → handler → one transaction carrying the outputs, the dead letters, the
// handler's checkpoints and the consumed offsets.
// Because outputs and offsets commit together, a crash at any moment neither loses nor duplicates output.
//
// Stateful handlers (the advantage consumer holds open groups) report the offsets they still hold
// (`pending`). The committed offset never passes the earliest held record, so a restart re-reads it; and a
// checkpoint of which records above that offset were already finished is written in the same transaction,
// so on restart those records are skipped instead of being emitted twice.
import type { EventName } from '../schemas/index.ts';
import { EVENT_NAMES } from '../schemas/index.ts';
import type { EventTypes } from '../schemas/generated/types.ts';
import { sendDeadLetters } from './deadletter.ts';
import { RlstreamError, describeError } from './errors.ts';
import { newId } from './ids.ts';
import type { Consumer, EventLog, LogRecord, ProduceRecord, Producer, TopicPartitionOffset, Transaction } from './log/types.ts';
import { readToEnd } from './log/read-to-end.ts';
import { retry } from './retry.ts';
import type { DecodedEvent, Encodable, EventSerde } from './serde/events.ts';
import { silentLogger, type Logger } from './telemetry.ts';
import { TOPICS } from './topics.ts';

export interface InputRecord {
  record: LogRecord;
  event: DecodedEvent;
}

export interface OutputEvent<N extends EventName = EventName> {
  topic: string;
  name: N;
  /** Float arrays may be typed arrays (see Encodable): the value is only encoded, never kept. */
  value: EventTypes[N] | Encodable<EventTypes[N]>;
  key: string | null;
}

export interface ProcessContext {
  /** Queue an output for this batch's transaction; `source` is the record it was computed from. */
  emit<N extends EventName>(output: OutputEvent<N>, source: LogRecord): void;
  /** Give up on a record: it goes to the dead-letter topic with the error's code and message. */
  deadLetter(source: LogRecord, error: unknown): void;
  /** Count something in the processor's metrics (e.g. groups emitted, partial groups dropped). */
  count(name: string, n?: number): void;
  readonly now: number;
  /**
   * Whether this consumer has read every record of the partition there is now (its position has reached the
   * partition's end): what a handler asks before the wall clock may close state the log could still complete.
   * Asks the log for the end offsets, once per topic per batch.
   */
  caughtUp(topic: string, partition: number): Promise<boolean>;
  readonly logger: Logger;
}

export interface ProcessorHandler {
  /** One record (a throw dead-letters it). Either this or handleBatch. */
  handle?(input: InputRecord, ctx: ProcessContext): void | Promise<void>;
  /** The whole batch (for batched work such as a reward model); must dead-letter failures itself. */
  handleBatch?(inputs: InputRecord[], ctx: ProcessContext): void | Promise<void>;
  /** Called once per loop, inside the batch's transaction: timeouts emit here. */
  tick?(ctx: ProcessContext): void | Promise<void>;
  /** Offsets of a partition's records still held in state (not yet emitted or dropped), ascending or not. */
  pending?(topic: string, partition: number): Iterable<number>;
  /** Forget the state of a partition (revoked, or the runtime rewinds after a failed transaction). */
  release?(topic: string, partition: number): void;
}

export interface ProcessorOptions {
  /** Processor id: consumer group, transactional id, dead-letter `consumer` field, state topic name. */
  id: string;
  log: EventLog;
  serde: EventSerde;
  inputTopics: string[];
  handler: ProcessorHandler;
  /** Event kinds handled; others on the input topics are skipped (counted). Default: all. */
  accepts?: EventName[];
  /** Collect up to this many records per batch. Default 500. */
  maxBatchRecords?: number;
  /** After the first record arrives, wait up to this long for the batch to fill. Default 0 (take what is there). */
  maxBatchWaitMs?: number;
  /** How long one idle poll waits. Default 100 ms. */
  pollTimeoutMs?: number;
  /** Outputs larger than this are dead-lettered (LOG_RECORD_TOO_LARGE) instead of sent. Default 1 MiB. */
  maxOutputBytes?: number;
  /** Default `${id}`; give each member of a scaled-out group its own (`${id}-${n}`). */
  transactionalId?: string;
  deadLetterTopic?: string;
  /** Where stateful handlers' checkpoints go. Default `_state.${id}` (one partition). */
  stateTopic?: string;
  /**
   * How long a batch's transaction is retried after retriable failures (a busy Kafka coordinator, a broker
   * restarting) before the processor gives up and stops with the error. Default 180 000 ms.
   */
  retryForMs?: number;
  logger?: Logger;
}

export interface ProcessorMetrics {
  recordsIn: number;
  recordsOut: number;
  deadLettered: number;
  skipped: number;
  batches: number;
  transactions: number;
  aborted: number;
  /** Transactions run again after a retriable failure. */
  retried: number;
  /** Wall time spent in transactions (begin to commit, retries included): what the loop waits on the log. */
  transactionMs: number;
  counters: Record<string, number>;
}

interface Checkpoint {
  /** The committed offset written with it. */
  c: number;
  /** Next offset to read at the time. */
  n: number;
  /** Held offsets in [c, n) as [start, end) ranges; every other offset in [c, n) was finished. */
  p: [number, number][];
}

const tpKey = (topic: string, partition: number) => `${topic}:${partition}`;

function toRanges(offsets: number[]): [number, number][] {
  const sorted = [...offsets].sort((a, b) => a - b);
  const out: [number, number][] = [];
  for (const o of sorted) {
    const last = out[out.length - 1];
    if (last && last[1] === o) last[1] = o + 1;
    else if (!last || last[1] <= o) out.push([o, o + 1]);
  }
  return out;
}

/**
 * The offset a transaction commits for a partition: past the last record read (`next`), or the consumer's position
 * where that is further (a Kafka partition may hold transaction markers after its last record, which the consumer
 * has passed: committing past them is what lets the group's lag reach 0), but never past the earliest record still
 * held (read, not finished: a restart must read it again). The stream processors' handlers hold open groups; the
 * trainer holds the records it carries into its next step.
 */
export function commitOffset(next: number, position: number | undefined, held: Iterable<number>): number {
  let c = position !== undefined && position > next ? position : next;
  for (const o of held) if (o < c) c = o;
  return c;
}

function inRanges(ranges: [number, number][], o: number): boolean {
  for (const [a, b] of ranges) if (o >= a && o < b) return true;
  return false;
}

/**
 * A bounded set of recently seen ids with the record each came in (oldest forgotten first), for dropping
 * duplicate inputs: the same id in another record. The same record read again is not a duplicate: a processor
 * reads a record twice only when the log rewound its partition to a committed offset below it, which means the
 * transaction holding the first reading's outputs did not commit, so it must be handled again.
 */
export class RecentIds {
  private readonly ids = new Map<string, string>();
  constructor(private readonly capacity = 100_000) {}
  /** True when the id was already seen in another record; records it otherwise. */
  seen(id: string, record: { topic: string; partition: number; offset: number }): boolean {
    const at = `${record.topic}:${record.partition}:${record.offset}`;
    const first = this.ids.get(id);
    if (first !== undefined) return first !== at;
    this.ids.set(id, at);
    if (this.ids.size > this.capacity) this.ids.delete(this.ids.keys().next().value as string);
    return false;
  }
}

export class StreamProcessor {
  private readonly opts: Required<Omit<ProcessorOptions, 'accepts' | 'transactionalId' | 'stateTopic' | 'deadLetterTopic' | 'logger'>> & ProcessorOptions;
  private readonly logger: Logger;
  private readonly stateful: boolean;
  private readonly stateTopic: string;
  private readonly skipIds = new Set<number>();
  private consumer: Consumer | undefined;
  private producer: Producer | undefined;
  private stopping = false;
  private running: Promise<void> | undefined;
  /** Next offset to read per partition, from what was polled. */
  private readonly next = new Map<string, { topic: string; partition: number; offset: number }>();
  /** Restored checkpoints: records in [c, n) outside the held ranges were finished before a restart. */
  private readonly restored = new Map<string, Checkpoint>();
  private readonly known = new Set<string>();
  private readonly m: ProcessorMetrics = { recordsIn: 0, recordsOut: 0, deadLettered: 0, skipped: 0, batches: 0, transactions: 0, aborted: 0, retried: 0, transactionMs: 0, counters: {} };

  constructor(options: ProcessorOptions) {
    this.opts = { maxBatchRecords: 500, maxBatchWaitMs: 0, pollTimeoutMs: 100, maxOutputBytes: 1 << 20, retryForMs: 180_000, ...options };
    this.logger = (options.logger ?? silentLogger).child({ processor: options.id });
    this.stateful = typeof options.handler.pending === 'function';
    this.stateTopic = options.stateTopic ?? `_state.${options.id}`;
    if (options.accepts) {
      // Current schema ids of events we do not handle: skipped without decoding (rollout.events is mostly turns).
      for (const name of EVENT_NAMES) if (!options.accepts.includes(name)) this.skipIds.add(options.serde.schemaId(name));
    }
  }

  metrics(): ProcessorMetrics {
    return { ...this.m, counters: { ...this.m.counters } };
  }

  /** Records not yet consumed by this processor's group, summed over its input topics. */
  async lag(): Promise<number> {
    let total = 0;
    for (const t of this.opts.inputTopics) for (const l of await this.opts.log.lag(this.opts.id, t)) total += l.lag;
    return total;
  }

  /** Start the loop; resolves when it stops (stop() or a fatal error, which it rejects with). */
  run(): Promise<void> {
    this.running ??= this.loop();
    return this.running;
  }

  /** Finish the current batch, commit it, close the clients. */
  async stop(): Promise<void> {
    this.stopping = true;
    await this.running?.catch(() => {});
  }

  private async loop(): Promise<void> {
    const { log, id } = this.opts;
    if (this.stateful) await log.createTopic({ name: this.stateTopic, partitions: 1, retention: { maxBytes: 256 << 20 } });
    this.producer = await this.newProducer();
    this.consumer = await log.consumer({ groupId: id, topics: this.opts.inputTopics, readCommitted: true });
    this.logger.info('processor started', { inputs: this.opts.inputTopics, stateful: this.stateful });
    try {
      while (!this.stopping) {
        const records = await this.collect();
        if (this.stopping && records.length === 0) break;
        await this.step(records);
      }
    } finally {
      await this.consumer.close().catch(() => {});
      await this.producer.close().catch(() => {});
      this.logger.info('processor stopped', { ...this.metrics() });
    }
  }

  private async collect(): Promise<LogRecord[]> {
    const consumer = this.consumer!;
    const max = this.opts.maxBatchRecords;
    const batch = await consumer.poll({ maxRecords: max, timeoutMs: this.opts.pollTimeoutMs });
    if (batch.length === 0 || this.opts.maxBatchWaitMs <= 0) return batch;
    const deadline = Date.now() + this.opts.maxBatchWaitMs;
    while (batch.length < max && !this.stopping) {
      const left = deadline - Date.now();
      if (left <= 0) break;
      const more = await consumer.poll({ maxRecords: max - batch.length, timeoutMs: left });
      if (more.length === 0) break;
      batch.push(...more);
    }
    return batch;
  }

  /** One batch: handle, then commit everything it produced in one transaction. */
  private async step(records: LogRecord[]): Promise<void> {
    const outputs = new Map<string, ProduceRecord[]>();
    const failures: { record: LogRecord; error: unknown }[] = [];
    const dirty = new Map<string, { topic: string; partition: number }>();
    const now = Date.now();
    const ends = new Map<string, Promise<Map<number, number>>>();
    const ctx: ProcessContext = {
      now,
      logger: this.logger,
      caughtUp: async (topic, partition) => {
        let end = ends.get(topic);
        if (!end) ends.set(topic, (end = this.opts.log.offsets(topic).then((os) => new Map(os.map((o) => [o.partition, o.high])))));
        const key = tpKey(topic, partition);
        const read = Math.max(this.next.get(key)?.offset ?? 0, this.positions().get(key) ?? 0);
        return read >= ((await end).get(partition) ?? Infinity);
      },
      emit: (out, source) => {
        let value: Buffer;
        try {
          value = this.opts.serde.encode(out.name, out.value);
        } catch (err) {
          failures.push({ record: source, error: err });
          return;
        }
        if (value.length > this.opts.maxOutputBytes) {
          failures.push({ record: source, error: new RlstreamError('LOG_RECORD_TOO_LARGE', `${out.name} for this record is ${value.length} bytes, over the ${this.opts.maxOutputBytes}-byte limit`) });
          return;
        }
        const list = outputs.get(out.topic) ?? [];
        list.push({ key: out.key, value });
        outputs.set(out.topic, list);
        dirty.set(tpKey(source.topic, source.partition), source);
      },
      deadLetter: (source, error) => {
        failures.push({ record: source, error });
        dirty.set(tpKey(source.topic, source.partition), source);
      },
      count: (name, n = 1) => {
        this.m.counters[name] = (this.m.counters[name] ?? 0) + n;
      },
    };

    if (this.stateful && records.length > 0) {
      this.releaseRevoked();
      const fresh = new Map<string, { topic: string; partition: number }>();
      for (const r of [...this.consumer!.assignment(), ...records]) if (!this.known.has(tpKey(r.topic, r.partition))) fresh.set(tpKey(r.topic, r.partition), r);
      if (fresh.size > 0) await this.restore([...fresh.values()]);
    }
    // A per-record handler gets each record as soon as it is decoded, while its arrays are still in the CPU's
    // cache and before the next one is decoded: decoding a whole batch first, then handling it, is much slower
    // per trajectory (the decoded batch, ~30 KB a trajectory, outgrows the cache and survives minor GCs).
    const h = this.opts.handler;
    const inputs: InputRecord[] = [];
    for (const record of records) {
      const key = tpKey(record.topic, record.partition);
      this.known.add(key);
      dirty.set(key, record);
      this.next.set(key, { topic: record.topic, partition: record.partition, offset: record.offset + 1 });
      this.m.recordsIn++;
      const cp = this.restored.get(key);
      if (cp && record.offset >= cp.c && record.offset < cp.n && !inRanges(cp.p, record.offset)) {
        this.m.skipped++;
        ctx.count('replayed_finished');
        continue;
      }
      let event = this.decodeSync(record, ctx);
      if (event === undefined) event = await this.decodeAsync(record, ctx);
      if (!event) continue;
      if (h.handleBatch) {
        inputs.push({ record, event });
        continue;
      }
      try {
        // Only a handler that returns a promise is awaited: a microtask per record adds up.
        const done = h.handle?.({ record, event }, ctx);
        if (done) await done;
      } catch (err) {
        ctx.deadLetter(record, err);
      }
    }
    this.m.batches++;
    if (h.handleBatch && inputs.length > 0) await h.handleBatch(inputs, ctx);
    if (h.tick) await h.tick(ctx);

    // After its last record a Kafka partition may hold transaction markers the consumer has already passed:
    // committing that position (not last record + 1) is what lets the group's lag reach 0.
    const positions = this.positions();
    for (const key of dirty.keys()) {
      const next = this.next.get(key);
      const at = positions.get(key);
      if (next && at !== undefined && at > next.offset) next.offset = at;
    }
    if (dirty.size === 0 && outputs.size === 0 && failures.length === 0) return;
    await this.commit(outputs, failures, [...dirty.values()]);
  }

  /**
   * Decode a record with the schemas already known (all current ones): the event, null when it is skipped or
   * was dead-lettered, undefined when its schema id must first be fetched from the registry (decodeAsync).
   */
  private decodeSync(record: LogRecord, ctx: ProcessContext): DecodedEvent | null | undefined {
    try {
      if (this.skipIds.size > 0) {
        const id = (record.value.length >= 5 && record.value[0] === 0) ? record.value.readUInt32BE(1) : -1;
        if (this.skipIds.has(id)) {
          this.m.skipped++;
          return null;
        }
      }
      const event = this.opts.serde.tryDecodeSync(record.value);
      return event === undefined ? undefined : this.accepted(event);
    } catch (err) {
      ctx.deadLetter(record, err);
      return null;
    }
  }

  private async decodeAsync(record: LogRecord, ctx: ProcessContext): Promise<DecodedEvent | null> {
    try {
      return this.accepted(await this.opts.serde.decode(record.value));
    } catch (err) {
      ctx.deadLetter(record, err);
      return null;
    }
  }

  private accepted(event: DecodedEvent): DecodedEvent | null {
    if (this.opts.accepts && !this.opts.accepts.includes(event.name)) {
      this.m.skipped++;
      return null;
    }
    return event;
  }

  private async commit(outputs: Map<string, ProduceRecord[]>, failures: { record: LogRecord; error: unknown }[], touched: { topic: string; partition: number }[]): Promise<void> {
    const offsets: TopicPartitionOffset[] = [];
    const checkpoints: ProduceRecord[] = [];
    const written = new Map<string, Checkpoint>();
    for (const { topic, partition } of touched) {
      const key = tpKey(topic, partition);
      const next = this.next.get(key)?.offset;
      if (next === undefined) continue;
      if (!this.stateful) {
        offsets.push({ topic, partition, offset: next });
        continue;
      }
      const held = [...this.opts.handler.pending!(topic, partition)];
      // `next` is already past the markers (step() moved it): it is what movedSinceBatch compares.
      const c = commitOffset(next, undefined, held);
      offsets.push({ topic, partition, offset: c });
      let cp: Checkpoint = { c, n: next, p: toRanges(held) };
      const old = this.restored.get(key);
      if (old && old.n > next) {
        // Still re-reading what a previous run had finished: carry its knowledge of [next, old.n) forward, or a
        // second crash here would make those records look unfinished.
        const carried = old.p.map(([a, b]): [number, number] => [Math.max(a, next), b]).filter(([a, b]) => a < b);
        cp = { c, n: old.n, p: [...cp.p, ...carried] };
      }
      written.set(key, cp);
      checkpoints.push({ key, value: Buffer.from(JSON.stringify(cp)), partition: 0 });
    }

    await this.transact(touched, async (tx) => {
      for (const [topic, records] of outputs) await tx.send(topic, records);
      await sendDeadLetters(tx, this.opts.serde, this.opts.id, failures, this.opts.deadLetterTopic ?? TOPICS.deadLetter);
      if (checkpoints.length > 0) await tx.send(this.stateTopic, checkpoints);
      if (offsets.length > 0) await tx.sendOffsets(this.opts.id, offsets);
    });
    this.m.transactions++;
    for (const list of outputs.values()) this.m.recordsOut += list.length;
    this.m.deadLettered += failures.length;
    for (const f of failures) this.logger.warn('dead-lettered', { topic: f.record.topic, partition: f.record.partition, offset: f.record.offset, error: describeError(f.error) });
    // A restored checkpoint is needed until everything it covers has been read again.
    for (const key of written.keys()) {
      const old = this.restored.get(key);
      const next = this.next.get(key)?.offset ?? 0;
      if (old && old.n <= next) this.restored.delete(key);
    }
  }

  private newProducer(): Promise<Producer> {
    return this.opts.log.producer({ transactionalId: this.opts.transactionalId ?? this.opts.id });
  }

  /**
   * Run one transaction (fill it, commit it). A retriable failure (before the commit, or a commit the log says
   * was certainly not applied: see Transaction.commit) aborts it and runs the same contents again after a
   * backoff, with a new producer: a failed Kafka transaction can leave kafkajs's producer unusable, and the new
   * one fences the old and has its open transaction aborted. Records of an aborted transaction are never seen
   * (consumers read committed), the consumer position and the handler state already reflect the batch, so the
   * retried transaction commits exactly what the first would have. That holds only while this member still
   * reads the batch's partitions from where the batch ended: after a rebalance (the session expired during an
   * outage, the partitions moved or were rewound to the committed offsets) the batch would be read again, so
   * the processor stops instead. Other failures stop it too: a restart resumes from the committed offsets.
   */
  private async transact(touched: { topic: string; partition: number }[], fill: (tx: Transaction) => Promise<void>): Promise<void> {
    let moved: string[] = [];
    const t0 = performance.now();
    try {
      await retry(
        async (n) => {
          if (n > 1) {
            await this.producer?.close().catch(() => {});
            this.producer = await this.newProducer();
          }
          const tx = await this.producer!.transaction();
          try {
            await fill(tx);
            await tx.commit();
          } catch (err) {
            this.m.aborted++;
            await tx.abort().catch(() => {});
            throw err;
          }
        },
        {
          forMs: this.opts.retryForMs,
          onRetry: (err, { delayMs }) => {
            moved = this.movedSinceBatch(touched);
            if (moved.length > 0 || this.stopping) throw err;
            this.m.retried++;
            this.logger.warn('transaction failed; retrying it with a new producer', { error: describeError(err), retryInMs: delayMs });
          },
        },
      );
    } catch (err) {
      this.logger.error('transaction failed', { error: describeError(err), ...(moved.length > 0 ? { reassignedOrRewound: moved } : {}) });
      throw err;
    } finally {
      this.m.transactionMs += performance.now() - t0;
    }
  }

  /** The consumer's read position per assigned partition (past the records polled and the markers after them). */
  private positions(): Map<string, number> {
    return new Map(this.consumer!.assignment().map((a) => [tpKey(a.topic, a.partition), a.offset]));
  }

  /** Partitions of the batch this consumer no longer reads from right after the batch (see transact). */
  private movedSinceBatch(touched: { topic: string; partition: number }[]): string[] {
    const positions = this.positions();
    return touched.map((t) => tpKey(t.topic, t.partition)).filter((key) => this.next.has(key) && positions.get(key) !== this.next.get(key)!.offset);
  }

  /** Partitions another member now owns: drop their state (that member restores it from the checkpoint). */
  private releaseRevoked(): void {
    const assigned = new Set(this.consumer!.assignment().map((a) => tpKey(a.topic, a.partition)));
    if (assigned.size === 0) return;
    for (const key of [...this.known]) {
      if (assigned.has(key)) continue;
      const i = key.lastIndexOf(':');
      this.opts.handler.release?.(key.slice(0, i), Number(key.slice(i + 1)));
      this.known.delete(key);
      this.restored.delete(key);
      this.next.delete(key);
    }
  }

  /** Load the latest checkpoints of newly assigned partitions, in one read of the state topic. */
  private async restore(parts: { topic: string; partition: number }[]): Promise<void> {
    const keys = new Set(parts.map((p) => tpKey(p.topic, p.partition)));
    const found = await readCheckpoints(this.opts.log, this.stateTopic, keys);
    const committed = new Map<string, number>();
    for (const topic of new Set(parts.map((p) => p.topic))) for (const o of await this.opts.log.committed(this.opts.id, topic)) committed.set(tpKey(topic, o.partition), o.offset);
    for (const { topic, partition } of parts) {
      const key = tpKey(topic, partition);
      this.known.add(key);
      const cp = found.get(key);
      if (!cp) continue;
      if (committed.get(key) !== cp.c) {
        // Offsets moved outside this processor (reset by an operator, or the checkpoint expired): nothing is
        // known about what was finished, so everything from the committed offset is processed again.
        this.logger.warn('checkpoint does not match the committed offset; ignoring it', { topic, partition, committed: committed.get(key), checkpoint: cp.c });
        continue;
      }
      this.restored.set(key, cp);
      this.logger.info('restored checkpoint', { topic, partition, committed: cp.c, next: cp.n, held: cp.p.length });
    }
  }
}

/** The last checkpoint per key on a state topic, read from its tail (widening the window until all are found). */
export async function readCheckpoints(
  log: EventLog,
  stateTopic: string,
  keys: Set<string>,
  /** The read's deadline (default 60 s): it reaches the end by then or fails retriably (readToEnd). */
  options: { timeoutMs?: number } = {},
): Promise<Map<string, Checkpoint>> {
  const found = new Map<string, Checkpoint>();
  const parts = await log.offsets(stateTopic).catch(() => []);
  const p0 = parts.find((p) => p.partition === 0);
  if (!p0 || p0.high <= p0.low) return found;
  const consumer = await log.consumer({ groupId: `${stateTopic}.restore.${newId()}`, topics: [stateTopic], readCommitted: true });
  try {
    // On Kafka a new consumer joins its group in the background: seeking before the partition is assigned
    // fails (LOG_UNKNOWN_PARTITION), which made every restart with a checkpoint crash. Poll until it is.
    const assignedBy = Date.now() + 60_000;
    while (!consumer.assignment().some((a) => a.topic === stateTopic && a.partition === 0)) {
      if (Date.now() > assignedBy) throw new RlstreamError('LOG_UNAVAILABLE', `state topic ${stateTopic} was not assigned to its restore consumer within 60 s`, { retriable: true });
      await consumer.poll({ maxRecords: 1, timeoutMs: 100 });
    }
    let window = 256;
    for (;;) {
      const from = Math.max(p0.low, p0.high - window);
      await consumer.seek(stateTopic, 0, from);
      const latest = new Map<string, { offset: number; cp: Checkpoint }>();
      // To the end listed before the restore, by position (see readToEnd): stopping at the first empty polls
      // after a broker restart took an older checkpoint, whose ranges marked records finished that the newer
      // one still held (a GRPO group was then never completed).
      await readToEnd(consumer, stateTopic, new Map([[0, p0.high]]), (records) => {
        for (const r of records) {
          const k = r.key?.toString('utf8');
          if (k === undefined || !keys.has(k)) continue;
          const prev = latest.get(k);
          if (!prev || prev.offset < r.offset) latest.set(k, { offset: r.offset, cp: JSON.parse(r.value.toString('utf8')) as Checkpoint });
        }
      }, { what: 'checkpoint restore', timeoutMs: options.timeoutMs ?? 60_000 });
      for (const [k, v] of latest) found.set(k, v.cp);
      if (found.size === keys.size || from === p0.low) return found;
      window *= 8;
    }
  } finally {
    await consumer.close().catch(() => {});
  }
}

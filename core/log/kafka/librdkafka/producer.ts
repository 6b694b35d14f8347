// A Producer on librdkafka: idempotent by default, transactional with a transactionalId. Partitions are picked
// here (Kafka's murmur2 for keys, round-robin otherwise, as the kafkajs producer does) so both clients place
// records alike. produce() only queues a record in librdkafka, which batches and sends from its own threads; a
// plain send() then waits for every record's delivery report, which carries its offset. A transactional send
// waits for nothing: commitTransaction flushes the transaction's records and fails if any of them failed, so
// its producer asks for no delivery reports at all (one JS callback per record saved).
import { RlstreamError, describeError } from '../../../errors.ts';
import { retry } from '../../../retry.ts';
import type { Logger } from '../../../telemetry.ts';
import { Partitioner } from '../../partitioner.ts';
import type { ProduceRecord, Producer, ProducerOptions, RecordPosition, TopicPartitionOffset, Transaction } from '../../types.ts';
import { checkOffsets } from '../offsets.ts';
import { ProducerGate } from '../producer-gate.ts';
import { TxnLifecycle } from '../transaction-state.ts';
import type { RdConfig, RdDeliveryReport, RdError, RdKafka, RdKafkaConsumer, RdProducer } from './binding.ts';
import { fromRdKafka, isRdCoordinatorBusy, RD, rdCall, withDeadline } from './errors.ts';
import { routeRdLogs } from './log-events.ts';

/** What a producer needs from the log that owns it. */
export interface RdProducerHost {
  partitionCount(topic: string): Promise<number>;
  /** librdkafka settings shared by every client of the log (brokers, TLS, SASL, timeouts). */
  baseConfig(): RdConfig;
  readonly transactionTimeoutMs: number;
  readonly maxRequestBytes: number;
  /** A consumer whose group metadata goes with offsets committed in a transaction (see ./index.ts). */
  groupConsumer(groupId: string): Promise<RdKafkaConsumer>;
  readonly logger: Logger;
}

/** The records of one send() waiting for their delivery reports. */
interface Pending {
  positions: RecordPosition[];
  left: number;
  error: RdError | null;
  done: (err: RdError | null) => void;
}

/**
 * What a record carries through librdkafka to its delivery report: its send and its index there. Reports for one
 * partition can arrive out of produce order (a retried batch's after those of a batch sent after it), so a report
 * names its record rather than being matched by arrival order.
 */
interface Sent {
  pending: Pending;
  index: number;
}

/** How long a transactional call turned away by a busy coordinator is retried. */
const COORDINATOR_RETRY_MS = 30_000;
/** librdkafka's own time limit for a transactional call (init, commit, abort, offsets). */
const TXN_CALL_MS = 30_000;
/** Ours, past librdkafka's: a call still unanswered then is not coming back (see withDeadline). */
export const TXN_DEADLINE_MS = TXN_CALL_MS + 10_000;
/** How long closing waits for librdkafka's disconnect before leaving it. */
const CLOSE_MS = 10_000;
/** librdkafka's own cap on one request: far above any broker's record limit (Kafka's default is 1 MiB), so the broker decides. */
const RECORD_CAP_BYTES = 64 * 1024 * 1024;

export class RdKafkaProducer implements Producer {
  private readonly partitioner = new Partitioner();
  readonly gate = new ProducerGate(fromRdKafka);
  private openTxn: RdKafkaTransaction | null = null;
  /** Connection errors librdkafka reported (broker down, transport failures): a transaction across one is checked. */
  disturbances = 0;

  private constructor(
    readonly host: RdProducerHost,
    readonly client: RdProducer,
    private readonly options: ProducerOptions,
  ) {}

  static async open(host: RdProducerHost, rd: RdKafka, options: ProducerOptions, compression: string): Promise<RdKafkaProducer> {
    const transactional = options.transactionalId !== undefined;
    const config: RdConfig = {
      ...host.baseConfig(),
      acks: -1,
      'enable.idempotence': options.idempotent !== false,
      'compression.codec': compression,
      // A commit (and send(), see there) flushes, which sends at once whatever linger.ms says. In a transaction a
      // short linger lets the outputs go out while the offsets' round trips run; with the processor's sequential
      // loop that made no measurable difference, 5 ms against 50 (docs/kafka.md, "Transactions"). A 2 ms linger
      // cost a third of a core between transactions; an idle producer costs the same at 5 ms as at 50.
      'linger.ms': transactional ? 5 : 20,
      // Batches as large as the kafkajs client's requests; one record larger than that still goes (alone), and the
      // broker's message.max.bytes decides, as with kafkajs: librdkafka's own cap would refuse it before sending.
      'batch.size': host.maxRequestBytes,
      'message.max.bytes': RECORD_CAP_BYTES,
      'queue.buffering.max.messages': 1_000_000,
      // A transaction's offsets, sent right after the previous commit, are often turned away with
      // CONCURRENT_TRANSACTIONS while its markers are written (milliseconds): librdkafka's default first backoff
      // of 100 ms then dominated a transaction. Retries still back off exponentially, up to a second.
      'retry.backoff.ms': 5,
      'retry.backoff.max.ms': 1000,
      'dr_cb': !transactional,
    };
    if (transactional) {
      config['transactional.id'] = options.transactionalId!;
      config['transaction.timeout.ms'] = host.transactionTimeoutMs;
    }
    const client = new rd.Producer(config);
    routeRdLogs(client, host.logger, transactional ? `producer ${options.transactionalId!}` : 'producer');
    const producer = new RdKafkaProducer(host, client, options);
    client.on('event.error', (err: RdError) => {
      producer.disturbances++;
      host.logger.debug('librdkafka producer error', { error: String(err.message), code: err.code });
    });
    if (!transactional) client.on('delivery-report', (err: RdError | null, report: RdDeliveryReport) => producer.onReport(err, report));
    try {
      await rdCall('connect a producer', (cb) => client.connect(null, cb));
    } catch (err) {
      throw fromRdKafka(err, `connect a producer to ${String(config['bootstrap.servers'])}`);
    }
    // Delivery reports are polled by a thread of the binding, not by a JS timer.
    client.setPollInBackground(true);
    if (transactional) {
      try {
        await producer.gate.serial(() => timed(host.logger, 'init', () => rdCall(`claim transactional id ${options.transactionalId}`, (cb) => client.initTransactions(TXN_CALL_MS, cb))));
      } catch (err) {
        await producer.close();
        throw producer.gate.fail(err, `claim transactional id ${options.transactionalId}`);
      }
    }
    return producer;
  }

  get transactionalId(): string | undefined {
    return this.options.transactionalId;
  }

  private onReport(err: RdError | null, report: RdDeliveryReport): void {
    const sent = report.opaque as Sent | undefined;
    if (!sent) return;
    const p = sent.pending;
    if (err) p.error ??= err;
    else p.positions[sent.index] = { topic: report.topic, partition: report.partition, offset: report.offset };
    if (--p.left === 0) p.done(p.error);
  }

  /** Queue the records in librdkafka; with `pending`, each record's delivery report fills in its position there. */
  async produce(topic: string, records: ProduceRecord[], pending: Pending | null): Promise<void> {
    if (!Array.isArray(records)) throw new RlstreamError('INPUT_INVALID', `send to ${topic}: records must be an array`);
    const n = await this.host.partitionCount(topic);
    // Every record is checked before any is queued: a bad one fails the call with nothing sent.
    const partitions = new Int32Array(records.length);
    for (let i = 0; i < records.length; i++) {
      const r = records[i]!;
      if (!Buffer.isBuffer(r.value)) throw new RlstreamError('INPUT_INVALID', `record ${i} for ${topic}: value must be a Buffer`);
      const partition = this.partitioner.partition(r, n);
      if (!Number.isInteger(partition) || partition < 0 || partition >= n) throw new RlstreamError('LOG_UNKNOWN_PARTITION', `topic ${topic} has no partition ${partition} (it has ${n})`);
      partitions[i] = partition;
    }
    for (let i = 0; i < records.length; i++) {
      const r = records[i]!;
      const partition = partitions[i]!;
      const opaque: Sent | null = pending ? { pending, index: i } : null;
      const headers = r.headers ? Object.entries(r.headers).map(([k, v]) => ({ [k]: v })) : undefined;
      for (;;) {
        try {
          this.client.produce(topic, partition, r.value, r.key ?? null, r.timestamp ?? null, opaque, headers);
          break;
        } catch (err) {
          // librdkafka's queue is full: let its threads send some, then try again.
          if ((err as { code?: number }).code !== RD.QUEUE_FULL) throw this.gate.fail(err, `send to ${topic}`);
          await new Promise((resolve) => setTimeout(resolve, 5));
        }
      }
    }
  }

  async send(topic: string, records: ProduceRecord[]): Promise<RecordPosition[]> {
    this.gate.check();
    if (this.options.transactionalId !== undefined) {
      throw new RlstreamError('LOG_TRANSACTION_STATE', `producer ${this.options.transactionalId} is transactional: send inside a transaction`);
    }
    if (records.length === 0) return [];
    return this.gate.serial(async () => {
      this.gate.check();
      let done!: (err: RdError | null) => void;
      const delivered = new Promise<RdError | null>((resolve) => (done = resolve));
      const p: Pending = { positions: new Array<RecordPosition>(records.length), left: records.length, error: null, done };
      await this.produce(topic, records, p);
      // Sent now rather than after linger.ms; its outcome is the delivery reports'.
      this.client.flush(30_000, () => {});
      const err = await delivered;
      if (err) throw this.gate.fail(err, `send to ${topic}`);
      return p.positions;
    });
  }

  async transaction(): Promise<Transaction> {
    this.gate.check();
    const id = this.options.transactionalId;
    if (id === undefined) throw new RlstreamError('LOG_TRANSACTION_STATE', 'transactions need a producer created with a transactionalId');
    if (this.openTxn?.open) throw new RlstreamError('LOG_TRANSACTION_STATE', `producer ${id} already has an open transaction`);
    await this.gate.serial(async () => {
      try {
        await timed(this.host.logger, 'begin', () => rdCall(`begin a transaction of ${id}`, (cb) => this.client.beginTransaction(cb)));
      } catch (err) {
        throw this.gate.fail(err, `begin a transaction of ${id}`);
      }
    });
    this.openTxn = new RdKafkaTransaction(this);
    return this.openTxn;
  }

  async close(): Promise<void> {
    if (!(await this.gate.close())) return;
    await withDeadline('disconnect a producer', CLOSE_MS, rdCall('disconnect a producer', (cb) => this.client.disconnect(5000, cb))).catch((err: unknown) => this.host.logger.debug('producer disconnect failed', { error: String(err) }));
  }
}

/**
 * Runs a transactional call under TXN_DEADLINE_MS and logs (debug) how long it took and how it ended: where a
 * stalled role waits.
 */
async function timed<T>(logger: Logger, what: string, fn: () => Promise<T>): Promise<T> {
  const t0 = performance.now();
  try {
    const out = await withDeadline(`transactional ${what}`, TXN_DEADLINE_MS, fn());
    // commitTransaction's callback hands its error over as a value (see commit).
    const error = (out as { message?: unknown } | null)?.message;
    logger.debug(error === undefined ? 'transaction call' : 'transaction call failed', { what, ms: Math.round(performance.now() - t0), ...(error === undefined ? {} : { error: String(error) }) });
    return out;
  } catch (err) {
    logger.debug('transaction call failed', { what, ms: Math.round(performance.now() - t0), error: String((err as Error).message) });
    throw err;
  }
}

/** How long a commit that spanned a broker outage waits for the group to show its offsets (see confirm). */
const CONFIRM_MS = 30_000;
const CONFIRM_READ_MS = 5_000;

export class RdKafkaTransaction implements Transaction {
  private readonly life: TxnLifecycle;
  private readonly disturbancesAtBegin: number;
  /** The offsets sent with this transaction, by group. */
  private readonly offsets = new Map<string, TopicPartitionOffset[]>();

  constructor(private readonly producer: RdKafkaProducer) {
    this.life = new TxnLifecycle(this.producer.gate);
    this.disturbancesAtBegin = producer.disturbances;
  }

  get open(): boolean {
    return this.life.open;
  }

  async send(topic: string, records: ProduceRecord[]): Promise<void> {
    await this.life.run('send', `transactional send to ${topic}`, () => this.producer.produce(topic, records, null));
  }

  async sendOffsets(groupId: string, offsets: TopicPartitionOffset[]): Promise<void> {
    checkOffsets(offsets);
    const consumer = await this.producer.host.groupConsumer(groupId);
    const list = offsets.map((o) => ({ topic: o.topic, partition: o.partition, offset: o.offset }));
    this.offsets.set(groupId, [...(this.offsets.get(groupId) ?? []), ...list]);
    await this.life.run('sendOffsets', `send offsets of group ${groupId} in a transaction`, () =>
      retry(() => timed(this.producer.host.logger, 'sendOffsets', () => rdCall('send offsets', (cb) => this.producer.client.sendOffsetsToTransaction(list, consumer, TXN_CALL_MS, cb))), {
        retriable: (err) => isRdCoordinatorBusy((err as { cause?: unknown }).cause),
        forMs: COORDINATOR_RETRY_MS,
        initialDelayMs: 20,
        maxDelayMs: 1000,
      }),
    );
  }

  /**
   * librdkafka says how a failed commit ended: an abortable error (isTxnRequiresAbort) means it was certainly
   * not committed, so it is retriable here (abort, run the transaction again); a retriable one (a timeout)
   * may be retried by calling commit again, which this does for a while before reporting an unknown outcome;
   * a fatal one (fenced) ends the producer.
   */
  async commit(): Promise<void> {
    const what = `commit transaction of ${this.producer.transactionalId}`;
    const commitOnce = () => timed(this.producer.host.logger, 'commit', () => new Promise<RdError | null>((resolve) => this.producer.client.commitTransaction(TXN_CALL_MS, (err) => resolve(err ?? null))));
    await this.life.run('commit', what, async () => {
      const until = Date.now() + COORDINATOR_RETRY_MS;
      for (;;) {
        const err = await commitOnce();
        if (!err) {
          if (this.producer.disturbances !== this.disturbancesAtBegin) await this.confirm(what);
          return;
        }
        if (err.isFatal || err.code === RD.FENCED || err.code === RD.PRODUCER_FENCED) throw err;
        if (err.isTxnRequiresAbort) throw new RlstreamError('LOG_UNAVAILABLE', `${what}: not committed (${err.message})`, { cause: err, retriable: true });
        if (!err.isRetriable || Date.now() > until) throw new RlstreamError('LOG_UNAVAILABLE', `${what}: outcome unknown (${err.message})`, { cause: err, retriable: false });
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    });
  }

  /**
   * A commit librdkafka reported done across a broker outage has been seen not to hold: the broker restarted, the
   * transaction's outputs stayed uncommitted and its offsets were not in the group, and the producer's next
   * transaction waited on it forever. So such a commit is read back: the group must show this transaction's
   * offsets (an offset fetch that waits for pending transactional offsets, as a read_committed client's does).
   * If it does not within CONFIRM_MS, the outcome is unknown and the producer unusable: the error is not
   * retriable, so the role stops and a restart resumes from what the log holds (its new producer's
   * initTransactions ends whatever this one left open).
   */
  private async confirm(what: string): Promise<void> {
    for (const [groupId, list] of this.offsets) {
      const consumer = await this.producer.host.groupConsumer(groupId);
      const toppars = () => list.map((o) => ({ topic: o.topic, partition: o.partition }));
      try {
        await retry(
          async () => {
            const shown = await new Promise<{ topic: string; partition: number; offset?: number }[]>((resolve, reject) => consumer.committed(toppars(), CONFIRM_READ_MS, (err, tps) => (err ? reject(err) : resolve(tps))));
            const missing = list.filter((o) => (shown.find((t) => t.topic === o.topic && t.partition === o.partition)?.offset ?? -1) < o.offset);
            if (missing.length > 0) throw new RlstreamError('LOG_UNAVAILABLE', `group ${groupId} shows ${missing.map((o) => `${o.topic}/${o.partition} below ${o.offset}`).join(', ')}`, { retriable: true });
          },
          { forMs: CONFIRM_MS, initialDelayMs: 50, maxDelayMs: 1000, retriable: () => true },
        );
      } catch (err) {
        throw new RlstreamError('LOG_UNAVAILABLE', `${what}: reported done across a broker outage, but ${describeError(err)}; outcome unknown, stopping so that a restart resumes from the log`, { cause: err, retriable: false });
      }
      this.producer.host.logger.info('transaction across a broker outage confirmed', { transactionalId: this.producer.transactionalId, groupId });
    }
  }

  async abort(): Promise<void> {
    await this.life.run('abort', `abort transaction of ${this.producer.transactionalId}`, () => timed(this.producer.host.logger, 'abort', () => rdCall('abort', (cb) => this.producer.client.abortTransaction(TXN_CALL_MS, cb))));
  }
}

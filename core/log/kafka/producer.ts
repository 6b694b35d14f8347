// A Producer on kafkajs: idempotent by default, transactional with a transactionalId. Partitions are picked
// here (Kafka's murmur2 for keys, round-robin otherwise) so send() can return every record's offset: within one
// produce request a partition's records form one batch, so record i of a partition sits at baseOffset + i.
// Sends are serialised per producer: kafkajs assigns idempotence sequence numbers per request and two
// concurrent requests to one partition would be rejected as out of order.
import type { Message, Producer as KafkaJsProducer, Transaction as KafkaJsTransaction, CompressionTypes as CT } from 'kafkajs';
import { RlstreamError } from '../../errors.ts';
import { retry } from '../../retry.ts';
import type { Logger } from '../../telemetry.ts';
import { Partitioner } from '../partitioner.ts';
import type { ProduceRecord, Producer, ProducerOptions, RecordPosition, TopicPartitionOffset, Transaction } from '../types.ts';
import { fromKafka, isCoordinatorBusy } from './errors.ts';
import { checkOffsets } from './offsets.ts';
import { ProducerGate } from './producer-gate.ts';
import { TxnLifecycle } from './transaction-state.ts';

/** What a producer needs from the log that owns it. */
export interface ProducerHost {
  partitionCount(topic: string): Promise<number>;
  readonly maxRequestBytes: number;
  readonly logger: Logger;
}

interface Prepared {
  messages: Message[];
  partitions: number[];
  bytes: number[];
}

const RECORD_OVERHEAD = 70; // bytes of record framing, a rough upper bound used only to split requests
/** How long a transactional call turned away by a busy coordinator is retried (kafkajs retries sends itself). */
const COORDINATOR_RETRY_MS = 30_000;

export class KafkaProducer implements Producer {
  private readonly partitioner = new Partitioner();
  readonly gate = new ProducerGate(fromKafka);
  private openTxn: KafkaTransaction | null = null;

  constructor(
    private readonly host: ProducerHost,
    private readonly client: KafkaJsProducer,
    private readonly options: ProducerOptions,
    private readonly compression: CT,
  ) {}

  get transactionalId(): string | undefined {
    return this.options.transactionalId;
  }

  async prepare(topic: string, records: ProduceRecord[]): Promise<Prepared> {
    if (!Array.isArray(records)) throw new RlstreamError('INPUT_INVALID', `send to ${topic}: records must be an array`);
    const n = await this.host.partitionCount(topic);
    const out: Prepared = { messages: [], partitions: [], bytes: [] };
    records.forEach((r, i) => {
      if (!Buffer.isBuffer(r.value)) throw new RlstreamError('INPUT_INVALID', `record ${i} for ${topic}: value must be a Buffer`);
      const partition = this.partitioner.partition(r, n);
      if (!Number.isInteger(partition) || partition < 0 || partition >= n) throw new RlstreamError('LOG_UNKNOWN_PARTITION', `topic ${topic} has no partition ${partition} (it has ${n})`);
      let bytes = r.value.length + RECORD_OVERHEAD;
      const m: Message = { value: r.value, partition };
      if (r.key !== undefined && r.key !== null) {
        m.key = r.key;
        bytes += Buffer.byteLength(r.key);
      }
      if (r.timestamp !== undefined) m.timestamp = String(r.timestamp);
      if (r.headers) {
        m.headers = r.headers;
        for (const [k, v] of Object.entries(r.headers)) bytes += k.length + v.length;
      }
      out.messages.push(m);
      out.partitions.push(partition);
      out.bytes.push(bytes);
    });
    return out;
  }

  /** Consecutive index ranges of about maxRequestBytes each (at least one record per range). */
  chunks(p: Prepared): [number, number][] {
    const out: [number, number][] = [];
    let start = 0;
    let size = 0;
    p.bytes.forEach((b, i) => {
      if (i > start && size + b > this.host.maxRequestBytes) {
        out.push([start, i]);
        start = i;
        size = 0;
      }
      size += b;
    });
    if (start < p.bytes.length) out.push([start, p.bytes.length]);
    return out;
  }

  async send(topic: string, records: ProduceRecord[]): Promise<RecordPosition[]> {
    this.gate.check();
    if (this.options.transactionalId !== undefined) {
      throw new RlstreamError('LOG_TRANSACTION_STATE', `producer ${this.options.transactionalId} is transactional: send inside a transaction`);
    }
    const p = await this.prepare(topic, records);
    return this.gate.serial(async () => {
      this.gate.check();
      const positions: RecordPosition[] = [];
      for (const [from, to] of this.chunks(p)) {
        let meta;
        try {
          meta = await this.client.send({ topic, messages: p.messages.slice(from, to), acks: -1, compression: this.compression });
        } catch (err) {
          throw this.gate.fail(err, `send to ${topic}`);
        }
        const base = new Map<number, number>();
        for (const m of meta) base.set(m.partition, Number(m.baseOffset));
        const next = new Map<number, number>();
        for (let i = from; i < to; i++) {
          const partition = p.partitions[i]!;
          const offset = next.get(partition) ?? base.get(partition);
          if (offset === undefined) throw new RlstreamError('INTERNAL', `send to ${topic}: no offset returned for partition ${partition}`);
          positions.push({ topic, partition, offset });
          next.set(partition, offset + 1);
        }
      }
      return positions;
    });
  }

  async transaction(): Promise<Transaction> {
    this.gate.check();
    const id = this.options.transactionalId;
    if (id === undefined) throw new RlstreamError('LOG_TRANSACTION_STATE', 'transactions need a producer created with a transactionalId');
    if (this.openTxn?.open) throw new RlstreamError('LOG_TRANSACTION_STATE', `producer ${id} already has an open transaction`);
    const txn = await this.gate.serial(async () => {
      try {
        return await this.client.transaction();
      } catch (err) {
        throw this.gate.fail(err, `begin a transaction of ${id}`);
      }
    });
    this.openTxn = new KafkaTransaction(this, txn, this.compression);
    return this.openTxn;
  }

  /** Claims the transactional id now (fencing any older producer with it) rather than at the first transaction. */
  async initTransactions(): Promise<void> {
    const txn = await this.transaction();
    await txn.abort();
  }

  async close(): Promise<void> {
    if (!(await this.gate.close())) return;
    await this.client.disconnect().catch((err: unknown) => this.host.logger.debug('producer disconnect failed', { error: String(err) }));
  }
}

export class KafkaTransaction implements Transaction {
  private readonly life: TxnLifecycle;

  constructor(
    private readonly producer: KafkaProducer,
    private readonly txn: KafkaJsTransaction,
    private readonly compression: CT,
  ) {
    this.life = new TxnLifecycle(this.producer.gate);
  }

  get open(): boolean {
    return this.life.open;
  }

  async send(topic: string, records: ProduceRecord[]): Promise<void> {
    this.life.guard('send');
    const p = await this.producer.prepare(topic, records);
    for (const [from, to] of this.producer.chunks(p)) {
      await this.life.run('send', `transactional send to ${topic}`, () => this.txn.send({ topic, messages: p.messages.slice(from, to), acks: -1, compression: this.compression }));
    }
  }

  async sendOffsets(groupId: string, offsets: TopicPartitionOffset[]): Promise<void> {
    checkOffsets(offsets);
    const byTopic = new Map<string, { partition: number; offset: string }[]>();
    for (const o of offsets) {
      byTopic.set(o.topic, [...(byTopic.get(o.topic) ?? []), { partition: o.partition, offset: String(o.offset) }]);
    }
    const topics = [...byTopic].map(([topic, partitions]) => ({ topic, partitions }));
    // kafkajs does not retry AddOffsetsToTxn: a transaction that only commits offsets, right after the previous
    // one, meets CONCURRENT_TRANSACTIONS (its markers are still being written). Adding the same offsets again is
    // harmless, so a busy coordinator is retried here, as Kafka's Java client does.
    await this.life.run('sendOffsets', `send offsets of group ${groupId} in a transaction`, () =>
      retry(() => this.txn.sendOffsets({ consumerGroupId: groupId, topics }), { retriable: isCoordinatorBusy, forMs: COORDINATOR_RETRY_MS, initialDelayMs: 20, maxDelayMs: 1000 }),
    );
  }

  /**
   * A retriable failure means the transaction was certainly not committed: the coordinator turned EndTxn away
   * unprocessed. Anything else (a timeout, a lost connection) leaves the outcome unknown and is not retriable:
   * committing the same records again could duplicate them. Either way this producer can only be aborted or
   * closed (kafkajs stays in its committing state).
   */
  async commit(): Promise<void> {
    const what = `commit transaction of ${this.producer.transactionalId}`;
    try {
      await this.life.run('commit', what, () => this.txn.commit());
    } catch (err) {
      if (!(err instanceof RlstreamError) || err.code === 'LOG_FENCED' || !err.retriable) throw err;
      if (isCoordinatorBusy(err.cause)) throw new RlstreamError('LOG_UNAVAILABLE', `${what}: not committed, the coordinator was busy (${err.message})`, { cause: err, retriable: true });
      throw new RlstreamError('LOG_UNAVAILABLE', `${what}: outcome unknown (${err.message})`, { cause: err, retriable: false });
    }
  }

  async abort(): Promise<void> {
    await this.life.run('abort', `abort transaction of ${this.producer.transactionalId}`, () => this.txn.abort());
  }
}

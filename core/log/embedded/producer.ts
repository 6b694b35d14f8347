// Producers and transactions of the embedded log. A transaction buffers its records and offsets in memory
// and hands them to the log in one commit (one journal entry), so nothing of it is visible, or durable,
// before the commit. Transactional ids carry an epoch: a new producer with the same id bumps it, and every
// later call of the older producer fails with LOG_FENCED.
import { RlstreamError } from '../../errors.ts';
import { Partitioner } from '../partitioner.ts';
import type { ProduceRecord, Producer, ProducerOptions, RecordPosition, TopicPartitionOffset, Transaction } from '../types.ts';
import { tpKey } from './groups.ts';
import type { OffsetTriple } from './journal.ts';
import type { PlainRecord } from './record-format.ts';

export interface PendingPart {
  topic: string;
  partition: number;
  records: PlainRecord[];
}

/** What producers need from the log that owns them. */
export interface ProducerHost {
  checkOpen(): void;
  /** Validate and normalise records; returns each record's partition. */
  prepare(topic: string, records: ProduceRecord[], partitioner: Partitioner): { partition: number; record: PlainRecord }[];
  append(topic: string, prepared: { partition: number; record: PlainRecord }[]): RecordPosition[];
  bumpEpoch(transactionalId: string): number;
  currentEpoch(transactionalId: string): number;
  commitTransaction(transactionalId: string, parts: PendingPart[], offsets: Map<string, OffsetTriple[]>): void;
}

type TxnState = 'open' | 'committed' | 'aborted';

/** Which calls each state allows; anything else is a LOG_TRANSACTION_STATE error. */
const ALLOWED: Record<TxnState, ReadonlySet<string>> = {
  open: new Set(['send', 'sendOffsets', 'commit', 'abort']),
  committed: new Set(),
  aborted: new Set(['abort']),
};

export class EmbeddedProducer implements Producer {
  private readonly partitioner = new Partitioner();
  private readonly epoch: number;
  private open: EmbeddedTransaction | null = null;
  private closed = false;

  constructor(
    private readonly host: ProducerHost,
    private readonly options: ProducerOptions,
  ) {
    this.epoch = options.transactionalId === undefined ? 0 : host.bumpEpoch(options.transactionalId);
  }

  check(): void {
    if (this.closed) throw new RlstreamError('LOG_CLOSED', 'producer is closed');
    this.host.checkOpen();
    const id = this.options.transactionalId;
    if (id !== undefined && this.host.currentEpoch(id) !== this.epoch) {
      throw new RlstreamError('LOG_FENCED', `producer with transactionalId ${id} (epoch ${this.epoch}) was fenced by a newer producer`);
    }
  }

  async send(topic: string, records: ProduceRecord[]): Promise<RecordPosition[]> {
    this.check();
    if (this.options.transactionalId !== undefined) {
      throw new RlstreamError('LOG_TRANSACTION_STATE', `producer ${this.options.transactionalId} is transactional: send inside a transaction`);
    }
    return this.host.append(topic, this.host.prepare(topic, records, this.partitioner));
  }

  async transaction(): Promise<Transaction> {
    this.check();
    const id = this.options.transactionalId;
    if (id === undefined) throw new RlstreamError('LOG_TRANSACTION_STATE', 'transactions need a producer created with a transactionalId');
    if (this.open) throw new RlstreamError('LOG_TRANSACTION_STATE', `producer ${id} already has an open transaction`);
    this.open = new EmbeddedTransaction(this, this.host, id, this.partitioner, () => (this.open = null));
    return this.open;
  }

  async close(): Promise<void> {
    this.closed = true;
    this.open = null;
  }
}

class EmbeddedTransaction implements Transaction {
  private state: TxnState = 'open';
  private readonly parts = new Map<string, PendingPart>();
  private readonly offsets = new Map<string, Map<string, OffsetTriple>>();

  constructor(
    private readonly producer: EmbeddedProducer,
    private readonly host: ProducerHost,
    private readonly transactionalId: string,
    private readonly partitioner: Partitioner,
    private readonly ended: () => void,
  ) {}

  private guard(op: string): void {
    if (!ALLOWED[this.state].has(op)) throw new RlstreamError('LOG_TRANSACTION_STATE', `cannot ${op} a transaction that is ${this.state}`);
    try {
      this.producer.check();
    } catch (err) {
      this.end('aborted');
      throw err;
    }
  }

  private end(state: TxnState): void {
    this.state = state;
    this.parts.clear();
    this.offsets.clear();
    this.ended();
  }

  async send(topic: string, records: ProduceRecord[]): Promise<void> {
    this.guard('send');
    for (const { partition, record } of this.host.prepare(topic, records, this.partitioner)) {
      const key = tpKey(topic, partition);
      const part = this.parts.get(key) ?? { topic, partition, records: [] };
      part.records.push(record);
      this.parts.set(key, part);
    }
  }

  async sendOffsets(groupId: string, offsets: TopicPartitionOffset[]): Promise<void> {
    this.guard('sendOffsets');
    const m = this.offsets.get(groupId) ?? new Map<string, OffsetTriple>();
    for (const o of offsets) m.set(tpKey(o.topic, o.partition), [o.topic, o.partition, o.offset]);
    this.offsets.set(groupId, m);
  }

  async commit(): Promise<void> {
    this.guard('commit');
    const offsets = new Map([...this.offsets].map(([g, m]) => [g, [...m.values()]]));
    this.host.commitTransaction(this.transactionalId, [...this.parts.values()], offsets);
    this.end('committed');
  }

  async abort(): Promise<void> {
    if (this.state === 'aborted') return;
    this.guard('abort');
    this.end('aborted');
  }
}

// Publishes rollout events in the order they are given, batching those queued in the same tick into one
// send (the log keeps order per partition, and one send in flight at a time keeps order across sends).
import { describeError } from '../core/errors.ts';
import type { Producer, ProduceRecord } from '../core/log/types.ts';
import { retry } from '../core/retry.ts';
import type { EventSerde } from '../core/serde/events.ts';
import type { Logger } from '../core/telemetry.ts';
import type { EventName } from '../schemas/index.ts';
import type { EventTypes } from '../schemas/generated/types.ts';

/** A queued record; `done` is set for publish() (awaited), absent for fire() (no promise allocated). */
interface Pending {
  record: ProduceRecord;
  name: EventName;
  done?: { resolve: () => void; reject: (err: unknown) => void };
}

export class EventPublisher {
  private queue: Pending[] = [];
  private flushing: Promise<void> | null = null;
  private scheduled = false;
  published = 0;
  failed = 0;
  bytes = 0;

  constructor(
    private readonly producer: Producer,
    private readonly serde: EventSerde,
    private readonly topic: string,
    private readonly logger: Logger,
    /** Records per send at most. */
    private readonly maxBatch = 2048,
    /** How long a batch is retried while the log is unavailable (broker restart) before it counts as failed. */
    private readonly retryForMs = 180_000,
  ) {}

  /** Encode now (schema errors throw here, synchronously) and send soon; resolves once the log has it. */
  publish<N extends EventName>(name: N, key: string, value: EventTypes[N]): Promise<void> {
    const buf = this.serde.encode(name, value);
    this.bytes += buf.length;
    return new Promise<void>((resolve, reject) => {
      this.queue.push({ record: { key, value: buf }, name, done: { resolve, reject } });
      this.schedule();
    });
  }

  /** Publish without awaiting; a failure is logged and counted (the trajectory goes on). */
  fire<N extends EventName>(name: N, key: string, value: EventTypes[N]): void {
    const buf = this.serde.encode(name, value);
    this.bytes += buf.length;
    this.queue.push({ record: { key, value: buf }, name });
    this.schedule();
  }

  private schedule(): void {
    if (this.scheduled || this.flushing) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      this.flushing = this.drain().finally(() => {
        this.flushing = null;
        if (this.queue.length > 0) this.schedule();
      });
    });
  }

  private async drain(): Promise<void> {
    while (this.queue.length > 0) {
      let batch: Pending[];
      if (this.queue.length <= this.maxBatch) {
        batch = this.queue;
        this.queue = [];
      } else batch = this.queue.splice(0, this.maxBatch);
      try {
        const records = new Array<ProduceRecord>(batch.length);
        for (let i = 0; i < batch.length; i++) records[i] = batch[i]!.record;
        await this.sendWithRetry(records);
        this.published += batch.length;
        for (const p of batch) p.done?.resolve();
      } catch (err) {
        this.failed += batch.length;
        for (const p of batch) {
          if (p.done) p.done.reject(err);
          else this.logger.error('event publish failed', { event: p.name, error: describeError(err) });
        }
      }
    }
  }

  /**
   * Send, retrying a retriable failure (the log unavailable: a broker restarting) with backoff, so a short outage
   * loses no event; the batch stays at the head of the queue, so order is kept.
   */
  private async sendWithRetry(records: ProduceRecord[]): Promise<void> {
    await retry(() => this.producer.send(this.topic, records), {
      forMs: this.retryForMs,
      onRetry: (err, { delayMs }) => this.logger.warn('event publish failed; retrying', { error: describeError(err), retryInMs: delayMs }),
    });
  }

  /** Wait until everything queued so far is sent (or failed). */
  async flush(): Promise<void> {
    while (this.queue.length > 0 || this.flushing || this.scheduled) {
      if (this.flushing) await this.flushing;
      else await new Promise<void>((r) => setImmediate(r));
    }
  }
}

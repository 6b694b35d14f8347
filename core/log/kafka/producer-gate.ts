// What both Kafka producers (./producer.ts on kafkajs, ./librdkafka/producer.ts) keep around every call: calls
// run one after another in the order made, and a producer that was closed or fenced refuses every later call.
import { RlstreamError } from '../../errors.ts';
import type { TxnProducer } from './transaction-state.ts';

export class ProducerGate implements TxnProducer {
  private queue: Promise<unknown> = Promise.resolve();
  private fenced: RlstreamError | null = null;
  private closed = false;

  /** `wrap` turns a client failure into an RlstreamError. */
  constructor(private readonly wrap: (err: unknown, what: string) => RlstreamError) {}

  /** Runs `fn` after every earlier call of this producer finished. */
  serial<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.queue.then(fn, fn);
    this.queue = run.catch(() => {});
    return run;
  }

  check(): void {
    if (this.closed) throw new RlstreamError('LOG_CLOSED', 'producer is closed');
    if (this.fenced) throw this.fenced;
  }

  /** Wraps a client failure; a fenced producer stays fenced. */
  fail(err: unknown, what: string): RlstreamError {
    const e = this.wrap(err, what);
    if (e.code === 'LOG_FENCED') this.fenced = e;
    return e;
  }

  /** Refuses later calls and waits for those under way; false if it was closed already. */
  async close(): Promise<boolean> {
    if (this.closed) return false;
    this.closed = true;
    await this.queue;
    return true;
  }
}

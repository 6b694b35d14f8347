// A Kafka transaction's lifecycle, shared by both clients (./producer.ts on kafkajs, ./librdkafka/producer.ts):
// which calls each state allows, and running a call in its producer's order while moving the state on.
import { RlstreamError } from '../../errors.ts';

export type TxnOp = 'send' | 'sendOffsets' | 'commit' | 'abort';
export type TxnState = 'open' | 'committing' | 'aborting' | 'committed' | 'aborted' | 'failed';

const ALLOWED: Record<TxnState, ReadonlySet<TxnOp>> = {
  open: new Set(['send', 'sendOffsets', 'commit', 'abort']),
  committing: new Set(),
  aborting: new Set(),
  committed: new Set(),
  aborted: new Set(),
  // After a failed send or commit the only way forward is abort (as in Kafka's Java client).
  failed: new Set(['abort']),
};

/** What a transaction needs from its producer. */
export interface TxnProducer {
  /** Throws if the producer is closed or fenced. */
  check(): void;
  /** Runs `fn` after every earlier call of the producer finished. */
  serial<T>(fn: () => Promise<T>): Promise<T>;
  /** Wraps a client failure (a fenced producer stays fenced). */
  fail(err: unknown, what: string): RlstreamError;
}

export class TxnLifecycle {
  private state: TxnState = 'open';

  constructor(private readonly producer: TxnProducer) {}

  /** Not yet committed or aborted: the producer may not begin another. */
  get open(): boolean {
    return this.state === 'open' || this.state === 'failed' || this.state === 'committing' || this.state === 'aborting';
  }

  guard(op: TxnOp): void {
    this.producer.check();
    if (!ALLOWED[this.state].has(op)) throw new RlstreamError('LOG_TRANSACTION_STATE', `cannot ${op} a transaction that is ${this.state}`);
  }

  /** Runs `fn` in the producer's order; a failure leaves the transaction failed (abort is all that is left). */
  async run(op: TxnOp, what: string, fn: () => Promise<unknown>): Promise<void> {
    this.guard(op);
    await this.producer.serial(async () => {
      this.guard(op);
      if (op === 'commit') this.state = 'committing';
      if (op === 'abort') this.state = 'aborting';
      try {
        await fn();
      } catch (err) {
        this.state = 'failed';
        throw this.producer.fail(err, what);
      }
      if (op === 'commit') this.state = 'committed';
      if (op === 'abort') this.state = 'aborted';
    });
  }
}

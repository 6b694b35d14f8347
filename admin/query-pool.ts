// Bounds the user queries (SQL route, named queries) one admin process runs at once: a few run, a few more
// wait, and the rest are answered 429 at once. A query holds an engine connection, memory and CPU for up to its
// time limit; a queue without a bound would let a handful of slow queries hold every later request.
import { AdminError } from './errors.ts';

export interface QueryPoolOptions {
  /** Queries running at once. */
  running: number;
  /** Queries waiting for a slot; one more is refused with ADM_ERR_BUSY. */
  queued: number;
}

export class QueryPool {
  private active = 0;
  private readonly waiting: (() => void)[] = [];

  constructor(private readonly options: QueryPoolOptions) {}

  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.active >= this.options.running) {
      if (this.waiting.length >= this.options.queued) {
        throw new AdminError('ADM_ERR_BUSY', { what: 'the query pool', detail: `${this.options.running} queries running and ${this.options.queued} waiting` });
      }
      await new Promise<void>((resolve) => this.waiting.push(resolve));
    } else {
      this.active++;
    }
    try {
      return await fn();
    } finally {
      // The slot passes straight to the next waiter (active stays the same), or is freed.
      const next = this.waiting.shift();
      if (next) next();
      else this.active--;
    }
  }
}

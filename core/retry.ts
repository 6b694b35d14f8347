// The one retry loop: an attempt runs again after a failure that may pass (by default an RlstreamError whose
// `retriable` flag is set: the log, the registry or a backend unreachable for a while), with exponential
// backoff, until it succeeds, the attempts or the time run out, or the caller's signal aborts. Callers differ
// only in what they retry, for how long and what they do between tries (log it, replace a producer, stop on a
// rebalance), so those are options and hooks, not copies of the loop.
import { RlstreamError } from './errors.ts';

export interface RetryOptions {
  /** Which failures are tried again. Default: isRetriable. */
  retriable?: (err: unknown) => boolean;
  /** Tries after the first; the last failure is thrown when they are used up. Default: unbounded. */
  retries?: number;
  /** Give up rather than wait past this many ms after the first try began. Default: unbounded. */
  forMs?: number;
  /** The first wait, doubled after each try up to maxDelayMs. Default 100 ms. */
  initialDelayMs?: number;
  /** Default 5 000 ms. */
  maxDelayMs?: number;
  /** Each wait is spread by ± this fraction, so many callers that failed together do not retry together. Default 0. */
  jitter?: number;
  /**
   * Called with the failure before each wait (try = the number of the try that failed, from 1). It may log,
   * repair state for the next try, or throw to stop retrying (what it throws is what the caller gets).
   */
  onRetry?: (err: unknown, info: { try: number; delayMs: number }) => void | Promise<void>;
  /** Aborting ends a wait at once; the signal's reason is thrown. */
  signal?: AbortSignal;
}

/** Whether a failure may pass by itself: the catalogue's retriable flag (core/errors.ts). */
export function isRetriable(err: unknown): boolean {
  return err instanceof RlstreamError && err.retriable;
}

/** Wait ms; aborting the signal ends the wait at once, rejecting with the signal's reason. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason as Error);
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal!.reason as Error);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/** Run `attempt` (given the try's number, from 1) until it succeeds or a failure is not to be retried. */
export async function retry<T>(attempt: (tryNumber: number) => Promise<T>, options: RetryOptions = {}): Promise<T> {
  const retriable = options.retriable ?? isRetriable;
  const maxDelay = options.maxDelayMs ?? 5_000;
  const jitter = options.jitter ?? 0;
  const giveUpAt = options.forMs === undefined ? Infinity : Date.now() + options.forMs;
  let delay = options.initialDelayMs ?? 100;
  for (let n = 1; ; n++) {
    try {
      return await attempt(n);
    } catch (err) {
      if (options.signal?.aborted || !retriable(err)) throw err;
      if (options.retries !== undefined && n > options.retries) throw err;
      const delayMs = Math.max(0, Math.round(delay * (1 + jitter * (2 * Math.random() - 1))));
      if (Date.now() + delayMs > giveUpAt) throw err;
      await options.onRetry?.(err, { try: n, delayMs });
      await sleep(delayMs, options.signal);
      delay = Math.min(delay * 2, maxDelay);
    }
  }
}

// core/retry.ts, the one retry loop: what is retried, the bounds (tries, time), the backoff, the hooks and the
// abort signal.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RlstreamError } from '../../core/errors.ts';
import { isRetriable, retry } from '../../core/retry.ts';

const unavailable = (): RlstreamError => new RlstreamError('LOG_UNAVAILABLE', 'broker down');

test('a retriable failure is tried again until the attempt succeeds; the waits double up to the cap', async () => {
  const waits: number[] = [];
  let tries = 0;
  const out = await retry(
    async (n) => {
      tries++;
      assert.equal(n, tries);
      if (n < 5) throw unavailable();
      return 'ok';
    },
    { initialDelayMs: 1, maxDelayMs: 4, onRetry: (_err, { delayMs }) => void waits.push(delayMs) },
  );
  assert.equal(out, 'ok');
  assert.deepEqual(waits, [1, 2, 4, 4]);
});

test('a failure that is not retriable is thrown at once, without a wait', async () => {
  let tries = 0;
  const bad = new RlstreamError('INPUT_INVALID', 'no');
  await assert.rejects(retry(async () => (tries++, Promise.reject(bad)), { initialDelayMs: 1 }), (e) => e === bad);
  assert.equal(tries, 1);
  assert.equal(isRetriable(bad), false);
  assert.equal(isRetriable(unavailable()), true);
  assert.equal(isRetriable(new Error('plain')), false);
  // The code's default can be overridden either way.
  assert.equal(isRetriable(new RlstreamError('LOG_UNAVAILABLE', 'x', { retriable: false })), false);
});

test('retries and forMs bound the loop; the last failure is what the caller gets', async () => {
  let tries = 0;
  const last = await retry(
    async () => {
      tries++;
      throw new RlstreamError('BACKEND_UNAVAILABLE', `try ${tries}`);
    },
    { retries: 2, initialDelayMs: 1 },
  ).catch((e: unknown) => e);
  assert.equal(tries, 3);
  assert.match((last as Error).message, /try 3/);
  const start = Date.now();
  tries = 0;
  await assert.rejects(retry(async () => (tries++, Promise.reject(unavailable())), { forMs: 60, initialDelayMs: 10, maxDelayMs: 10 }));
  assert.ok(Date.now() - start < 1000);
  assert.ok(tries >= 3 && tries <= 8, `${tries} tries in 60 ms of 10 ms waits`);
});

test('a custom predicate picks what is retried; onRetry may stop the loop by throwing', async () => {
  let tries = 0;
  const out = await retry(async () => (++tries < 3 ? Promise.reject(new Error('busy')) : tries), { retriable: (e) => (e as Error).message === 'busy', initialDelayMs: 1 });
  assert.equal(out, 3);
  const stop = new Error('moved');
  await assert.rejects(
    retry(() => Promise.reject(unavailable()), {
      initialDelayMs: 1,
      onRetry: () => {
        throw stop;
      },
    }),
    (e) => e === stop,
  );
});

test('aborting the signal ends a wait at once with its reason', async () => {
  const ac = new AbortController();
  const start = Date.now();
  setTimeout(() => ac.abort(new Error('stopped')), 20);
  await assert.rejects(retry(() => Promise.reject(unavailable()), { initialDelayMs: 10_000, signal: ac.signal }), /stopped/);
  assert.ok(Date.now() - start < 5_000);
});

test('jitter spreads each wait within ± the fraction', async () => {
  const waits: number[] = [];
  let tries = 0;
  await retry(async () => (++tries <= 40 ? Promise.reject(unavailable()) : 0), {
    initialDelayMs: 0,
    jitter: 0.2,
    onRetry: (_e, { delayMs }) => void waits.push(delayMs),
  });
  assert.equal(waits.length, 40);
  assert.ok(waits.every((w) => w === 0));
  const spread: number[] = [];
  tries = 0;
  await retry(async () => (++tries <= 20 ? Promise.reject(unavailable()) : 0), {
    initialDelayMs: 10,
    maxDelayMs: 10,
    jitter: 0.2,
    onRetry: (_e, { delayMs }) => void spread.push(delayMs),
  });
  assert.ok(spread.every((w) => w >= 8 && w <= 12), spread.join(','));
  assert.ok(new Set(spread).size > 1, 'the waits differ');
});

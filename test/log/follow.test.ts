// follow() (core/log/follow.ts), on the embedded log: a consumer whose polls fail for good is closed and a new one
// opened, which reads on; a handler's failure is reported and the same consumer reads on; close ends the loop
// and closes the consumer. The failing consumer is a FAKE (a real embedded consumer whose poll is made to throw):
// a client that crashed for good, as Kafka's did after a broker restart, cannot be made to happen here at will.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { follow } from '../../core/log/follow.ts';
import type { Consumer, EventLog } from '../../core/log/types.ts';

async function until(what: string, cond: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

test('follow reopens a consumer whose polls fail, keeps it after a handler failure, and closes it', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-follow-'));
  const log = openEmbeddedLog({ dir });
  try {
    await log.createTopic({ name: 't', partitions: 1 });
    const producer = await log.producer();
    await producer.send('t', [{ value: Buffer.from('a') }]);

    const opened: { consumer: Consumer; closed: boolean }[] = [];
    let broken = true;
    const watched: EventLog = Object.create(log, {
      consumer: {
        value: async (o: Parameters<EventLog['consumer']>[0]) => {
          const consumer = await log.consumer(o);
          const entry = { consumer, closed: false };
          opened.push(entry);
          // The first consumer is the crashed one: every poll throws.
          const failing = broken;
          broken = false;
          return Object.assign(Object.create(consumer) as Consumer, {
            poll: failing ? () => Promise.reject(new Error('client crashed')) : consumer.poll.bind(consumer),
            close: async () => {
              entry.closed = true;
              await consumer.close();
            },
          });
        },
      },
    });

    const seen: string[] = [];
    const errors: string[] = [];
    let failHandler = false;
    const follower = follow(
      watched,
      (records) => {
        if (failHandler) {
          failHandler = false;
          throw new Error('handler failed');
        }
        seen.push(...records.map((r) => r.value.toString()));
      },
      { consumer: () => ({ groupId: 'g', topics: ['t'], fromBeginning: true }), poll: { timeoutMs: 50 }, retryDelayMs: 10, onError: (err, where) => errors.push(`${where}: ${(err as Error).message}`) },
    );

    await until('the record through a new consumer', () => seen.includes('a'));
    assert.equal(opened.length, 2);
    assert.equal(opened[0]!.closed, true, 'the failed consumer was closed');
    assert.equal(opened[1]!.closed, false);
    assert.ok(errors.length >= 1 && errors.every((e): boolean => e === 'poll: client crashed'), errors.join('; '));

    failHandler = true;
    await producer.send('t', [{ value: Buffer.from('b') }]);
    await until('the handler failure', () => errors.includes('handle: handler failed'));
    await producer.send('t', [{ value: Buffer.from('c') }]);
    await until('the next record', () => seen.includes('c'));
    assert.equal(opened.length, 2, 'a handler failure keeps the consumer');
    assert.deepEqual(seen, ['a', 'c']);

    await follower.close();
    assert.equal(opened[1]!.closed, true);
    await producer.close();
  } finally {
    await log.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

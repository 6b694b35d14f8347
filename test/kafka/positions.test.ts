// The commit both Kafka clients share (core/log/kafka/positions.ts): what it does with each outcome of the
// client's send. A rebalance, whether the library reports it or the client learns it by reading the commit
// back, voids an implicit commit and makes an explicit one the caller's to retry; any other failure is the
// client's error.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RlstreamError } from '../../core/errors.ts';
import { Positions } from '../../core/log/kafka/positions.ts';
import { silentLogger } from '../../core/telemetry.ts';
import type { TopicPartitionOffset } from '../../core/log/types.ts';

const REBALANCE_CODE = 27;

function positions(): Positions {
  const p = new Positions();
  const list = [{ topic: 't', partition: 0, offset: 5 }];
  p.start(list);
  p.publish(list);
  return p;
}

function client(outcome: () => Promise<void | 'rebalanced'>, sent: TopicPartitionOffset[][] = []) {
  return {
    send: (list: TopicPartitionOffset[]) => {
      sent.push(list);
      return outcome();
    },
    isRebalance: (err: unknown) => (err as { code?: number }).code === REBALANCE_CODE,
    wrap: (err: unknown, what: string) => new RlstreamError('LOG_UNAVAILABLE', `${what}: ${String(err)}`, { cause: err }),
  };
}

const retriableRebalance = (e: unknown) => e instanceof RlstreamError && e.code === 'LOG_UNAVAILABLE' && e.retriable && /rebalancing, retry after the next poll/.test(e.message);

test('an implicit commit sends the positions after everything polled', async () => {
  const sent: TopicPartitionOffset[][] = [];
  await positions().commit(undefined, 'g', silentLogger, client(async () => {}, sent));
  assert.deepEqual(sent, [[{ topic: 't', partition: 0, offset: 5 }]]);
});

for (const [how, outcome] of [
  ['the client read the commit back after the group rebalanced', async () => 'rebalanced' as const],
  ['the library reported a rebalance', async () => Promise.reject(Object.assign(new Error('Broker: Group rebalance in progress'), { code: REBALANCE_CODE }))],
] as const) {
  test(`${how}: an explicit commit is the caller's to retry, an implicit one is void`, async () => {
    await assert.rejects(positions().commit([{ topic: 't', partition: 0, offset: 3 }], 'g', silentLogger, client(outcome)), retriableRebalance);
    await positions().commit(undefined, 'g', silentLogger, client(outcome));
  });
}

test("any other failure is the client's error, implicit commit or not", async () => {
  const broken = client(async () => Promise.reject(new Error('disk full')));
  for (const offsets of [undefined, [{ topic: 't', partition: 0, offset: 3 }]]) {
    await assert.rejects(positions().commit(offsets, 'g', silentLogger, broken), (e: unknown) => e instanceof RlstreamError && /commit of group g: Error: disk full/.test(e.message));
  }
});

// How kafkajs failures are classified (core/log/kafka/errors.ts), which decides what the stream processors
// retry: a busy transaction coordinator (CONCURRENT_TRANSACTIONS and friends) is retriable even when kafkajs
// wraps it after its own retries; fencing and transaction-state errors are not. Errors are built with kafkajs's
// own classes and the descriptors its protocol table uses; no broker needed. And the deadline librdkafka's
// transactional calls run under (core/log/kafka/librdkafka/errors.ts), which turns a call that never answers into
// an error a role stops on.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import kafkajs from 'kafkajs';
import { fromKafka, isCoordinatorBusy } from '../../core/log/kafka/errors.ts';
import { withDeadline } from '../../core/log/kafka/librdkafka/errors.ts';
import { stuckCalls } from '../../core/stuck-calls.ts';
import type { RlstreamError } from '../../core/errors.ts';

// kafkajs is CommonJS: its classes are properties of the default export.
const { KafkaJSConnectionError, KafkaJSNumberOfRetriesExceeded, KafkaJSProtocolError } = kafkajs;

const protocol = (type: string, code: number, retriable: boolean) => new KafkaJSProtocolError({ type, code, retriable, message: `${type} from the broker` } as never);

test('a busy coordinator is retriable, bare or wrapped by kafkajs after its own retries', () => {
  const concurrent = protocol('CONCURRENT_TRANSACTIONS', 51, true);
  const wrapped = new KafkaJSNumberOfRetriesExceeded(concurrent, { retryCount: 5, retryTime: 2000 });
  for (const err of [concurrent, wrapped]) {
    const e = fromKafka(err, 'send offsets of group g in a transaction');
    assert.equal(e.code, 'LOG_UNAVAILABLE');
    assert.equal(e.retriable, true, e.message);
    assert.match(e.message, /CONCURRENT_TRANSACTIONS/);
    assert.ok(isCoordinatorBusy(err));
  }
  for (const [type, code] of [['GROUP_LOAD_IN_PROGRESS', 14], ['GROUP_COORDINATOR_NOT_AVAILABLE', 15], ['NOT_COORDINATOR_FOR_GROUP', 16]] as const) {
    assert.ok(isCoordinatorBusy(protocol(type, code, true)), type);
    assert.equal(fromKafka(protocol(type, code, true), 'x').retriable, true, type);
  }
});

test('a timeout or a lost connection is retriable but not a busy coordinator (a commit\u2019s outcome stays unknown)', () => {
  const timeout = protocol('REQUEST_TIMED_OUT', 7, true);
  assert.equal(fromKafka(timeout, 'commit').retriable, true);
  assert.equal(isCoordinatorBusy(timeout), false);
  const lost = new KafkaJSConnectionError('Connection error: ECONNREFUSED', { broker: '127.0.0.1:19092', code: 'ECONNREFUSED' } as never);
  assert.equal(fromKafka(lost, 'commit').code, 'LOG_UNAVAILABLE');
  assert.equal(isCoordinatorBusy(lost), false);
});

test('fencing and transaction-state errors are not retriable, wrapped or not', () => {
  const fenced = fromKafka(new KafkaJSNumberOfRetriesExceeded(protocol('INVALID_PRODUCER_EPOCH', 47, false), { retryCount: 0, retryTime: 0 }), 'commit');
  assert.equal(fenced.code, 'LOG_FENCED');
  assert.equal(fenced.retriable, false);
  const state = fromKafka(protocol('INVALID_TXN_STATE', 48, false), 'commit');
  assert.equal(state.code, 'LOG_TRANSACTION_STATE');
  assert.equal(state.retriable, false);
  assert.equal(isCoordinatorBusy(protocol('INVALID_TXN_STATE', 48, false)), false);
});

test('a librdkafka call that never answers fails at its deadline, not retriable; one that answers passes through', async () => {
  const t0 = Date.now();
  await assert.rejects(withDeadline('transactional sendOffsets', 150, new Promise(() => {})), (e: RlstreamError) => {
    assert.equal(e.code, 'LOG_UNAVAILABLE');
    assert.equal(e.retriable, false);
    assert.match(e.message, /transactional sendOffsets: librdkafka did not answer within 150 ms/);
    return true;
  });
  assert.ok(Date.now() - t0 >= 140, 'waited for the deadline');
  // The abandoned call still holds a thread: the process's exit must not wait for it (core/stuck-calls.ts).
  assert.ok(stuckCalls().includes('librdkafka transactional sendOffsets'), JSON.stringify(stuckCalls()));
  // One that answers after its deadline is forgotten once it does.
  await assert.rejects(withDeadline('late commit', 50, new Promise((r) => setTimeout(r, 200))), /late commit: librdkafka did not answer within 50 ms/);
  assert.ok(stuckCalls().includes('librdkafka late commit'));
  await new Promise((r) => setTimeout(r, 250));
  assert.ok(!stuckCalls().includes('librdkafka late commit'), JSON.stringify(stuckCalls()));
  assert.equal(await withDeadline('commit', 10_000, Promise.resolve(7)), 7);
  await assert.rejects(withDeadline('commit', 10_000, Promise.reject(new Error('broker said no'))), /broker said no/);
});

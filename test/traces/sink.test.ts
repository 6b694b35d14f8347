// The trace sink on the embedded log: offsets are committed after inserts (a restarted sink resumes without
// re-reading), undecodable records become dead_letters rows naming the sink, and a failing store keeps the
// offsets where they were so nothing is lost.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isRlstreamError } from '../../core/errors.ts';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import type { EventLog } from '../../core/log/types.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { TOPICS } from '../../core/topics.ts';
import { TRACE_TABLES, type TraceStore } from '../../core/traces/store.ts';
import { TraceSink } from '../../consumers/traces/sink.ts';
import { nativeAvailable } from '../../native/index.ts';
import { PLANS } from '../../consumers/traces/transcode.ts';
import type { EventName } from '../../schemas/index.ts';
import type { EventTypes } from '../../schemas/generated/types.ts';
import { recordRun } from '../../testkit/record-run.ts';
import { targets } from './targets.ts';

/** An embedded log with its registry and a store of the first target, closed and removed after `body`. */
async function withSinkFixture(name: string, body: (f: { log: EventLog; serde: EventSerde; store: TraceStore }) => Promise<void>): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), `rlstream-${name}-`));
  const log = openEmbeddedLog({ dir, fsync: 'none' });
  const registry = await EmbeddedRegistry.open(log);
  const serde = await new EventSerde(registry).init();
  const store = await targets()[0]!.open(name);
  try {
    await body({ log, serde, store });
  } finally {
    await store.close();
    await registry.close();
    await log.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * The log, with the `stallAt`-th poll of its consumers (of either kind) coming back empty: a Kafka fetch that
 * stalls in the middle of a topic, as one did in a 1M-turn drain from Kafka.
 */
function stallingLog(log: EventLog, stallAt: number): EventLog {
  const stall = <T extends (...a: never[]) => Promise<unknown[]>>(poll: T, polls: { n: number }): T =>
    ((...a: Parameters<T>) => (++polls.n === stallAt ? Promise.resolve([]) : poll(...a))) as T;
  return new Proxy(log, {
    get: (t, p) =>
      p !== 'consumer'
        ? Reflect.get(t, p)
        : async (...args: Parameters<EventLog['consumer']>) => {
            const c = await t.consumer(...args);
            const polls = { n: 0 };
            return new Proxy(c, {
              get: (ct, cp) => {
                const v = Reflect.get(ct, cp) as unknown;
                if ((cp === 'poll' || cp === 'pollChunks') && typeof v === 'function') return stall((v as (...a: never[]) => Promise<unknown[]>).bind(ct), polls);
                return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(ct) : v;
              },
            });
          },
  });
}

test('sink: a drain reads to the end the log had when it began, through an empty poll in the middle', { timeout: 60_000 }, async () => {
  await withSinkFixture('sink_stall', async ({ log, serde, store }) => {
    const { sent } = await recordRun(log, serde, { groups: 40, runId: 'stall' });
    // Polls of 50 records: the third of them comes back empty with most of the log still unread.
    const sink = new TraceSink({ log: stallingLog(log, 3), store, serde, groupId: 'traces', pollRecords: 50 });
    await sink.drain();
    await sink.stop();
    assert.equal(sink.stats.records, sent);
    assert.ok((await log.lag('traces', TOPICS.rolloutEvents)).every((l) => l.lag === 0), 'everything committed');
    const n = (await store.query("SELECT count() AS n FROM trajectories FINAL WHERE run_id = 'stall'")).rows[0]?.['n'];
    assert.equal(n, 160);
  });
});

test('sink: a drain whose positions stop short of the listed ends fails with a retriable error naming them, instead of hanging', { timeout: 60_000 }, async () => {
  await withSinkFixture('sink_short', async ({ log, serde, store }) => {
    await recordRun(log, serde, { groups: 2, runId: 'short' });
    // rollout.events listed 5 records past its end on partition 0: a position that can never get there.
    const lying = new Proxy(log, {
      get: (t, p) =>
        p === 'offsets'
          ? async (name: string) => (await t.offsets(name)).map((o) => (name === TOPICS.rolloutEvents && o.partition === 0 ? { ...o, high: o.high + 5 } : o))
          : (Reflect.get(t, p) as unknown),
    });
    const sink = new TraceSink({ log: lying, store, serde, groupId: 'traces', pollTimeoutMs: 20 });
    await assert.rejects(sink.drain({ stallMs: 300 }), (e: unknown) => isRlstreamError(e, 'LOG_UNAVAILABLE') && e.retriable === true && e.message.includes(`${TOPICS.rolloutEvents}/0 at `));
    await sink.stop();
  });
});

test('sink: commits after insert, resumes, dead-letters poison, keeps offsets when the store fails', { timeout: 60_000 }, async () => {
  await withSinkFixture('sink', async ({ log, serde, store }) => {
    const { sent } = await recordRun(log, serde, { groups: 5, runId: 'r1' });
    const producer = await log.producer();
    await producer.send(TOPICS.rolloutEvents, [{ key: 'g', value: Buffer.from([0, 0, 0, 0, 99, 1, 2]) }, { key: 'g', value: Buffer.from('not framed') }]);
    await producer.close();

    const first = new TraceSink({ log, store, serde, groupId: 'traces' });
    await first.drain();
    await first.stop();
    assert.equal(first.stats.records, sent + 2);
    assert.equal(first.stats.deadLetters, 2);
    const lag = await log.lag('traces', TOPICS.rolloutEvents);
    assert.ok(lag.every((l) => l.lag === 0), 'everything committed');
    const dl = (await store.query("SELECT error_code, count() AS n FROM dead_letters FINAL WHERE consumer = 'trace-sink' GROUP BY error_code ORDER BY error_code")).rows;
    assert.deepEqual(dl, [
      { error_code: 'SERDE_MAGIC_BYTE', n: 1 },
      { error_code: 'SERDE_UNKNOWN_SCHEMA', n: 1 },
    ]);

    const again = new TraceSink({ log, store, serde, groupId: 'traces' });
    await again.drain();
    await again.stop();
    assert.equal(again.stats.records, 0, 'a restarted sink resumes after the committed offsets');

    // A store that fails: the sink must not commit what it could not write.
    await recordRun(log, serde, { groups: 1, runId: 'r2' });
    // Both write paths fail: rows as objects (insert) and rows the writer encoded as they arrived (insertEncoded).
    const down = async () => Promise.reject(new Error('store down'));
    const broken = new Proxy(store, { get: (t, p) => (p === 'insert' || p === 'insertEncoded' ? down : Reflect.get(t, p)) }) as TraceStore;
    const failing = new TraceSink({ log, store: broken, serde, groupId: 'traces' });
    await assert.rejects(failing.drain(), /store down/);
    await assert.rejects(failing.stop(), /store down/);
    assert.ok((await log.lag('traces', TOPICS.rolloutEvents)).some((l) => l.lag > 0), 'offsets not committed past unwritten rows');
    const recovered = new TraceSink({ log, store, serde, groupId: 'traces' });
    await recovered.drain();
    await recovered.stop();
    const n = (await store.query("SELECT count() AS n FROM trajectories FINAL WHERE run_id = 'r2'")).rows[0]?.['n'];
    assert.equal(n, 4);
  });
});

/** A store whose writes wait while a gate is closed (`close()`), so a write is in flight while the sink reads on. */
function gatedStore(store: TraceStore): { store: TraceStore; started: () => number; close: () => void; open: () => void } {
  let release: () => void = () => {};
  let gate: Promise<void> | null = null;
  let started = 0;
  const gated = new Proxy(store, {
    get: (t, p) =>
      p === 'insert' || p === 'insertEncoded'
        ? async (...args: unknown[]) => {
            started++;
            if (gate) await gate;
            return (Reflect.get(t, p) as (...a: unknown[]) => Promise<void>).apply(t, args);
          }
        : Reflect.get(t, p),
  }) as TraceStore;
  return {
    store: gated,
    started: () => started,
    close: () => void (gate = new Promise((r) => (release = r))),
    open: () => {
      gate = null;
      release();
    },
  };
}

test('sink: while a batch is being written the next is read, and offsets are committed only after their rows', { timeout: 60_000 }, async () => {
  await withSinkFixture('sinkpipe', async ({ log, serde, store }) => {
    const { sent } = await recordRun(log, serde, { groups: 6, runId: 'p1' });
    const gated = gatedStore(store);
    const committed = async () => (await log.committed('pipe', TOPICS.rolloutEvents)).reduce((n, c) => n + Math.max(0, c.offset), 0);
    const sink = new TraceSink({ log, store: gated.store, serde, groupId: 'pipe', maxRows: 25, pollRecords: 10 });
    gated.close();
    while (gated.started() === 0) {
      await sink.step();
      await new Promise((r) => setImmediate(r));
    }
    const held = await committed();
    // The first batch is held: reading goes on, but nothing past the rows being written is committed.
    const read = sink.stats.records;
    await sink.step();
    assert.ok(sink.stats.records > read, 'the sink reads on while a batch is written');
    assert.equal(await committed(), held, 'no commit before the batch in flight is written');
    gated.open();
    await sink.drain();
    await sink.stop();
    assert.equal(sink.stats.records, sent);
    assert.ok(sink.stats.flushes > 3, `several batches (${sink.stats.flushes})`);
    assert.ok((await log.lag('pipe', TOPICS.rolloutEvents)).every((l) => l.lag === 0), 'everything committed in the end');
    const n = (await store.query("SELECT count() AS n FROM turns FINAL WHERE run_id = 'p1'")).rows[0]?.['n'];
    assert.equal(n, 6 * 4 * 5, 'every turn written once');
  });
});

test('sink: a catch-up from the first poll on encodes rows as they arrive (no batch of row objects)', { timeout: 60_000 }, async () => {
  await withSinkFixture('sinkenc', async ({ log, serde, store }) => {
    const { sent } = await recordRun(log, serde, { groups: 4, runId: 'e1' });
    const calls = { insert: 0, insertEncoded: 0 };
    const counting = new Proxy(store, {
      get: (t, p) =>
        p === 'insert' || p === 'insertEncoded'
          ? (...args: unknown[]) => {
              calls[p]++;
              return (Reflect.get(t, p) as (...a: unknown[]) => Promise<void>).apply(t, args);
            }
          : Reflect.get(t, p),
    }) as TraceStore;
    // One batch for the whole run: before the codecs were awaited at start, all of it was kept as objects.
    const sink = new TraceSink({ log, store: counting, serde, groupId: 'enc', maxRows: 1_000_000 });
    await sink.drain();
    await sink.stop();
    assert.equal(sink.stats.records, sent);
    assert.equal(calls.insert, 0, 'no rows inserted as objects');
    assert.ok(calls.insertEncoded > 0);
    const n = (await store.query("SELECT count() AS n FROM turns FINAL WHERE run_id = 'e1'")).rows[0]?.['n'];
    assert.equal(n, 4 * 4 * 5);
    if (store.dialect === 'current') {
      // Migration 0004: an insert-sized part is one Compact data file, not two files per column.
      const types = (await store.query(`SELECT DISTINCT part_type AS t FROM system.parts WHERE database = currentDatabase() AND table = 'turns' AND active`)).rows;
      assert.deepEqual(types, [{ t: 'Compact' }]);
    }
  });
});

test('sink: through its native transcoders it stores exactly what the general path stores, table by table', { timeout: 120_000, skip: nativeAvailable() ? false : 'the native addon is not built (or RLSTREAM_NATIVE=off)' }, async () => {
  await withSinkFixture('sinktc', async ({ log, serde, store }) => {
    // Duplicates (a producer's retries) and a record no schema reads: both paths must treat them alike.
    const { sent, events } = await recordRun(log, serde, { groups: 6, runId: 't1' }, 7);
    // Records the transcoders write: those of planned events, every 7th event sent twice.
    const planned = events.reduce((n, e, i) => n + (PLANS[e.name as EventName] ? ((i + 1) % 7 === 0 ? 2 : 1) : 0), 0);
    const producer = await log.producer();
    // A turn whose latency is NaN: a transcoder declines it (the general path writes 0 for non-finite values),
    // and a chunk read in place hands it to the general path alone.
    const turn = events.find((e) => e.name === 'TurnCompleted')!;
    const odd = serde.encode('TurnCompleted', { ...(turn.value as EventTypes['TurnCompleted']), event_id: 'nan-latency', latency_ms: NaN });
    await producer.send(TOPICS.rolloutEvents, [
      { key: turn.key, value: odd, timestamp: Date.now() },
      { key: 'x', value: Buffer.from([0, 0, 0, 0, 99, 1, 2]), timestamp: Date.now() },
    ]);
    await producer.close();
    const general = await targets()[0]!.open('sinktc_general');
    try {
      const fast = new TraceSink({ log, store, serde, groupId: 'tc-fast' });
      const slow = new TraceSink({ log, store: general, serde, groupId: 'tc-slow', transcode: false });
      for (const s of [fast, slow]) {
        await s.drain();
        await s.stop();
        assert.equal(s.stats.records, sent + 2);
      }
      assert.equal(slow.stats.transcoded, 0);
      // Every record of a planned event is transcoded but the NaN turn; TrainStep, PolicyVersion and the poison
      // record have no plan.
      assert.equal(fast.stats.transcoded, planned);
      assert.ok(planned > 0.9 * sent);
      const nan = await store.query("SELECT latency_ms FROM turns FINAL WHERE event_id = 'nan-latency'");
      assert.deepEqual(nan.rows, [{ latency_ms: 0 }]);
      for (const table of TRACE_TABLES) {
        // Every column of every row (tuple(*) as text: a NULL anywhere would make a plain hash NULL).
        const digest = async (s: TraceStore) => (await s.query(`SELECT count() AS n, toString(sum(cityHash64(toString(tuple(*))))) AS h FROM ${table} FINAL`)).rows[0];
        const [a, b] = [await digest(store), await digest(general)];
        assert.ok(Number(a?.['n']) === 0 || a?.['h'] !== null, `${table}: a digest, not NULL`);
        assert.deepEqual(a, b, `${table}: same rows on both paths`);
      }
      const turns = (await store.query("SELECT count() AS n FROM turns FINAL WHERE run_id = 't1'")).rows[0]?.['n'];
      assert.equal(Number(turns), 6 * 4 * 5);
    } finally {
      await general.close();
    }
  });
});

test('sink: while the engine is busy a due batch fills on, up to growWhileBusy batches, then waits', { timeout: 60_000 }, async () => {
  for (const growWhileBusy of [1, 2]) {
    await withSinkFixture(`sinkgrow${growWhileBusy}`, async ({ log, serde, store }) => {
      const { sent } = await recordRun(log, serde, { groups: 8, runId: 'g1' });
      const gated = gatedStore(store);
      gated.close();
      const sink = new TraceSink({ log, store: gated.store, serde, groupId: 'grow', maxRows: 25, maxDelayMs: 60_000, pollRecords: 10, growWhileBusy });
      while (gated.started() === 0) {
        await sink.step();
        await new Promise((r) => setImmediate(r));
      }
      const first = sink.stats.records; // the batch being written, and the poll that made it due
      // Step until a step waits for the write in flight (the queue is full) or the log runs out. A waiting step never
      // ends while the gate is closed; 3 s tells it from a step that is only slow on a loaded machine (300 ms did not).
      let waiting: Promise<number> | null = null;
      while (sink.stats.records < sent) {
        const step = sink.step();
        const done = await Promise.race([step.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), 3_000))]);
        if (!done) {
          waiting = step;
          break;
        }
      }
      assert.ok(waiting, 'a step waits for the write in flight once the queue is full');
      const readOn = sink.stats.records - first;
      // Rows queued when it waited: at least growWhileBusy batches, and at most one poll past them.
      assert.ok(readOn >= 25 * growWhileBusy && readOn < 25 * growWhileBusy + 10, `read ${readOn} records past the first batch with growWhileBusy ${growWhileBusy}`);
      gated.open();
      await waiting;
      await sink.drain();
      await sink.stop();
      assert.equal(sink.stats.records, sent);
      const n = (await store.query("SELECT count() AS n FROM turns FINAL WHERE run_id = 'g1'")).rows[0]?.['n'];
      assert.equal(n, 8 * 4 * 5, 'every turn written once');
    });
  }
});

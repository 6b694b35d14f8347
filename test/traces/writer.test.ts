// TraceWriter encodes rows as they arrive (RowBinary, the store's codec) and keeps them as objects only before
// a table's codec is known or when a value does not encode: both kinds reach the store, a failed flush keeps
// every row for the next attempt, rows added during a flush (or after an idle writer's flush() call) are written
// by the next one, a bad value is reported with its column, and a flush hands its tables over largest first.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isRlstreamError } from '../../core/errors.ts';
import type { DecodedEvent } from '../../core/serde/events.ts';
import type { Row, TraceStore, TraceTable } from '../../core/traces/store.ts';
import { rowsOf } from '../../consumers/traces/rows.ts';
import { TraceWriter } from '../../consumers/traces/writer.ts';
import { syntheticRun } from '../../testkit/synthetic-run.ts';
import { targets } from './targets.ts';

function turnRows(): Row[] {
  const out: Row[] = [];
  for (const ev of syntheticRun({ groups: 3, groupSize: 2, assistantTurns: 2, tokensPerTurn: 5, seed: 9 })) {
    for (const { table, row } of rowsOf({ name: ev.name, value: ev.value, schemaId: 0 } as DecodedEvent)) if (table === 'turns') out.push(row);
  }
  return out;
}

/** The store, with writes that can be made to fail or to wait, and a count of each write path's calls. */
function controlled(store: TraceStore) {
  const calls = { insert: 0, insertEncoded: 0 };
  let failing = false;
  let gate: Promise<void> | null = null;
  let open = () => {};
  let started = () => {};
  const proxy = new Proxy(store, {
    get: (t, p) => {
      if (p === 'insert' || p === 'insertEncoded') {
        return async (...args: unknown[]) => {
          calls[p]++;
          started();
          if (gate) await gate;
          if (failing) throw new Error('store down');
          return (Reflect.get(t, p) as (...a: unknown[]) => Promise<void>).apply(t, args);
        };
      }
      return Reflect.get(t, p);
    },
  }) as TraceStore;
  return {
    proxy,
    calls,
    fail: (on: boolean) => (failing = on),
    /** Writes wait until the returned function is called; resolves `writing` when the first one starts. */
    hold(): { writing: Promise<void>; release: () => void } {
      gate = new Promise((r) => (open = r));
      const writing = new Promise<void>((r) => (started = r));
      return { writing, release: () => ((gate = null), open(), (started = () => {})) };
    },
  };
}

const COUNT = 'SELECT count() AS n FROM turns FINAL';

for (const target of targets()) {
  test(`${target.name}: rows encoded on arrival and rows kept as objects both arrive; failures keep them`, { skip: target.skip ?? false }, async () => {
    const store = await target.open('writer');
    try {
      const rows = turnRows();
      const c = controlled(store);
      const writer = new TraceWriter(c.proxy, { maxRows: 1_000_000 });
      // Before the codec is known: kept as objects, written through insert().
      writer.add('turns', rows[0]!);
      await writer.prepare(['turns']);
      for (const r of rows.slice(1, 10)) writer.add('turns', r);
      assert.equal(writer.pending, 10);
      assert.ok(writer.pendingBytes > 0, 'rows after prepare() are encoded on arrival');

      c.fail(true);
      await assert.rejects(writer.flush(), /store down/);
      assert.equal(writer.pending, 10, 'a failed flush keeps every row');
      c.fail(false);
      assert.equal(await writer.flush(), 10);
      assert.ok(c.calls.insert >= 1 && c.calls.insertEncoded >= 1, 'both write paths were used');
      assert.equal((await store.query(COUNT)).rows[0]?.['n'], 10);

      // Rows added while a flush is in flight are written by the next flush, not lost or doubled.
      for (const r of rows.slice(10, 15)) writer.add('turns', r);
      const held = c.hold();
      const inFlight = writer.flush();
      await held.writing;
      for (const r of rows.slice(15)) writer.add('turns', r);
      held.release();
      assert.equal(await inFlight, 5);
      assert.equal(writer.pending, rows.length - 15);
      await writer.flush();
      assert.equal(writer.pending, 0);
      assert.equal((await store.query(COUNT)).rows[0]?.['n'], rows.length);
      assert.equal(writer.stats.rows, rows.length);

      // A value that does not encode: the row is kept, the flush names the column, and the other rows wait.
      const bad: Row = { ...rows[0]!, turn_index: 777, token_ids: [1, -2] };
      writer.add('turns', { ...rows[0]!, turn_index: 776 });
      writer.add('turns', bad);
      await assert.rejects(writer.flush(), (e) => isRlstreamError(e, 'TRACE_STORE') && /token_ids/.test(e.message));
      assert.equal(writer.pending, 2);
    } finally {
      await store.close();
    }
  });
}

test('due() counts rows and encoded bytes', async () => {
  const store = await targets()[0]!.open('writerdue');
  try {
    const writer = new TraceWriter(store, { maxRows: 1_000_000, maxBytes: 2_000, maxDelayMs: 60_000 });
    await writer.prepare(['turns' as TraceTable]);
    const rows = turnRows();
    let i = 0;
    while (!writer.due()) writer.add('turns', rows[i++ % rows.length]!);
    assert.ok(writer.pendingBytes >= 2_000 && i < 100, `due after ${i} rows, ${writer.pendingBytes} bytes`);
    // An idle writer's flush takes the queued rows when called: no longer due, and later rows are the next batch.
    const queued = writer.pending;
    const first = writer.flush();
    assert.equal(writer.due(), false);
    assert.equal(writer.pendingBytes, 0);
    writer.add('turns', rows[0]!);
    assert.equal(await first, queued);
    assert.equal(await writer.flush(), 1);
    assert.equal((await store.query('SELECT count() AS n FROM turns')).rows[0]?.['n'], queued + 1);
  } finally {
    await store.close();
  }
});

test("a flush hands its tables to the store largest first, so the largest does not queue behind another", async () => {
  const store = await targets()[0]!.open('writerorder');
  try {
    const handed: { table: string; bytes: number }[] = [];
    const recording = new Proxy(store, {
      get: (t, p) =>
        p === 'insertEncoded'
          ? (codec: { table: string }, payload: Buffer, ...rest: unknown[]) => (
              handed.push({ table: codec.table, bytes: payload.length }),
              (Reflect.get(t, p) as (...a: unknown[]) => Promise<void>).call(t, codec, payload, ...rest)
            )
          : Reflect.get(t, p),
    }) as TraceStore;
    const by = new Map<TraceTable, Row[]>();
    for (const ev of syntheticRun({ groups: 4, groupSize: 2, assistantTurns: 2, tokensPerTurn: 40, seed: 3 })) {
      for (const { table, row } of rowsOf({ name: ev.name, value: ev.value, schemaId: 0 } as DecodedEvent)) (by.get(table) ?? by.set(table, []).get(table)!).push(row);
    }
    const writer = new TraceWriter(recording, { maxRows: 1_000_000, maxBytes: 1 << 30, maxDelayMs: 60_000 });
    const tables = ['tool_calls', 'trajectories', 'turns'] as TraceTable[];
    await writer.prepare(tables);
    // Added smallest table first: the order handed to the store must come from the sizes, not from arrival.
    for (const t of tables) for (const row of by.get(t)!) writer.add(t, row);
    await writer.flush();
    assert.deepEqual(handed.map((h) => h.table).sort(), [...tables].sort(), 'each table handed over once');
    assert.deepEqual(handed.map((h) => h.bytes), handed.map((h) => h.bytes).sort((a, b) => b - a), 'largest first');
    assert.notDeepEqual(handed.map((h) => h.table), tables, 'the sizes differ from the arrival order, or this proves nothing');
  } finally {
    await store.close();
  }
});

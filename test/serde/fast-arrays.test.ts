// The fast array codecs (core/serde/fast-arrays.ts) against avsc itself: identical bytes and identical decoded
// values on the stored fixtures, on avsc's random values of every event, and on edge values of the token
// arrays (varint boundaries, safe-long limits, NaN/±Infinity/−0/subnormal floats); plus the EventSerde paths
// that the reusable encode buffer touches (growth, independence of returned buffers, typed errors).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import avro from 'avsc';
import { EVENT_NAMES, SCHEMA_DIR, eventType, historyVersions, resolvedSchema, type EventName } from '../../schemas/index.ts';
import { currentFixtureValue } from '../../schemas/snapshot.ts';
import { fastType } from '../../core/serde/fast-arrays.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { MemoryRegistry } from '../../core/serde/registry.ts';
import { RlstreamError } from '../../core/errors.ts';
import { rng } from '../../core/random.ts';

const fast = new Map(EVENT_NAMES.map((n) => [n, fastType(resolvedSchema(n) as avro.Schema)]));

function fixture(name: EventName): { value: unknown; bytes: Buffer } {
  return {
    value: currentFixtureValue(name),
    bytes: Buffer.from(readFileSync(join(SCHEMA_DIR, 'fixtures', `${name}.avro.hex`), 'utf8').trim(), 'hex'),
  };
}

function sameBothWays(name: EventName, value: unknown): Buffer {
  const plain = eventType(name);
  const f = fast.get(name)!;
  const expected = plain.toBuffer(value);
  const got = f.toBuffer(value);
  assert.ok(got.equals(expected), `${name}: fast bytes differ from avsc's`);
  // structuredClone drops the record classes (each Type has its own), keeping NaN and −0 for the comparison.
  assert.deepEqual(structuredClone(f.fromBuffer(expected)), structuredClone(plain.fromBuffer(expected)), `${name}: fast decode differs from avsc's`);
  return got;
}

test('fixtures: fast codecs write the stored bytes and read them back as avsc does', () => {
  for (const name of EVENT_NAMES) {
    const { value, bytes } = fixture(name);
    const got = sameBothWays(name, value);
    // Fixture bytes are written under v1; an event whose schema has evolved since encodes differently now
    // (test/schemas checks that those v1 bytes still decode under the current schema).
    if (historyVersions(name).length === 1) assert.ok(got.equals(bytes), `${name} fixture bytes`);
  }
});

test('random values of every event: identical bytes and decoded values', () => {
  for (const name of EVENT_NAMES) {
    const plain = eventType(name);
    for (let i = 0; i < 150; i++) sameBothWays(name, plain.random());
  }
});

const EDGE_INTS = [0, 1, -1, 63, 64, -64, -65, 127, 128, 8191, 8192, 2 ** 20, 2 ** 27 - 1, 2 ** 27, 2 ** 30 - 1, 2 ** 30, -(2 ** 30), -(2 ** 30) - 1, 2 ** 31 - 1, -(2 ** 31), 151_657];
const EDGE_LONGS = [...EDGE_INTS, 2 ** 32, -(2 ** 32), 2 ** 35 + 7, 2 ** 52, 9007199254740990, -9007199254740990, 2 ** 53 - 4];
const EDGE_FLOATS = [0, -0, 1, -1, 0.1, -0.3, 1e-45, -1e-45, 1.17e-38, 3.4e38, -3.4e38, 1e39, -1e39, NaN, Infinity, -Infinity, Math.PI, 1 / 3];

test('edge values in the token arrays (ints, longs, floats) and long arrays', () => {
  const random = rng(7);
  const plain = eventType('TrajectoryCompleted');
  for (let round = 0; round < 60; round++) {
    const base = plain.random() as unknown as { trajectory: Record<string, unknown> };
    const n = round === 0 ? 0 : round < 20 ? Math.floor(random() * 20) : 200 + Math.floor(random() * 3000);
    const pick = <T,>(xs: T[]) => xs[Math.floor(random() * xs.length)]!;
    const t = base.trajectory;
    t['response_ids'] = Array.from({ length: n }, () => (random() < 0.5 ? pick(EDGE_INTS) : Math.floor(random() * 2 ** 31) * (random() < 0.5 ? 1 : -1)));
    t['response_mask'] = Array.from({ length: n }, () => (random() < 0.9 ? 1 : 0));
    t['response_logprobs'] = Array.from({ length: n }, () => (random() < 0.3 ? pick(EDGE_FLOATS) : -random() * 20));
    t['response_policy_versions'] = Array.from({ length: n }, () => (random() < 0.5 ? pick(EDGE_LONGS) : Math.floor(random() * 2 ** 52) * (random() < 0.5 ? 1 : -1)));
    sameBothWays('TrajectoryCompleted', base);
  }
});

test('invalid array items are refused with the path, as before', async () => {
  const serde = await new EventSerde(new MemoryRegistry()).init();
  const { value } = fixture('TurnCompleted');
  const v = value as Record<string, unknown>;
  for (const [field, bad] of [
    ['token_ids', [1, 2.5]],
    ['token_ids', [1, 2 ** 31]],
    ['logprobs', [0.1, '0.2']],
    ['response_mask', [1, null]],
  ] as const) {
    assert.throws(
      () => serde.encode('TurnCompleted', { ...v, [field]: bad } as never),
      (e: unknown) => e instanceof RlstreamError && e.code === 'SERDE_SCHEMA_MISMATCH' && e.message.includes(`${field}.1`),
      field,
    );
  }
  const tc = fixture('TrajectoryCompleted').value as { trajectory: Record<string, unknown> };
  assert.throws(
    () => serde.encode('TrajectoryCompleted', { ...tc, trajectory: { ...tc.trajectory, response_policy_versions: [2 ** 53] } } as never),
    (e: unknown) => e instanceof RlstreamError && e.code === 'SERDE_SCHEMA_MISMATCH',
  );
});

test('EventSerde: buffer growth, independent results, truncation and multi-block arrays', async () => {
  const serde = await new EventSerde(new MemoryRegistry()).init();
  const { value } = fixture('TurnCompleted');
  const v = value as Record<string, unknown>;
  const small = serde.encode('TurnCompleted', v as never);
  const copy = Buffer.from(small);
  // 300k tokens: ~2.4 MB, several times the initial scratch buffer.
  const n = 300_000;
  const big = { ...v, token_ids: Array.from({ length: n }, (_, i) => i * 7), logprobs: Array.from({ length: n }, (_, i) => -i / n), response_mask: new Array<number>(n).fill(1) };
  const bigBytes = serde.encode('TurnCompleted', big as never);
  assert.ok(small.equals(copy), 'a later encode must not change an earlier result');
  assert.ok(bigBytes.subarray(5).equals(eventType('TurnCompleted').toBuffer(big)));
  const back = await serde.decode(bigBytes);
  assert.equal((back.value as { token_ids: number[] }).token_ids[n - 1], (n - 1) * 7);
  for (const cut of [6, 40, bigBytes.length - 1000, bigBytes.length - 1]) {
    await assert.rejects(serde.decode(bigBytes.subarray(0, cut)), (e: unknown) => e instanceof RlstreamError && (e.code === 'SERDE_TRUNCATED' || e.code === 'SERDE_DECODE'));
  }
  // An array written in two blocks, the second with a negative count and a byte size (legal Avro that avsc and
  // other writers may produce): the fast reader must accept it.
  const ints = avro.Type.forSchema({ type: 'array', items: 'int' });
  const floats = avro.Type.forSchema({ type: 'array', items: 'float' });
  const fastInts = fastType({ type: 'array', items: 'int' });
  const fastFloats = fastType({ type: 'array', items: 'float' });
  const zz = (x: number) => ints.toBuffer([x]).subarray(1, -1);
  const blocks = Buffer.concat([zz(2), zz(5), zz(-300), zz(-1), zz(3), zz(70000), Buffer.from([0])]);
  assert.deepEqual(fastInts.fromBuffer(blocks), [5, -300, 70000]);
  assert.deepEqual(ints.fromBuffer(blocks), [5, -300, 70000]);
  const f = Buffer.alloc(8);
  f.writeFloatLE(0.5, 0);
  f.writeFloatLE(-2, 4);
  const fblocks = Buffer.concat([zz(1), f.subarray(0, 4), zz(-1), zz(4), f.subarray(4), Buffer.from([0])]);
  assert.deepEqual(fastFloats.fromBuffer(fblocks), [0.5, -2]);
  assert.deepEqual(floats.fromBuffer(fblocks), [0.5, -2]);
});

test('encode into a buffer of exact size, and one byte short: the bytes and the overflow count avsc gives', () => {
  const random = rng(11);
  for (const items of ['int', 'long', 'float'] as const) {
    const plain = avro.Type.forSchema({ type: 'array', items });
    const f = fastType({ type: 'array', items });
    for (const n of [1, 7, 130, 2000]) {
      // Mostly one-byte varints, so the worst-case bound (5 or 10 bytes an item) does not fit but the exact size does.
      const val = Array.from({ length: n }, (_, i) => (items === 'float' ? -random() : i % 17 === 0 ? Math.floor(random() * 2 ** 30) : i % 3));
      const expected = plain.toBuffer(val);
      const exact = Buffer.alloc(expected.length);
      assert.equal(f.encode(val, exact, 0), expected.length, `${items}[${n}] fits exactly`);
      assert.ok(exact.equals(expected), `${items}[${n}] bytes`);
      const short = Buffer.alloc(expected.length - 1);
      assert.equal(f.encode(val, short, 0), plain.encode(val, Buffer.alloc(expected.length - 1), 0), `${items}[${n}] overflow count`);
    }
  }
});

test('EventSerde: records spread over several slabs stay intact and equal to avsc bytes', async () => {
  const serde = await new EventSerde(new MemoryRegistry()).init();
  const plain = eventType('TrajectoryCompleted');
  const values = Array.from({ length: 120 }, () => plain.random());
  // ~8 KB each on average: more than one 256 KiB slab.
  for (const v of values) (v as unknown as { trajectory: { response_ids: number[] } }).trajectory.response_ids = Array.from({ length: 4000 }, (_, i) => i);
  const encoded = values.map((v) => serde.encode('TrajectoryCompleted', v as never));
  encoded.forEach((buf, i) => {
    assert.ok(buf.subarray(5).equals(plain.toBuffer(values[i])), `record ${i}`);
    assert.equal(EventSerde.peekSchemaId(buf), serde.schemaId('TrajectoryCompleted'));
  });
});

test('EventSerde: Float32Array and Float64Array stand for array<float> fields, byte for byte; int arrays refuse them', async () => {
  const serde = await new EventSerde(new MemoryRegistry()).init();
  const { value } = fixture('AdvantagedTrajectory');
  const v = value as Record<string, unknown>;
  const random = rng(13);
  const n = 1500;
  const advantages = Float64Array.from({ length: n }, (_, i) => (i % 97 === 0 ? EDGE_FLOATS[i % EDGE_FLOATS.length]! : (random() - 0.5) * 4));
  const returns = Float32Array.from(advantages);
  const typed = serde.encode('AdvantagedTrajectory', { ...v, advantages, returns } as never);
  const plain = serde.encode('AdvantagedTrajectory', { ...v, advantages: Array.from(advantages), returns: Array.from(returns) } as never);
  assert.ok(typed.equals(plain));
  assert.ok(eventType('AdvantagedTrajectory').toBuffer({ ...v, advantages: Array.from(advantages), returns: Array.from(returns) }).equals(typed.subarray(5)), 'avsc bytes');
  assert.ok(fast.get('AdvantagedTrajectory')!.isValid({ ...v, advantages, returns }));
  const tc = fixture('TrajectoryCompleted').value as { trajectory: Record<string, unknown> };
  assert.throws(
    () => serde.encode('TrajectoryCompleted', { ...tc, trajectory: { ...tc.trajectory, response_ids: Int32Array.of(1, 2) } } as never),
    (e: unknown) => e instanceof RlstreamError && e.code === 'SERDE_SCHEMA_MISMATCH' && e.message.includes('response_ids'),
  );
});

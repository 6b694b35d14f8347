// RowBinary → Native blocks (native/src/native_block.cpp), the form chDB inserts take when the addon is built.
// That every table's rows store the same values as JSONEachRow through it is rowbinary.test.ts's comparison
// (chDB's binary inserts are Native blocks); here: a block read back by the engine value for value, including
// nulls and empty arrays; rows put in the table's sorting-key order; and payloads that do not fill their rows
// exactly refused with the column and row named.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, existsSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Session } from 'chdb';
import { isRlstreamError } from '../../core/errors.ts';
import { compileRowBinary } from '../../core/traces/rowbinary.ts';
import { nativeLayoutOf, sortingKeyOf, withoutLowCardinality } from '../../core/traces/native-block.ts';
import { nativeAvailable, nativeBlock, writeNativeBlock } from '../../native/index.ts';

const skip = nativeAvailable() ? false : 'the native addon is not built (or RLSTREAM_NATIVE=off)';

const COLUMNS = [
  { name: 'id', type: 'UInt32' },
  { name: 'name', type: 'LowCardinality(String)' },
  { name: 'note', type: 'Nullable(String)' },
  { name: 'flag', type: 'Nullable(UInt8)' },
  { name: 'big', type: 'Nullable(Int64)' },
  { name: 'small', type: 'Int8' },
  { name: 'at', type: 'DateTime64(3)' },
  { name: 'ids', type: 'Array(UInt32)' },
  { name: 'probs', type: 'Array(Float32)' },
  { name: 'tags', type: 'Array(LowCardinality(String))' },
  { name: 'wide', type: 'Array(Int64)' },
  { name: 'score', type: 'Float64' },
];

const ROWS = [
  { id: 1, name: 'a', note: 'é ✓ \n "q"', flag: 1, big: -(2 ** 53) + 1, small: -128, at: 1_700_000_000_123, ids: [0, 4294967295], probs: [-0.5, 2.5], tags: ['x', ''], wide: [-1, 2 ** 40], score: 0.125 },
  { id: 2, name: '', note: null, flag: null, big: null, small: 127, at: 0, ids: [], probs: [], tags: [], wide: [], score: -1e-300 },
  { id: 3, name: 'c'.repeat(300), note: '', flag: 0, big: 0, small: 0, at: 1, ids: [7], probs: [1e-40], tags: ['🙂'.repeat(40)], wide: [0], score: 1e300 },
];

function payload(rows = ROWS): Buffer {
  const codec = compileRowBinary('t', COLUMNS);
  assert.ok(codec);
  return codec.encode(rows);
}

function layout() {
  const l = nativeLayoutOf(COLUMNS, withoutLowCardinality);
  assert.ok(l, 'every column here has a Native layout');
  return l;
}

test('a Native block reads back as the rows its RowBinary held, nulls and empty arrays included', { skip }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-native-block-'));
  const session = new Session(join(dir, 'db'));
  try {
    const path = join(dir, 'block.native');
    const l = layout();
    const size = await writeNativeBlock(path, payload(), ROWS.length, l.layout, l.heads, l.headEnds, l.keys);
    assert.ok(size !== null && size > 0);
    // The request-body form (the server's) is the same bytes.
    assert.deepEqual(await nativeBlock(payload(), ROWS.length, l.layout, l.heads, l.headEnds, l.keys), readFileSync(path));
    // The file declares each column's type: LowCardinality as plain String, the rest as the table has them.
    const types = JSON.parse(session.query(`DESCRIBE file('${path}', 'Native')`, 'JSON')).data.map((r: { type: string }) => r.type);
    assert.deepEqual(types, COLUMNS.map((c) => withoutLowCardinality(c.type)));
    const got = JSON.parse(
      session.query(`SELECT * EXCEPT at, toUnixTimestamp64Milli(at) AS at FROM file('${path}', 'Native') ORDER BY id SETTINGS output_format_json_quote_64bit_integers = 0`, 'JSON'),
    ).data;
    const want = ROWS.map((r) => ({ ...r, probs: r.probs.map((x) => Math.fround(x)) }));
    assert.deepEqual(
      got.map((r: Record<string, unknown>) => ({ ...r, probs: (r['probs'] as number[]).map((x) => Math.fround(x)) })),
      want.map((r) => Object.fromEntries([...COLUMNS.filter((c) => c.name !== 'at').map((c) => [c.name, r[c.name as keyof typeof r]]), ['at', r.at]])),
    );
  } finally {
    session.cleanup();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a payload that does not fill its rows exactly is refused, naming the column and row', { skip }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-native-block-'));
  try {
    const path = join(dir, 'block.native');
    const l = layout();
    const good = payload();
    const write = (bytes: Buffer, rows: number) => writeNativeBlock(path, bytes, rows, l.layout, l.heads, l.headEnds, l.keys)!;
    // Truncated inside the last row's last column; one row more than the payload holds; bytes left over.
    await assert.rejects(write(good.subarray(0, good.length - 3), ROWS.length), (e) => isRlstreamError(e, 'NATIVE_INVALID_ARGUMENT') && /column score of row 2 of 3/.test(e.message));
    await assert.rejects(write(good, ROWS.length + 1), (e) => isRlstreamError(e) && /column id of row 3 of 4/.test(e.message));
    await assert.rejects(write(good, ROWS.length - 1), (e) => isRlstreamError(e) && /bytes left after 2 rows/.test(e.message));
    // A null flag that is neither 0 nor 1: row 0's note flag follows id (4 bytes) and name (1 + 1 bytes).
    const bad = Buffer.from(good);
    assert.equal(bad[6], 0);
    bad[6] = 2;
    await assert.rejects(write(bad, ROWS.length), (e) => isRlstreamError(e) && /column note of row 0 .*null flag/.test(e.message));
    assert.equal(existsSync(path), false, 'nothing is written for a refused payload');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('column shapes the converter does not handle leave the table on RowBinary', () => {
  assert.equal(nativeLayoutOf([{ name: 'x', type: 'Array(Array(UInt8))' }], (t) => t), null);
  assert.equal(nativeLayoutOf([{ name: 'x', type: 'Array(Nullable(Int32))' }], (t) => t), null);
  assert.equal(nativeLayoutOf([{ name: 'x', type: 'Map(String, UInt8)' }], (t) => t), null);
  const l = nativeLayoutOf([{ name: 'x', type: "DateTime('UTC')" }, { name: 'y', type: 'Nullable(String)' }], (t) => t);
  assert.deepEqual(l && [...l.layout], [0, 4, 0, 1, 0, 1]);
});

test("rows go into the block in the sorting key's order (bytes for strings, signed and unsigned integers), ties as they came", { skip }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-native-block-'));
  const session = new Session(join(dir, 'db'));
  try {
    const names = ['b', 'a', 'ab', '', 'é', 'B'];
    const rows = Array.from({ length: 60 }, (_, i) => ({ ...ROWS[i % 3]!, id: 1000 - i, name: names[i % names.length]!, small: ((i * 37) % 256) - 128 }));
    rows.push({ ...rows[0]!, id: 5 }, { ...rows[0]!, id: 7 }); // the same name and small as row 0
    const l = nativeLayoutOf(COLUMNS, withoutLowCardinality, 'name, small, `id`');
    assert.ok(l);
    assert.deepEqual([...l.keys], [1, 0, 5, 2, 0, 1]);
    const path = join(dir, 'sorted.native');
    await writeNativeBlock(path, payload(rows), rows.length, l.layout, l.heads, l.headEnds, l.keys);
    const got = JSON.parse(session.query(`SELECT id FROM file('${path}', 'Native')`, 'JSON')).data.map((r: { id: number }) => r.id);
    const want = [...rows]
      .sort((a, b) => Buffer.compare(Buffer.from(a.name), Buffer.from(b.name)) || a.small - b.small || a.id - b.id)
      .map((r) => r.id);
    assert.deepEqual(got, want);
    // Equal keys keep their arrival order (rows 0, 60 and 61 share name and small).
    const two = nativeLayoutOf(COLUMNS, withoutLowCardinality, 'name, small')!;
    await writeNativeBlock(path, payload(rows), rows.length, two.layout, two.heads, two.headEnds, two.keys);
    const stable = [...rows].sort((a, b) => Buffer.compare(Buffer.from(a.name), Buffer.from(b.name)) || a.small - b.small).map((r) => r.id);
    assert.deepEqual(JSON.parse(session.query(`SELECT id FROM file('${path}', 'Native')`, 'JSON')).data.map((r: { id: number }) => r.id), stable);
    assert.deepEqual(stable.slice(stable.indexOf(1000), stable.indexOf(1000) + 3), [1000, 5, 7]);
    // Without a key (or one the converter cannot order by) the rows keep their order.
    const plain = nativeLayoutOf(COLUMNS, withoutLowCardinality, 'toYYYYMM(at), id')!;
    assert.equal(plain.keys.length, 0);
    await writeNativeBlock(path, payload(rows), rows.length, plain.layout, plain.heads, plain.headEnds, plain.keys);
    assert.deepEqual(JSON.parse(session.query(`SELECT id FROM file('${path}', 'Native')`, 'JSON')).data.map((r: { id: number }) => r.id), rows.map((r) => r.id));
  } finally {
    session.cleanup();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a sorting key is used only when every part is a plain column of a type the converter orders by', () => {
  const cols = [{ name: 'run_id', type: 'LowCardinality(String)' }, { name: 'n', type: 'UInt32' }, { name: 't', type: 'DateTime64(3)' }, { name: 'f', type: 'Float64' }];
  assert.deepEqual([...sortingKeyOf(cols, 'run_id, n, t')], [0, 0, 1, 1, 2, 2]);
  assert.deepEqual([...sortingKeyOf(cols, 'run_id, f')], []);
  assert.deepEqual([...sortingKeyOf(cols, 'run_id, missing')], []);
  assert.deepEqual([...sortingKeyOf(cols, undefined)], []);
});
